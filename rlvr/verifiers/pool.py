"""Run a verifier over a batch in worker processes, with a per-sample wall-clock timeout.

    with VerifierPool("rlvr.verifiers.math:verify", workers=2, timeout_s=5.0) as pool:
        results, stats = pool.score([(completion, answer), ...])

`fn(completion, answer)` returns an `Outcome`, a `Verdict` (an Outcome with a score and a detail) or a number (a user reward function may return a
float score). Workers are started once ("spawn": fork is unsafe beside torch / vLLM threads) and
reused across batches. Work goes out in chunks; a worker reports each result as it finishes, so the
parent knows when each sample started and kills a worker whose current sample runs past
`timeout_s`: that sample gets `Outcome.TIMEOUT` (counted in `stats.timeouts`: the verifier gave up,
not the model), the rest of its chunk is re-queued, and a fresh worker replaces it. A call that raises,
returns something other than an Outcome or a finite number, or kills its worker gets NO_ANSWER
(counted in `stats.errors`). A verifier may return TIMEOUT itself (its own work budget ran out);
the pool passes it on like any Outcome and does not count it.
`score` never raises because of `fn`; it raises RuntimeError only if a worker cannot start at all.

`workers=0` runs `fn` in this process, one sample after another, with NO timeout (a stuck call
hangs the batch): for debugging only.

Workers set OMP_NUM_THREADS=1 before loading `fn`, call its module's `warm_up()` if it has one (slow
first-use work such as the math verifier's imports, kept out of the first sample's timeout and work
budget), ignore Ctrl-C (the parent owns it), and are daemonic (they die with the parent; `fn` cannot start multiprocessing children of its own). A user
function named by import path is the user's own code and runs with the user's rights.
"""

from __future__ import annotations

import functools
import importlib
import math
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from rlvr.verifiers import Outcome, Verdict

Result = Outcome | float
Scored = Outcome | float | Verdict  # what a pool returns: a Verdict where the verifier gives one (rlvr.rewards unpacks it)
START_TIMEOUT_S = 120.0  # a worker must import `fn` and report ready within this
MAX_CHUNK = 64  # samples per message; small enough that work spreads evenly over workers


@dataclass
class PoolStats:
    timeouts: int = 0  # samples that ran past timeout_s (Outcome.TIMEOUT; their worker was killed and replaced)
    errors: int = 0  # samples whose call raised, returned a bad value, or killed its worker


def load_function(path: str) -> Callable:
    """Import "package.module:function"; ValueError naming `path` and the reason if that fails."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ValueError(f"function path {path!r}: expected the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"function path {path!r}: module {module_name!r} not found ({e})") from e
    except Exception as e:  # the module itself raised while importing
        raise ValueError(f"function path {path!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"function path {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"function path {path!r}: {attr!r} is a {type(obj).__name__}, not callable")
    return obj


@functools.cache
def _loaded(path: str) -> Callable:
    return load_function(path)


def call_with_thoughts(path: str, completion: str, answer: str, thoughts: str | None) -> object:
    """The user's function at `path` called as fn(completion, answer, thoughts=thoughts): a reward function with a
    `thoughts` parameter gets a thinking answer's thoughts beside the answer it is graded on (rlvr.rewards)."""
    return _loaded(path)(completion, answer, thoughts=thoughts)


def _checked(value: object) -> Scored:
    """An Outcome, a Verdict, or a finite number as float; TypeError for anything else."""
    if isinstance(value, Outcome):
        return value
    if isinstance(value, Verdict) and isinstance(value.outcome, Outcome) and 0.0 <= value.score <= 1.0:
        return value
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    raise TypeError(f"verifier returned {type(value).__name__}; expected an Outcome or a finite number")


def _describe(error: BaseException) -> str:
    try:
        return f"{type(error).__name__}: {error}"[:500]
    except Exception:  # str() of an exception can itself raise
        return type(error).__name__


def _worker_main(conn: Connection, fn_spec: str | bytes) -> None:
    """Worker loop: load fn, say ready, then answer chunks one result message per sample."""
    os.environ["OMP_NUM_THREADS"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    fn = load_function(fn_spec) if isinstance(fn_spec, str) else pickle.loads(fn_spec)
    warm_up = getattr(sys.modules.get(getattr(getattr(fn, "func", fn), "__module__", "") or ""), "warm_up", None)
    if callable(warm_up):  # the verifier's one-off start-up work (imports, tables), outside every sample's timeout
        warm_up()
    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except EOFError:  # the parent went away
            return
        if chunk is None:
            return
        for index, *args in chunk:  # (completion, answer), or with a third item (call_with_thoughts)
            try:
                conn.send((index, _checked(fn(*args)), None))
            except BaseException as e:  # noqa: B036 - a reward function's sys.exit is its error too
                conn.send((index, None, _describe(e)))


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    ready: bool = False
    chunk: list[int] = field(default_factory=list)  # sample indices sent, in order
    done: int = 0  # results received for this chunk; chunk[done] is running
    started: float = 0.0  # when chunk[done] started (dispatch, or the previous result's arrival)


class VerifierPool:
    """`fn` (a picklable module-level callable, or "package.module:function") over batches of
    (completion, answer) pairs in `workers` processes, each sample bounded by `timeout_s` seconds."""

    def __init__(self, fn: Callable | str, *, workers: int, timeout_s: float):
        if workers < 0 or timeout_s <= 0:
            raise ValueError(f"VerifierPool needs workers >= 0 and timeout_s > 0, got {workers}, {timeout_s}")
        self.fn = fn  # as given: an import path or a callable
        self._fn = load_function(fn) if isinstance(fn, str) else fn  # a bad path fails here, in the parent
        if workers > 0:
            try:
                self._spec: str | bytes = fn if isinstance(fn, str) else pickle.dumps(fn)
            except Exception as e:
                raise ValueError(f"verifier {fn!r} cannot be sent to worker processes: {_describe(e)}") from e
        self._n_workers, self._timeout_s = workers, timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []

    def __enter__(self) -> VerifierPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, wait: bool = True) -> None:
        """Start the workers and wait until each has loaded `fn` (idempotent). wait=False returns once they are
        launched, so that they import `fn` while the caller goes on (loading models); `score` waits for them."""
        while len(self._workers) < self._n_workers:
            self._workers.append(self._spawn())
        if not wait:
            return
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while not all(w.ready for w in self._workers):
                self._receive([w for w in self._workers if not w.ready], deadline - time.monotonic(), [], PoolStats())
                if time.monotonic() > deadline:
                    raise RuntimeError(f"verifier workers did not start within {START_TIMEOUT_S:.0f} s")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop all workers (a stuck one is killed)."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.process.join(timeout=1.0)
            self._kill(w)
        self._workers = []

    def score(self, pairs: list[tuple[str, ...]]) -> tuple[list[Scored], PoolStats]:
        """One result per (completion, answer) pair, in order, and the batch's timeout / error counts. (A sample may carry
        a third item for `fn`: the thoughts, for call_with_thoughts.)"""
        stats = PoolStats()
        if self._n_workers == 0:
            return [self._call_here(stats, *pair) for pair in pairs], stats
        self.start()
        results: list[Scored | None] = [None] * len(pairs)
        queue = deque(range(len(pairs)))
        chunk_size = max(1, min(MAX_CHUNK, math.ceil(len(pairs) / (4 * self._n_workers))))
        while queue or any(w.chunk for w in self._workers):
            now = time.monotonic()
            for w in self._workers:  # hand a chunk to every idle worker
                if w.ready and not w.chunk and queue:
                    w.chunk = [queue.popleft() for _ in range(min(chunk_size, len(queue)))]
                    w.done, w.started = 0, now
                    try:
                        w.conn.send([(i, *pairs[i]) for i in w.chunk])
                    except OSError:  # it just died: take the chunk back; _receive reports the death
                        queue.extendleft(reversed(w.chunk))
                        w.chunk = []
            busy = [w.started + self._timeout_s for w in self._workers if w.chunk]
            dead = self._receive(self._workers, (min(busy) if busy else now + 0.1) - now, results, stats)
            now = time.monotonic()
            timed_out = [w for w in self._workers if w.chunk and now - w.started > self._timeout_s]
            for w in dead + [w for w in timed_out if w not in dead]:  # kill, re-queue the rest, replace
                self._retire(w, queue, results, stats, timed_out=w not in dead)
        return [r for r in results if r is not None], stats

    def _call_here(self, stats: PoolStats, *args: str) -> Scored:
        try:
            return _checked(self._fn(*args))
        except Exception:
            stats.errors += 1
            return Outcome.NO_ANSWER

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_main, args=(child_conn, self._spec), daemon=True)
        process.start()
        child_conn.close()  # the parent keeps only its end, so a dead worker reads as EOF
        return _Worker(process, parent_conn)

    def _receive(self, workers: list[_Worker], timeout: float, results: list, stats: PoolStats) -> list[_Worker]:
        """Wait up to `timeout` s for messages and record them; return the workers that died."""
        ready = wait([w.conn for w in workers] + [w.process.sentinel for w in workers], max(0.0, timeout))
        dead = []
        for w in workers:
            if w.conn not in ready and w.process.sentinel not in ready:
                continue
            try:
                while w.conn.poll():
                    message = w.conn.recv()
                    if message == "ready":
                        w.ready = True
                        continue
                    index, result, error = message
                    results[index] = result if error is None else Outcome.NO_ANSWER
                    stats.errors += error is not None
                    w.done, w.started = w.done + 1, time.monotonic()
                    if w.done == len(w.chunk):
                        w.chunk = []
                alive = w.process.is_alive()
            except (EOFError, OSError):
                alive = False
            if not alive and not w.ready:
                w.process.join(timeout=5.0)
                raise RuntimeError(f"a verifier worker exited during start-up (exit code {w.process.exitcode})")
            if not alive:
                dead.append(w)
        return dead

    def _retire(self, w: _Worker, queue: deque[int], results: list, stats: PoolStats, *, timed_out: bool) -> None:
        """Kill `w`, give its running sample TIMEOUT (`timed_out`) or NO_ANSWER (it died), re-queue the rest of its
        chunk, start a replacement."""
        if w.chunk:
            results[w.chunk[w.done]] = Outcome.TIMEOUT if timed_out else Outcome.NO_ANSWER
            stats.timeouts += timed_out
            stats.errors += not timed_out
            queue.extendleft(reversed(w.chunk[w.done + 1 :]))
        self._kill(w)
        self._workers[self._workers.index(w)] = self._spawn()

    @staticmethod
    def _kill(w: _Worker) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5.0)
        w.conn.close()
