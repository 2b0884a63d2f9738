"""The judge of functions mode (inside the sandbox, in the harness's process): compiles the program, forks the
program's own process (program.py), then runs each test's rewritten code here, where the program's names are Remote
objects whose calls, attributes and comparisons that process answers in the strict encoding. The program never shares a
process, a descriptor or memory with the code that judges it (harness.py's docstring has the protocol).
Standard library only."""

import _signal
import os
import sys

if __name__ != "rlvr_runner":  # imported on the trusted side (tests, type checks); inside the sandbox the harness's
    # modules share one namespace (rlvr.verifiers.code.sandbox.runner_code), where these names are already there
    from rlvr.verifiers.code.harness import (
        _BUILTINS,
        MAX_REPLY,
        ProgramGone,
        Remote,
        TestTimeout,
        _exit_kind,
        _len,
        _scanner,
        _type,
        confine,
        decode,
        encode,
        kind_of,
        read_message,
        send,
        strict_eq,
        truth,
        write_message,
    )
    from rlvr.verifiers.code.program import _program


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


class ProgramError(Exception):
    """An exception the program raised whose class is not a built-in exception (its name is in the message)."""


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


def _value_hook(test):
    def value(site, v):
        send("value", test, site, encode(v))

    return value


def _truth_hook(test):
    def report(site, v):
        send("truth", test, site, truth(v))

    return report
