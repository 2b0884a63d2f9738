"""The harness inside the sandbox: runs one program's tests and reports what it observed. Standard library only.

rlvr.verifiers.sandbox starts `python -I -S -B` inside bubblewrap and writes this module's code object and one job to
its stdin (marshal, from the trusted side; a third faster than compiling this file each time); `main(job)` runs it and
writes one JSON line per event to the job's file descriptor `events_fd`. It never judges: it reports values and events, and
the verifier (outside the sandbox) decides. The job:

    {"mode": "functions" | "stdio", "program": str, "setup": str, "tests": [...], "limits": {...}}

functions: `setup`, then `program`, run as module "solution" in one namespace; then each test's code (rewritten by
    the verifier: `__rlvr_value__(site, expr)` reports a value, `__rlvr_truth__(site, expr)` a truth, `__rlvr_eq__` /
    `__rlvr_ne__` compare strictly). The whole run is one process under the CPU limit of all its tests together.
stdio: each test is {"stdin": str}: a fresh child process per case (fork), with the case's input as stdin, runs
    `setup` + `program` as "__main__"; its stdout (capped) is reported, never compared here: the expected outputs never
    enter the sandbox.

Before any model code runs, the process (functions) or each child (stdio) sets its resource limits, makes itself
non-dumpable (no ptrace, no /proc/PID/mem from its children) and installs a seccomp filter that refuses to create
processes (fork, vfork, clone without CLONE_THREAD, clone3): fork bombs, subprocess escapes and processes that outlive
the run cannot start. Threads stay possible and are bounded by the address-space and process limits.

Events (one JSON array per line): ["ready"] | ["compile", message] | ["load", kind] | ["start", test] |
["value", test, site, encoded] | ["truth", test, site, bool] | ["done", test, kind or null] |
["case", test, exit kind, stdout (latin-1), output cut]. `kind` names an exception class, or "memory" / "timeout".
"""

import _signal  # the C module: `signal` imports enum (8 ms of start-up)
import os
import resource
import sys
import time

_OUT = -1  # the events' file descriptor (main sets it)
_write, _type, _len = os.write, type, len
# JSON string escapes (control characters, quote, backslash); everything else travels as UTF-8
_ESCAPES = {**{c: f"\\u{c:04x}" for c in range(32)}, ord('"'): '\\"', ord("\\"): "\\\\"}
_PLAIN = (int, float, bool, str, bytes, type(None), complex)
_CONTAINERS = (list, tuple, dict, set, frozenset)
MAX_DEPTH = 32
MAX_ITEMS = 100_000  # elements of one reported value


def latin1(text):
    """Any str (lone surrogates too) as the latin-1 reading of its UTF-8 bytes: every code point below 256."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1")


def to_json(value):
    """JSON text of an event (lists, str, int, bool, None), without importing json (a third of start-up time)."""
    kind = _type(value)
    if kind is str:
        return '"' + value.translate(_ESCAPES) + '"'
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if kind is int:
        return str(value)
    return "[" + ",".join(to_json(v) for v in value) + "]"


def send(*event):
    """One event to the verifier, one line of JSON."""
    data = (to_json(list(event)) + "\n").encode("utf-8", "replace")  # a lone surrogate in a message: "?"
    while data:
        data = data[_write(_OUT, data) :]


def encode(value, depth=0, budget=None):
    """A value of plain built-in types (exact types: no subclass, nothing whose __eq__ the program wrote) as JSON:
    ["i", "12"], ["f", "1.5"], ["s", "text"], ["l", [...]], ...; None when the value has any other type."""
    budget = [MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    kind = _type(value)
    if depth > MAX_DEPTH or budget[0] < 0:
        return None
    if kind is bool or kind is type(None):
        return ["b", value]
    if kind is int:
        return ["i", format(value, "x")]  # hex: no str() digit limit, linear in the size
    if kind is float:
        return ["f", float.hex(value)]
    if kind is complex:
        return ["c", float.hex(value.real), float.hex(value.imag)]
    if kind is str:
        return ["s", latin1(value)]
    if kind is bytes:
        return ["y", value.decode("latin-1")]
    if kind in (list, tuple, set, frozenset):
        items = [encode(v, depth + 1, budget) for v in (value if kind in (list, tuple) else list(value))]
        return None if None in items else [{list: "l", tuple: "t", set: "e", frozenset: "z"}[kind], items]
    if kind is dict:
        pairs = [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in list(value.items())]
        return None if any(None in p for p in pairs) else ["d", pairs]
    return None


def strict_eq(a, b):
    """a == b where both are plain values (compared by value, 1 == 1.0 as in Python); False when one side is
    plain and the other is not; two objects of the program's own classes compare by their __eq__, which must
    return exactly True."""
    plain_a, plain_b = encode(a) is not None, encode(b) is not None
    if plain_a and plain_b:
        return a == b
    if plain_a or plain_b:
        return False
    result = a == b
    return _type(result) is bool and result


def truth(value):
    """bool(value) for plain values; False for anything else (a __bool__ the program wrote is not asked)."""
    return encode(value) is not None and bool(value)


def confine(limits, seccomp):
    """Resource limits, no core dumps; with `seccomp` (the filter's BPF as bytes; None when bubblewrap installed it):
    not dumpable, no new privileges, no new processes. Raises if any step fails."""
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    for name, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, limits["memory_bytes"]),
                        (resource.RLIMIT_FSIZE, limits["file_bytes"]), (resource.RLIMIT_NOFILE, limits["open_files"]),
                        (resource.RLIMIT_NPROC, limits["processes"]), (resource.RLIMIT_CORE, 0)):  # fmt: skip
        resource.setrlimit(name, value if isinstance(value, tuple) else (value, value))
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)  # a write past the file-size limit fails (EFBIG) instead of killing
    if seccomp is None:
        return
    import ctypes  # 8 ms: only where the filter is installed here (each stdio case)

    libc = ctypes.CDLL(None, use_errno=True)
    program = seccomp

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = Prog(len(program) // 8, program)
    for args in ((4, 0, 0, 0, 0), (38, 1, 0, 0, 0)):  # PR_SET_DUMPABLE 0, PR_SET_NO_NEW_PRIVS 1
        if libc.prctl(*args) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")


def scratch(limits):
    """As root in the sandbox's user namespace (before becoming `nobody`): a tmpfs of our own over bubblewrap's /tmp,
    capped in bytes and in files (nr_inodes, which bubblewrap cannot set), and the working folder moved onto it."""
    import ctypes

    options = f"size={limits['tmp_bytes']},nr_inodes={limits['tmp_inodes']},mode=1777".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 2 | 4, options) != 0:  # MS_NOSUID | MS_NODEV
        raise OSError(ctypes.get_errno(), "mount /tmp")
    os.chdir("/tmp")
    forget_ctypes()


def forget_ctypes():
    """Drop ctypes from sys.modules once the harness is done with it: a program's `import ctypes` then goes through
    the import system, where the audit hook (functions) refuses it."""
    for name in [m for m in sys.modules if m in ("ctypes", "_ctypes") or m.startswith("ctypes.")]:
        del sys.modules[name]


def cap_recursion(limit):
    """sys.setrecursionlimit clamped to `limit`: Python frames live on the heap, so a program that sets 10**6 and
    recurses without end ran for seconds (a timeout, or not, by the machine's load) before its RecursionError; at
    `limit` it is a crash within ~0.5 s of CPU. (A program can find the original through the wrapper; it only makes
    its own bomb slower.)"""
    setlimit = sys.setrecursionlimit

    def setrecursionlimit(n):
        setlimit(min(n, limit) if _type(n) is int else n)  # the builtin's own errors for anything else

    sys.setrecursionlimit = setrecursionlimit


def kind_of(error):
    """What an exception says about the program: "memory" for MemoryError, "timeout" for TestTimeout, else its class
    name."""
    if isinstance(error, TestTimeout):
        return "timeout"
    return "memory" if isinstance(error, MemoryError) else _type(error).__name__


def run_functions(job):
    """setup + program once, then each test's rewritten code; events as in the module docstring."""
    confine(job["limits"], job["seccomp"])  # None: bubblewrap installed the filter
    try:
        code = compile(job["setup"] + "\n" + job["program"], "solution.py", "exec")
    except BaseException as e:  # noqa: B036 - SyntaxError, or a MemoryError / RecursionError from a huge program
        send("compile", f"{_type(e).__name__}: {e}"[:300])
        return
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    cap_recursion(job["limits"]["recursion"])
    _signal.signal(_signal.SIGVTALRM, _out_of_time)
    sys.addaudithook(_refuse_introspection)
    try:
        exec(code, namespace)
    except BaseException as e:  # noqa: B036 - sys.exit at import is the program failing to load
        send("load", kind_of(e))
        return
    for test, source in enumerate(job["tests"]):
        try:
            test_code = compile(source, f"test_{test}.py", "exec")
        except BaseException as e:  # noqa: B036
            send("done", test, kind_of(e))
            continue
        namespace.update(__rlvr_value__=_value_hook(test), __rlvr_truth__=_truth_hook(test),
                         __rlvr_eq__=strict_eq, __rlvr_ne__=lambda a, b: not strict_eq(a, b))  # fmt: skip
        send("start", test)
        _signal.setitimer(_signal.ITIMER_VIRTUAL, job.get("test_cpu_s", job["limits"]["cpu_s"]))  # _out_of_time
        try:
            exec(test_code, namespace)
        except BaseException as e:  # noqa: B036 - SystemExit, KeyboardInterrupt: the test did not pass
            _signal.setitimer(_signal.ITIMER_VIRTUAL, 0)
            send("done", test, kind_of(e))
            continue
        _signal.setitimer(_signal.ITIMER_VIRTUAL, 0)
        send("done", test, None)


class TestTimeout(BaseException):
    """A test ran past its CPU time (the process's RLIMIT_CPU bounds all tests together, in case a program swallows
    this or resets the timer)."""


def _out_of_time(signum, frame):
    raise TestTimeout


_REFUSED = frozenset({"sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                      "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata"})  # fmt: skip


def _refuse_introspection(event, args):
    """An audit hook, installed before the program runs: no trace functions (they could skip the tests' lines), no
    search through the garbage collector's objects, no rewritten code objects, no ctypes (which could remove this
    hook). The program gets a RuntimeError; the harness never uses any of these. (Frames stay reachable: typing and
    namedtuple need sys._getframe. What a program can do with them, it can do to the reports of its own process,
    which is why the values that decide a test are compared outside.)"""
    if event in _REFUSED or (event == "object.__setattr__" and args[1] == "__code__") or (
        event == "import" and args[0] in ("ctypes", "_ctypes")
    ):
        raise RuntimeError(f"{event} is not allowed in the code sandbox")


def _value_hook(test):
    def value(site, v):
        send("value", test, site, encode(v))

    return value


def _truth_hook(test):
    def report(site, v):
        send("truth", test, site, truth(v))

    return report


def run_stdio(job):
    """One child per case; report its exit kind and stdout (capped)."""
    limits = job["limits"]
    code = compile(job["setup"] + "\n" + job["program"], "solution.py", "exec")  # a SyntaxError: reported by main
    for test, case in enumerate(job["tests"]):
        stdin = os.memfd_create("stdin")
        os.write(stdin, case["stdin"].encode("utf-8"))
        os.lseek(stdin, 0, os.SEEK_SET)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(code, limits, job["seccomp"], stdin, write_end, read_end)
        os.close(write_end)
        os.close(stdin)
        out, cut, timed_out, deadline = _collect(pid, read_end, limits)
        status, cpu = _reap(pid, deadline)
        kind = "timeout" if timed_out or status is None else _exit_kind(status, cpu, limits["cpu_s"])
        send("case", test, kind, out.decode("latin-1"), cut)


def _child(code, limits, seccomp, stdin, out, spare):
    try:
        os.close(spare)
        os.close(_OUT)  # the program cannot write events
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        devnull = os.open("/dev/null", os.O_WRONLY)
        os.dup2(devnull, 2)
        for fd in (stdin, out, devnull):
            os.close(fd)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        cap_recursion(limits["recursion"])
        confine(limits, seccomp)
    except BaseException:  # noqa: B036
        os._exit(125)
    status = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except MemoryError:
        status = 124
    except BaseException:  # noqa: B036
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: B036
        status = status or 1
    os._exit(status & 0xFF)


def _collect(pid, fd, limits):
    """(stdout bytes up to the cap, whether it was cut, whether the wall-clock limit killed the child, the deadline)."""
    import select  # stdio only: functions runs skip its import
    chunks, size, cap = [], 0, limits["output_bytes"]
    deadline = time.monotonic() + limits["wall_s"]
    cut = timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
        size += _len(data)
        if size > cap:
            cut = True
            break
    if cut or timed_out:
        os.kill(pid, _signal.SIGKILL)
    os.close(fd)
    return b"".join(chunks)[:cap], cut, timed_out, deadline


def _reap(pid, deadline):
    """(the child's wait status, its CPU seconds), waiting until `deadline` (a child that closed its stdout and goes
    on is killed then: (None, cpu))."""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            os.kill(pid, _signal.SIGKILL)
            _, _, usage = os.wait4(pid, 0)
            return None, usage.ru_utime + usage.ru_stime
        time.sleep(0.005)


def _exit_kind(status, cpu, cpu_limit):
    """None for exit 0; "memory" (exit 124); "timeout" when the CPU limit killed it (SIGXCPU, or SIGKILL at the hard
    limit: it used its CPU time); else "RuntimeError" (a crash, or a kill of its own)."""
    if os.WIFSIGNALED(status):
        limit = os.WTERMSIG(status) in (_signal.SIGXCPU, _signal.SIGKILL) and cpu >= 0.9 * cpu_limit
        return "timeout" if limit else "RuntimeError"
    code = os.WEXITSTATUS(status)
    return None if code == 0 else "memory" if code == 124 else "RuntimeError"


def main(job):
    global _OUT
    if job["uid"] is not None:  # rlvr runs as root: become an unprivileged user, so that RLIMIT_NPROC holds
        scratch(job["limits"])
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    _OUT = job["events_fd"]
    sys.set_int_max_str_digits(job["limits"]["int_digits"])
    send("ready")
    if job["mode"] == "functions":
        run_functions(job)
        return
    try:
        compile(job["setup"] + "\n" + job["program"], "solution.py", "exec")
    except BaseException as e:  # noqa: B036
        send("compile", f"{_type(e).__name__}: {e}"[:300])
        return
    import ctypes

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # not dumpable: a case's program cannot read this process's memory
    run_stdio(job)

