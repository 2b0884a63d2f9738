"""The harness inside the sandbox: runs one program's tests and reports what it observed. Standard library only.

The harness is four modules that run inside the sandbox as one namespace: this one, what every process inside shares
(the wire format, the strict encoding, the confinement, the program's values seen from the judge: Remote), program.py
(the program's own process in functions mode: answers the judge's requests), judge.py (runs the tests outside the
program's process) and runner.py (the entry `main`, and the stdio mode's cases). Each imports only the ones before
it. rlvr.verifiers.code.sandbox starts `python -I -S -B` inside bubblewrap and writes their code objects and one job to
its stdin (marshal, from the trusted side; a third faster than compiling the files each time); they run in one
namespace, in that order, then `main(job)` runs it and
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


def _exit_kind(status, cpu, cpu_limit):
    """None for exit 0; "memory" (exit 124); "timeout" when the CPU limit killed it (SIGXCPU, or SIGKILL at the hard
    limit: it used its CPU time); else "RuntimeError" (a crash, or a kill of its own)."""
    if os.WIFSIGNALED(status):
        limit = os.WTERMSIG(status) in (_signal.SIGXCPU, _signal.SIGKILL) and cpu >= 0.9 * cpu_limit
        return "timeout" if limit else "RuntimeError"
    code = os.WEXITSTATUS(status)
    return None if code == 0 else "memory" if code == 124 else "RuntimeError"


class ProgramGone(BaseException):
    """The program's process ended, or sent what the protocol does not allow; `kind` says how (a "done" kind)."""

    def __init__(self, kind):
        super().__init__(kind)
        self.kind = kind


class TestTimeout(BaseException):
    """A test ran past its CPU time (the process's RLIMIT_CPU bounds all tests together, in case a program swallows
    this or resets the timer)."""


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
