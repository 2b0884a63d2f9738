"""The harness's entry inside the sandbox: `main(job)` (becomes the unprivileged user, sends "ready", runs the job's
mode) and the stdio mode's cases (a fresh child per case, its stdout reported). Standard library only; harness.py's
docstring has the whole protocol."""

import _signal
import os
import resource
import sys
import time

if __name__ != "rlvr_runner":  # imported on the trusted side (tests, type checks); inside the sandbox the harness's
    # modules share one namespace (rlvr.verifiers.code.sandbox.runner_code), where these names are already there
    from rlvr.verifiers.code.harness import _exit_kind, _len, _type, cap_recursion, confine, scratch, send
    from rlvr.verifiers.code.judge import run_functions


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
