"""The program's own process in functions mode (inside the sandbox, forked by the judge): confines itself, loads the
program, then answers the judge's requests (a call, an attribute, an operation) with values in the strict encoding,
or handles to objects that have none. It never writes an event: the judge's descriptor is closed first.
Standard library only."""

import _signal
import os
import sys

if __name__ != "rlvr_runner":  # imported on the trusted side (tests, type checks); inside the sandbox the harness's
    # modules share one namespace (rlvr.verifiers.code.sandbox.runner_code), where these names are already there
    from rlvr.verifiers.code.harness import (
        _OUT,
        TestTimeout,
        _len,
        _scanner,
        _type,
        cap_recursion,
        confine,
        decode,
        encode,
        forget_ctypes,
        kind_of,
        latin1,
        read_message,
        write_message,
    )

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


