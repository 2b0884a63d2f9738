"""The processes that run the user's tool functions (rlvr.function_tools), so that a call can be stopped.

A function runs in a worker process of its own kind, not in a thread of the trainer: Python cannot stop a thread, and a
function in one long C call (a big-integer product, `sum(range(10**10))`, a regex that backtracks) holds the GIL, so
the timeout would not hold and the whole rollout would wait. A worker that runs past rollout.tool.timeout_s is killed,
and the next call starts a fresh one; so a timed-out call never runs on beside the next. The result is written as text
inside the worker, inside the timed part, and the writing stops at the cap (MAX_RESULT_CHARS), so a huge result costs
neither the trainer's memory nor time outside the timeout.

Workers are plain interpreters (`python -c`, the trainer's sys.path, OMP_NUM_THREADS=1) that import only this module
and the functions' own modules: no torch, no vLLM, no multiprocessing spawn of the trainer's main module. They start on
first use (their start is not counted in a call's time), at most `workers` at once, and end with the trainer: at
close(), when their requests pipe closes, or when the trainer dies (PR_SET_PDEATHSIG). They run with the user's
rights, as a reward.fn does. A function keeps module-level state between calls only within its worker: calls of one
answer may land on different workers, and a killed worker's state is gone.

Messages are JSON lines: a call {"name", "args"} on the worker's stdin, its reply [status, text] on a pipe of its own
(the worker's stdout is its stderr, so a function's print() cannot garble the replies).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

MAX_RESULT_CHARS = 1 << 16  # a longer result is cut here (status "limit"), as the sandbox's output is
START_TIMEOUT_S = 120.0  # a worker must import the functions and say it is ready within this
_CUT = "\n[result cut: {} characters]"


class FunctionWorkers:
    """Calls of the functions `paths` names (name -> "package.module:function"), each in a worker process, at most
    `workers` at once, each stopped after `timeout_s` seconds."""

    def __init__(self, paths: dict[str, str], *, workers: int, timeout_s: float) -> None:
        self.paths, self.workers, self.timeout_s = dict(paths), workers, timeout_s
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        # workers are started from one thread that lives as long as the pool: PR_SET_PDEATHSIG fires when the thread
        # that started a process ends, and the driver's call threads end with every turn
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-function-workers")

    def call(self, name: str, args: dict) -> tuple[str, str]:
        """(status, text): "ok" and the result as text (a str as it is, anything else as JSON), "limit" and the result
        cut at MAX_RESULT_CHARS, "error" and what went wrong, "timeout" and why. Never raises for the function."""
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                try:
                    worker = self._start()
                except OSError as e:
                    return "error", f"[{name} could not start a worker process: {e}]"
            reply = worker.ask(json.dumps({"name": name, "args": args}), self.timeout_s)
            if reply is None or not worker.alive():  # timed out (killed) or died: never used again
                self._forget(worker)
                if reply is None and worker.timed_out:
                    return "timeout", f"[{name} timed out after {self.timeout_s:g} s]"
                return "error", f"[{name} ended its worker process (exit code {worker.process.poll()})]"
            self._idle.put(worker)
            status, text = reply
            return status, text

    def close(self) -> None:
        """Stop every worker (a busy one is killed)."""
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.stop()
        self._spawner.shutdown(wait=False)

    def _start(self) -> _Worker:
        worker = self._spawner.submit(_Worker, self.paths).result()
        with self._lock:
            self._all.add(worker)
        return worker

    def _forget(self, worker: _Worker) -> None:
        worker.stop()
        with self._lock:
            self._all.discard(worker)


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, paths: dict[str, str]) -> None:
        replies_r, replies_w = os.pipe()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        boot = f"import rlvr.function_workers as w; w.serve({replies_w}, {json.dumps(paths)!r})"
        try:
            self.process = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, pass_fds=(replies_w,),
                                            env=env, text=True, encoding="utf-8")  # fmt: skip
        except BaseException:
            os.close(replies_r)
            raise
        finally:
            os.close(replies_w)
        self.replies = os.fdopen(replies_r, "r", encoding="utf-8")
        self.timed_out = False
        if self._read(START_TIMEOUT_S) != "ready":
            self.stop()
            raise OSError(f"the worker did not start (exit code {self.process.poll()})")

    def ask(self, message: str, timeout_s: float) -> tuple[str, str] | None:
        """Send one call and wait for its reply; None when it runs past `timeout_s` (then it is killed) or dies."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(message + "\n")
            self.process.stdin.flush()
        except OSError:
            return None
        line = self._read(timeout_s)
        if line is None:
            return None
        status, text = json.loads(line)
        return status, text

    def _read(self, timeout_s: float) -> str | None:
        """One reply line, or None (the timeout passed: the worker is killed; or it closed its end: it died)."""
        ready, _, _ = select.select([self.replies], [], [], timeout_s)
        if not ready:
            self.timed_out = True
            self.stop()
            return None
        line = self.replies.readline()
        return line.rstrip("\n") if line else None

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.replies):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


def serve(replies_fd: int, paths: str) -> None:
    """A worker's life (in the worker process): load the functions, say ready, then answer calls until stdin closes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    os.dup2(2, 1)  # a function's print() goes to stderr, never into the replies
    from rlvr.verifiers.pool import load_function

    functions = {name: load_function(path) for name, path in json.loads(paths).items()}
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        call = json.loads(line)
        replies.write(json.dumps(run(functions[call["name"]], call["name"], call["args"])) + "\n")
        replies.flush()


def run(function, name: str, args: dict) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Call `function(**args)` and write its result as text, stopping at MAX_RESULT_CHARS: (status, text)."""
    try:
        value = function(**args)
    except BaseException as e:  # noqa: BLE001  (SystemExit too: the user's code, this answer's error)
        return "error", f"[{name} raised {type(e).__name__}: {_text(e)[:500]}]"
    if isinstance(value, str):
        if len(value) > MAX_RESULT_CHARS:
            return "limit", value[:MAX_RESULT_CHARS] + _CUT.format(len(value))
        return "ok", value
    pieces, size = [], 0
    try:
        for piece in json.JSONEncoder(ensure_ascii=False, default=str).iterencode(value):
            pieces.append(piece)
            size += len(piece)
            if size > MAX_RESULT_CHARS:
                return "limit", "".join(pieces)[:MAX_RESULT_CHARS] + _CUT.format(f"over {MAX_RESULT_CHARS}")
    except (TypeError, ValueError, RecursionError) as e:  # circular structures
        return "error", f"[{name} returned a {type(value).__name__} that cannot be written as JSON: {e}]"
    return "ok", "".join(pieces)


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # str() of an exception can itself raise
        return ""


def _die_with_parent() -> None:
    """SIGKILL this worker when the trainer dies, even in the middle of a call (Linux; elsewhere stdin's EOF ends it)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the trainer died before the line above took effect
        os._exit(0)
