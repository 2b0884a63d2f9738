"""The harness inside the sandbox: runs one program's tests and reports what it observed. Standard library only.

rlvr.verifiers.sandbox starts `python -I -S -B` inside bubblewrap and writes this module's code object and one job to
its stdin (marshal, from the trusted side; a third faster than compiling this file each time); `main(job)` runs it and
writes one JSON line per event to the job's file descriptor `events_fd`. It never judges: it reports values and events, and
the verifier (outside the sandbox) decides. The job:

    {"mode": "functions" | "stdio", "program": str, "setup": str, "tests": [...], "limits": {...}}

functions: two processes. The harness (the judge) compiles `setup` + `program` and forks the program's process, which
    closes every descriptor but its two pipes to the judge and stdout/stderr (the events' descriptor first), confines
    itself and runs them as module "solution". The judge then runs each test's code (rewritten by the verifier:
    `__rlvr_value__(site, expr)` reports a value, `__rlvr_truth__(site, expr)` a truth, `__rlvr_eq__` / `__rlvr_ne__`
    compare strictly) in its own namespace, where the program's functions, classes and objects are Remote: a call, an
    attribute, an iteration or a comparison is a request to the program's process, answered with a value in the
    strict encoding (or a handle to an object that has none). So every assert and `check` is judged in a process the
    program cannot write to, and this one owns the only way out. (Why not a harness in the program's process that
    closes the other descriptors: what the harness can write, a program in its process can write too, through its
    frames or memory; only another process keeps the channel out of reach.) The program's process runs under the CPU
    limit of all its tests together, each test's calls under that test's (a timer that runs only while it answers).
stdio: each test is {"stdin": str}: a fresh child process per case (fork), with the case's input as stdin, runs
    `setup` + `program` as "__main__"; its stdout (capped) is reported, never compared here: the expected outputs never
    enter the sandbox.

Before any model code runs, the program's process (functions) or each case's (stdio) closes the events' descriptor,
sets its resource limits, makes itself non-dumpable (no ptrace) and installs a seccomp filter that refuses to create
processes (fork, vfork, clone without CLONE_THREAD, clone3): fork bombs, subprocess escapes and processes that outlive
the run cannot start. Threads stay possible and are bounded by the address-space and process limits. The judge
confines itself the same way once the program's process exists.

Events (one JSON array per line): ["ready"] | ["compile", message] | ["load", kind] | ["start", test] |
["value", test, site, encoded] | ["truth", test, site, bool] | ["done", test, kind or null] |
["case", test, exit kind, stdout (latin-1), output cut]. `kind` names an exception class, or "memory" / "timeout" /
"output" (a reply of the program's process past MAX_REPLY).
"""

import _signal  # the C module: `signal` imports enum (8 ms of start-up)
import os
import resource
import sys
import time

_OUT = -1  # the events' file descriptor (main sets it)
_write, _type, _len = os.write, type, len
_BUILTINS = sys.modules["builtins"]
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
    if kind is float:  # finite: the judge's CPU seconds
        return repr(value)
    return "[" + ",".join(to_json(v) for v in value) + "]"


def send(*event):
    """One event to the verifier, one line of JSON."""
    data = (to_json(list(event)) + "\n").encode("utf-8", "replace")  # a lone surrogate in a message: "?"
    while data:
        data = data[_write(_OUT, data) :]


def encode(value, depth=0, budget=None, remote=False):
    """A value of plain built-in types (exact types: no subclass, nothing whose __eq__ the program wrote) as JSON:
    ["i", "12"], ["f", "1.5"], ["s", "text"], ["l", [...]], ...; None when the value has any other type. With
    `remote` (the judge's requests), a Remote travels as its reference ["n", name] / ["h", handle]."""
    budget = [MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    kind = _type(value)
    if depth > MAX_DEPTH or budget[0] < 0:
        return None
    if remote and kind is Remote:
        return value._rlvr_ref
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
        items = [encode(v, depth + 1, budget, remote) for v in (value if kind in (list, tuple) else list(value))]
        return None if None in items else [{list: "l", tuple: "t", set: "e", frozenset: "z"}[kind], items]
    if kind is dict:
        pairs = [[encode(k, depth + 1, budget, remote), encode(v, depth + 1, budget, remote)] for k, v in list(value.items())]
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
    if isinstance(error, ProgramGone):
        return error.kind
    return "memory" if isinstance(error, MemoryError) else _type(error).__name__


def run_functions(job):
    """The judge: compile setup + program, fork the program's own process (_program), then run each test's rewritten
    code here, where the program's names are Remote objects whose calls, attributes and comparisons that process
    answers with values in the strict encoding. The program never shares a process, a descriptor or memory with the
    code that judges it, and this process owns the only way out (the events' descriptor)."""
    limits = job["limits"]
    try:
        code = compile(job["setup"] + "\n" + job["program"], "solution.py", "exec")
    except BaseException as e:  # noqa: B036 - SyntaxError, or a MemoryError / RecursionError from a huge program
        send("compile", f"{_type(e).__name__}: {e}"[:300])
        return
    import ctypes  # noqa: F401 - loaded once, before the fork: both processes' confine() find it

    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _program(code, job, requests_r, replies_w)  # never returns
    os.close(requests_r)
    os.close(replies_w)
    link = Link(pid, requests_w, replies_r, limits["cpu_s"])
    try:
        confine(limits, job["seccomp"])  # the judge runs the tests' code only; the same limits and filter all the same
        _judge(job, link)
    finally:
        link.close()


def _judge(job, link):
    try:
        first = link.receive()
    except ProgramGone as e:
        send("load", e.kind)
        return
    if _type(first) is not list or not first or first[0] not in ("loaded", "load") or _len(first) != 2:
        send("load", link.fail("RuntimeError"))
        return
    if first[0] == "load":
        send("load", first[1] if _type(first[1]) is str else "RuntimeError")
        return
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(job["setup"], "setup.py", "exec"), namespace)  # the tests' own imports (MBPP's test_setup_code)
    except BaseException:  # noqa: B036 - it ran in the program's process; a test that needs it fails alone
        pass
    try:
        namespace.update(_names(first[1], link))
    except ProgramGone as e:
        send("load", e.kind)
        return
    cpu = job.get("test_cpu_s", job["limits"]["cpu_s"])
    for test, source in enumerate(job["tests"]):
        try:
            test_code = compile(source, f"test_{test}.py", "exec")
        except BaseException as e:  # noqa: B036
            send("done", test, kind_of(e))
            continue
        namespace.update(__rlvr_value__=_value_hook(test), __rlvr_truth__=_truth_hook(test),
                         __rlvr_eq__=strict_eq, __rlvr_ne__=lambda a, b: not strict_eq(a, b))  # fmt: skip
        send("start", test)
        try:
            link.tell(["test", cpu])  # the program's process times its own work for this test (TestTimeout)
            exec(test_code, namespace)
            link.tell(["end"])
        except BaseException as e:  # noqa: B036 - SystemExit, KeyboardInterrupt, the program's end: not passed
            send("done", test, kind_of(e))
            continue
        send("done", test, None)


# standard library packages the judge never imports for a program's name (they act on import: the regression suite's
# autotest runs it, site rewrites sys.path and builtins, others open windows or print); such a name stays Remote
_SKIPPED_MODULES = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtle", "turtledemo", "test",
                              "site", "tkinter", "ensurepip", "venv", "lib2to3", "pydoc_data"})


def _names(table, link):
    """The program's names as the judge sees them: its modules and standard library imports as the judge's own,
    its plain values decoded, everything else (its functions, classes, objects) Remote."""
    names = {}
    if _type(table) is not list:
        raise ProgramGone(link.fail("RuntimeError"))
    for entry in table:
        if _type(entry) is not list or not entry or _type(entry[0]) is not str or _len(entry) < 2:
            raise ProgramGone(link.fail("RuntimeError"))
        name, kind = entry[0], entry[1]
        value = None
        if kind == "v" and _len(entry) == 3:
            value = link.decode(entry[2])
        elif kind in ("m", "i") and _len(entry) == 3 + (kind == "i"):
            value = _standard(*entry[2:])
        if value is None and kind != "v":
            value = Remote(link, ["n", name])
        names[name] = value
    return names


def _standard(module, qualname=""):
    """A standard library module (or an object in one, by qualified name), imported here; None otherwise."""
    if _type(module) is not str or _type(qualname) is not str or module.partition(".")[0] not in sys.stdlib_module_names:
        return None
    if module.partition(".")[0] in _SKIPPED_MODULES:
        return None
    try:
        found = __import__(module, fromlist=["_"] if "." in module else [])
        for part in qualname.split(".") if qualname else ():
            found = getattr(found, part)
    except BaseException:  # noqa: B036
        return None
    return found


class ProgramGone(BaseException):
    """The program's process ended, or sent what the protocol does not allow; `kind` says how (a "done" kind)."""

    def __init__(self, kind):
        super().__init__(kind)
        self.kind = kind


class ProgramError(Exception):
    """An exception the program raised whose class is not a built-in exception (its name is in the message)."""


MAX_REPLY = 8 << 20  # one reply of the program's process; past it, it is stopped ("output": output_limit)


def _scanner():
    """A JSON reader from the C accelerator alone (the json package imports re: a few ms of every start)."""
    import _json

    class Context:
        strict, object_hook, object_pairs_hook, memo = True, None, None, None
        parse_float, parse_int = float, int

        @staticmethod
        def parse_constant(name):
            raise ValueError(name)

    return _json.make_scanner(Context())


def read_message(fd, buffer, scan, cap):
    """The next JSON line from `fd` (buffer: a bytearray kept between calls); None at the end of the stream;
    ValueError when it is not JSON, OverflowError past `cap` bytes."""
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end >= 0:
            break
        if _len(buffer) > cap:
            raise OverflowError
        start = _len(buffer)
        data = os.read(fd, 1 << 16)
        if not data:
            return None
        buffer += data
    line = bytes(buffer[:end]).decode("utf-8", "replace")
    del buffer[: end + 1]
    try:
        value, stop = scan(line, 0)
    except (StopIteration, RecursionError) as e:
        raise ValueError("not JSON") from e
    if stop != _len(line):
        raise ValueError("not one JSON value")
    return value


def write_message(fd, message):
    data = (to_json(message) + "\n").encode("utf-8", "replace")
    while data:
        data = data[_write(fd, data) :]


class Link:
    """The judge's end of the program's process: requests out, replies in, and how that process ended."""

    def __init__(self, pid, out, inp, cpu_limit):
        self.pid, self.out, self.inp, self.cpu_limit = pid, out, inp, cpu_limit
        self.buffer, self.scan, self.gone = bytearray(), _scanner(), None

    def receive(self):
        if self.gone is not None:
            raise ProgramGone(self.gone)
        try:
            message = read_message(self.inp, self.buffer, self.scan, MAX_REPLY)
        except OverflowError:
            raise ProgramGone(self.fail("output")) from None
        except ValueError:
            raise ProgramGone(self.fail("RuntimeError")) from None
        if message is None:  # it closed its end: wait for it to end (a sleeper is stopped by the wall clock)
            _, status, usage = os.wait4(self.pid, 0)
            self.pid = None
            self.gone = _exit_kind(status, usage.ru_utime + usage.ru_stime, self.cpu_limit) or "RuntimeError"
            raise ProgramGone(self.gone)
        return message

    def tell(self, request):
        """Send `request`, which has no answer (a test's start and end: no round trip)."""
        if self.gone is not None:
            raise ProgramGone(self.gone)
        try:
            write_message(self.out, request)
        except OSError:
            raise ProgramGone(self.fail("RuntimeError")) from None

    def ask(self, request):
        """The program's process's answer to `request`: the decoded value, or its exception raised here."""
        self.tell(request)
        reply = self.receive()
        if _type(reply) is list and _len(reply) == 3 and reply[0] == "ok" and _type(reply[2]) is list:
            return self.decode(reply[1]), reply[2]
        if _type(reply) is list and _len(reply) == 3 and reply[0] == "raise" and _type(reply[1]) is str:
            raise _raised(reply[1], reply[2] if _type(reply[2]) is str else "")
        raise ProgramGone(self.fail("RuntimeError"))

    def value(self, request):
        return self.ask(request)[0]

    def call(self, ref, args, kwargs):
        sent = [encode(a, remote=True) for a in args]
        named = [[k, encode(v, remote=True)] for k, v in kwargs.items()]
        if None in sent or any(v is None for _, v in named):
            raise TypeError("an argument the program's process cannot be sent (built-in values and its own objects)")
        value, changed = self.ask(["call", ref, sent, named])
        for entry in changed:  # arguments it changed in place (a list it sorted): the same change here
            if _type(entry) is list and _len(entry) == 2 and _type(entry[0]) is int and 0 <= entry[0] < _len(args):
                _write_back(args[entry[0]], self.decode(entry[1]))
        return value

    def decode(self, encoded, depth=0):
        try:
            return decode(encoded, lambda ref: Remote(self, ref))
        except (ValueError, TypeError, OverflowError, RecursionError, KeyError, IndexError):
            raise ProgramGone(self.fail("RuntimeError")) from None

    def fail(self, kind):
        """Stop the program's process; later requests raise ProgramGone(kind)."""
        if self.pid is not None:
            try:
                os.kill(self.pid, _signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = None
        if self.gone is None:
            self.gone = kind
        return self.gone

    def close(self):
        self.fail("RuntimeError")
        for fd in (self.out, self.inp):
            try:
                os.close(fd)
            except OSError:
                pass


def _write_back(target, value):
    kind = _type(target)
    if kind is not _type(value) or kind not in (list, dict, set):
        return
    if kind is list:
        target[:] = value
    else:
        target.clear()
        target.update(value)


def _raised(kind, message):
    """The judge's exception for one the program raised: TestTimeout, MemoryError, a built-in exception class by
    name, else ProgramError."""
    if kind == "timeout":
        return TestTimeout()
    if kind == "memory":
        return MemoryError(message)
    found = getattr(_BUILTINS, kind, None)
    if _type(found) is type and issubclass(found, Exception):
        try:
            return found(message)
        except BaseException:  # noqa: B036 - UnicodeDecodeError and the like take other arguments
            pass
    return ProgramError(f"{kind}: {message}")


class Remote:
    """A name or an object of the program's, living in its process: what a test does with it is asked there, and
    the answer comes back as a plain value (or another Remote). Compared with a plain value it is unequal; two
    Remotes are equal when the program's __eq__ says exactly True (as two of its objects in one process were)."""

    def __init__(self, link, ref):
        self.__dict__["_rlvr_link"] = link
        self.__dict__["_rlvr_ref"] = ref

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._rlvr_link.value(["attr", self._rlvr_ref, name])

    def __call__(self, *args, **kwargs):
        return self._rlvr_link.call(self._rlvr_ref, args, kwargs)

    def _op(self, op, other=None):
        sent = None if other is None else encode(other, remote=True)
        if other is not None and sent is None:
            raise TypeError(f"{op}: an operand the program's process cannot be sent")
        return self._rlvr_link.value(["op", op, self._rlvr_ref, sent])

    def __iter__(self):
        return RemoteIterator(self._op("iter"))

    def __len__(self):
        n = self._op("len")
        if _type(n) is not int:
            raise TypeError("len")
        return n

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __contains__(self, item):
        return self._op("contains", item) is True

    def __eq__(self, other):
        return _type(other) is Remote and self._op("eq", other) is True

    def __ne__(self, other):
        return not self.__eq__(other)

    def __lt__(self, other):
        return self._op("lt", other) is True

    def __le__(self, other):
        return self._op("le", other) is True

    def __gt__(self, other):
        return self._op("gt", other) is True

    def __ge__(self, other):
        return self._op("ge", other) is True

    def __bool__(self):
        return self._op("bool") is True

    def __str__(self):
        text = self._op("str")
        return text if _type(text) is str else "<remote>"

    def __repr__(self):
        text = self._op("repr")
        return text if _type(text) is str else "<remote>"

    __hash__ = object.__hash__


class RemoteIterator:
    def __init__(self, remote):
        self.remote = remote

    def __iter__(self):
        return self

    def __next__(self):
        if _type(self.remote) is not Remote:
            raise TypeError("not an iterator")
        return self.remote._op("next")


def decode(encoded, remote, depth=0):
    """The strict encoding back to a value (code.decode's rules); ["n", name] / ["h", id] through `remote`."""
    if depth > MAX_DEPTH + 8 or _type(encoded) is not list or not encoded or _type(encoded[0]) is not str:
        raise ValueError("malformed value")
    tag, n = encoded[0], _len(encoded)
    if tag in ("n", "h") and n == 2 and _type(encoded[1]) in (str, int):
        return remote(encoded)
    if tag == "b" and n == 2 and (encoded[1] is None or _type(encoded[1]) is bool):
        return encoded[1]
    if tag == "i" and n == 2 and _type(encoded[1]) is str:
        return int(encoded[1], 16)
    if tag == "f" and n == 2 and _type(encoded[1]) is str:
        return float.fromhex(encoded[1])
    if tag == "c" and n == 3 and _type(encoded[1]) is str and _type(encoded[2]) is str:
        return complex(float.fromhex(encoded[1]), float.fromhex(encoded[2]))
    if tag == "s" and n == 2 and _type(encoded[1]) is str:
        return encoded[1].encode("latin-1").decode("utf-8", "surrogatepass")
    if tag == "y" and n == 2 and _type(encoded[1]) is str:
        return encoded[1].encode("latin-1")
    if tag in ("l", "t", "e", "z") and n == 2 and _type(encoded[1]) is list:
        items = [decode(x, remote, depth + 1) for x in encoded[1]]
        return {"l": list, "t": tuple, "e": set, "z": frozenset}[tag](items)
    if tag == "d" and n == 2 and _type(encoded[1]) is list:
        return {decode(k, remote, depth + 1): decode(v, remote, depth + 1) for k, v in encoded[1]}
    raise ValueError("malformed value")


# ---- the program's process ----------------------------------------------------------------------------------------

_OPS = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def _program(code, job, requests, replies):
    """The forked child: every descriptor but its two pipes and stdout/stderr closed (the events' one first), its
    limits, filter, audit hook; the program loaded; then the judge's requests answered until it closes them."""
    global _OUT
    try:
        os.close(_OUT)  # the events: the judge's alone
        _OUT = -1
        low, high = sorted((requests, replies))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 20)
        limits = job["limits"]
        confine(limits, job["seccomp"])
        forget_ctypes()
        cap_recursion(limits["recursion"])
        _signal.signal(_signal.SIGVTALRM, _out_of_time)
        sys.addaudithook(_refuse_introspection)
    except BaseException:  # noqa: B036
        os._exit(125)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
        loaded = ["loaded", _describe(namespace)]
    except BaseException as e:  # noqa: B036 - sys.exit at import is the program failing to load
        loaded = ["load", kind_of(e)]
    try:
        write_message(replies, loaded)
        if loaded[0] == "loaded":
            _serve(namespace, requests, replies)
    except BaseException:  # noqa: B036
        pass
    os._exit(0)


def _describe(namespace):
    """[name, "m", module] | [name, "i", module, qualname] (a standard library import) | [name, "v", encoded] |
    [name, "p"] (the judge makes it a Remote) for each of the program's names."""
    table = []
    for name, value in list(namespace.items()):
        if _type(name) is not str or (name.startswith("__") and name.endswith("__")):
            continue
        if _type(value) is _type(sys):
            table.append([name, "m", value.__name__])
            continue
        encoded = encode(value)
        if encoded is not None:
            table.append([name, "v", encoded])
            continue
        try:
            module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        except BaseException:  # noqa: B036
            module = qualname = None
        if _type(module) is str and _type(qualname) is str and module not in ("solution", "__main__", "builtins"):
            table.append([name, "i", module, qualname])
        else:
            table.append([name, "p"])
    return table


def _serve(namespace, requests, replies):
    """Answer the judge: ["test", cpu_s] starts a test's CPU timer (it runs only while a request is answered),
    ["end"] stops it (neither is answered); other requests name an object (["n", name] or ["h", handle]) and what
    to do with it."""
    handles, buffer, scan, left = [], bytearray(), _scanner(), 0.0
    while True:
        request = read_message(requests, buffer, scan, 1 << 30)
        if request is None:
            return
        if request[0] in ("test", "end"):
            left = float(request[1]) if request[0] == "test" else 0.0
            continue
        try:
            if left > 0:
                _signal.setitimer(_signal.ITIMER_VIRTUAL, left)
            try:
                reply = _answer(request, namespace, handles)
            finally:
                if left > 0:
                    left = _signal.setitimer(_signal.ITIMER_VIRTUAL, 0)[0] or 1e-3  # spent: the next one stops at once
        except BaseException as e:  # noqa: B036 - the program's exception (or its time running out): the judge's
            try:
                message = latin1(str(e))[:200] if _type(e).__str__ is BaseException.__str__ else ""
            except BaseException:  # noqa: B036
                message = ""
            reply = ["raise", kind_of(e), message]
        write_message(replies, reply)


def _answer(request, namespace, handles):
    def value_of(encoded):
        return decode(encoded, lambda ref: namespace[ref[1]] if ref[0] == "n" else handles[ref[1]])

    changed = []
    if request[0] == "call":  # ["call", ref, args, [[name, value], ...]]
        target, args = value_of(request[1]), [value_of(a) for a in request[2]]
        result = target(*args, **{k: value_of(v) for k, v in request[3]})
        for i, arg in enumerate(args):
            if _type(arg) in (list, dict, set) and (encoded := encode(arg)) is not None:
                changed.append([i, encoded])
    elif request[0] == "attr":  # ["attr", ref, name]
        result = getattr(value_of(request[1]), request[2])
    else:  # ["op", op, ref, the other operand or null]
        op, target = request[1], value_of(request[2])
        other = None if request[3] is None else value_of(request[3])
        if op == "iter":
            result = iter(target)
        elif op == "next":
            result = next(target)
        elif op == "len":
            result = len(target)
        elif op == "getitem":
            result = target[other]
        elif op == "contains":
            result = other in target
        elif op == "bool":
            result = bool(target)
        elif op in ("str", "repr"):
            result = (str if op == "str" else repr)(target)
            result = result if _type(result) is str else None
        else:  # eq, lt, le, gt, ge: exactly True, as strict_eq asks of the program's own objects
            result = (target == other) if op == "eq" else _OPS[op](target, other)
            result = _type(result) is bool and result
    encoded = encode(result)
    if encoded is None:  # not a plain value: the judge gets a handle to it
        handles.append(result)
        encoded = ["h", _len(handles) - 1]
    return ["ok", encoded, changed]


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

