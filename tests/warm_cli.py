"""The CLI tests' processes, started warm: one server process imports rlvr's heavy modules once (torch, vLLM,
transformers, Hydra: ~8 s of every `python -m rlvr` on these machines), then forks a fresh child per command.

Each child is a real process running the real entry point (`runpy` runs `rlvr.__main__` as `python -m rlvr` does, or a
script as `python script.py` does): its own pid, working directory, environment, stdout and stderr files, signals,
exit status and interpreter teardown. What it shares with its siblings is what the imports left behind, and the
server's hash seed (set and dict orders of strings are the same in every child; the resume tests that compare separate
processes bit for bit start theirs with `subprocess`). The server forks only while it has one thread of Python and has
run no torch operation, so no lock or thread pool is copied mid-use. A test about how the process starts (its import
time, `-X` flags, torchrun) starts a real `python` instead.

    run_rlvr("train", ..., cwd=...)   # conftest: a CompletedProcess, as subprocess.run gives
    proc = warm().start(["-m", "rlvr", "train", ...], cwd=...)   # Popen's poll/wait/send_signal/communicate
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOAD = ("rlvr.cli", "rlvr.trainer", "rlvr.startup", "rlvr.eval_command", "hydra", "omegaconf", "transformers")


# --- the server: `python tests/warm_cli.py` (single-threaded: requests on stdin, replies on stdout) ---------------------


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # what the imports built is never collected: a child's interpreter teardown skips it (~2 s each)
    reply("ready")
    pending, children = b"", set()
    while True:
        if select.select([0], [], [], 0.02)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the tests' process is gone: so are its commands
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    child(request)  # exits the child's interpreter (SystemExit), never back into this loop
                children.add(pid)
                reply(f"pid {request['id']} {pid}")
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                reply(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def reply(line: str) -> None:
    os.write(1, (line + "\n").encode())  # unbuffered: no Python-level buffer for a child to inherit


def child(request: dict) -> None:
    """In the fork: become the command's process, then run it as the interpreter would."""
    import io
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    # fresh stream objects on the new files, buffered as a new interpreter's would be (PYTHONUNBUFFERED honoured)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=name == "stderr", write_through=unbuffered)  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # registered first, so it runs last: after the command's own atexit handlers, the interpreter's teardown prints
    # nothing (nanobind's leak reports for the preloaded Triton bindings, which the command may never have imported)
    atexit.register(_silence)
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0], as `-m` does
        sys.path[0] = os.getcwd()  # as `-m` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)  # as `python script.py` does
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def _silence() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


# --- the client: in the tests' process ----------------------------------------------------------------------------------


class WarmCli:
    """The server, started on first use and kept for the test session."""

    def __init__(self) -> None:
        self.files = Path(tempfile.mkdtemp(prefix="warm_cli_"))  # each command's stdout and stderr; the server's stderr
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.files / "server.err", "w") as err:
            self.server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=err, env=env)  # fmt: skip
        self.pids: dict[int, int] = {}  # request id -> pid
        self.exits: dict[int, int] = {}  # pid -> exit status (negative: the signal that ended it)
        self.lines: list[str] = []
        self.next_id = 0
        self._buffer = b""
        self._read_until(lambda: "ready" in self.lines, 300, "the warm CLI server to import rlvr")

    def start(self, argv: list[str], cwd: Path | str, env: dict[str, str] | None = None) -> WarmProcess:
        self.next_id += 1
        rid = self.next_id
        out, err = self.files / f"{rid}.out", self.files / f"{rid}.err"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"} if env is None else env
        request = {"id": rid, "argv": [str(a) for a in argv], "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        assert self.server.stdin is not None
        self.server.stdin.write((json.dumps(request) + "\n").encode())
        self.server.stdin.flush()
        self._read_until(lambda: rid in self.pids, 60, "the fork")
        return WarmProcess(self, self.pids[rid], argv, out, err)

    def run(self, argv: list[str], cwd: Path | str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = self.start(argv, cwd, env)
        stdout, stderr = proc.communicate(timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    def _read_until(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {what}")
            self._pump(min(left, 0.05))

    def _pump(self, wait: float) -> None:
        """Read the server's replies, waiting up to `wait` seconds for the first."""
        assert self.server.stdout is not None
        fd = self.server.stdout.fileno()
        if not select.select([fd], [], [], wait)[0]:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise RuntimeError(f"the warm CLI server exited ({self.server.wait()}): {(self.files / 'server.err').read_text()[-3000:]}")
        self._buffer += chunk
        while b"\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n", 1)
            line = raw.decode()
            self.lines.append(line)
            kind, *values = line.split()
            if kind == "pid":
                self.pids[int(values[0])] = int(values[1])
            elif kind == "exit":
                self.exits[int(values[0])] = int(values[1])

    def close(self) -> None:
        if self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()  # the server kills what is still running and exits
            self.server.wait(timeout=60)
        shutil.rmtree(self.files, ignore_errors=True)


class WarmProcess:
    """One forked command, with the part of Popen's interface the tests use."""

    def __init__(self, cli: WarmCli, pid: int, argv: list[str], stdout: Path, stderr: Path) -> None:
        self.cli, self.pid, self.args, self._stdout, self._stderr = cli, pid, argv, stdout, stderr

    @property
    def returncode(self) -> int | None:
        return self.cli.exits.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.cli._pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.cli._pump(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the server has reaped (it may be another process's now)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end (killing the command past `timeout`, as subprocess.run does), then its output."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        return self.output()

    def output(self) -> tuple[str, str]:
        """What it has written so far (nothing before the fork has opened its files)."""
        return tuple(p.read_text(errors="replace") if p.exists() else "" for p in (self._stdout, self._stderr))  # type: ignore[return-value]


_cli: WarmCli | None = None


def warm() -> WarmCli:
    """The session's server (started on first use; conftest closes it at the session's end)."""
    global _cli
    if _cli is None or _cli.server.poll() is not None:
        _cli = WarmCli()
    return _cli


def close() -> None:
    if _cli is not None:
        _cli.close()


if __name__ == "__main__":
    serve()
