"""`python tests/sweep_census.py train -m ...` is `rlvr train -m ...` that, once each job's start-up is done (its
engine, learner and verifier workers built), appends to $RLVR_CENSUS one JSON line counting what is alive in the
process: vLLM engines, learners, verifier pools (and the job's own) and worker processes. With RLVR_FAIL_FIRST_LOGGER
set, the first job's metrics logger, built last in the start-up, raises. The input of the sweep-teardown test."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import weakref

from vllm import LLM

from rlvr import metrics, startup, trainer
from rlvr.cli import entry
from rlvr.learner import Learner
from rlvr.verifiers.pool import VerifierPool

_real_start = startup.start
_alive: dict[type, weakref.WeakSet] = {LLM: weakref.WeakSet(), Learner: weakref.WeakSet(), VerifierPool: weakref.WeakSet()}


def _registering(cls: type) -> None:
    """Every instance of `cls` made from now on joins _alive[cls] (gc.get_objects misses what gc.freeze() froze)."""
    init = cls.__init__

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        _alive[cls].add(self)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


def counted_start(*args, **kwargs) -> startup.Run:  # type: ignore[no-untyped-def]
    run = _real_start(*args, **kwargs)
    gc.collect()  # what is alive, not what is garbage waiting for a collection
    census = {"engines": len(_alive[LLM]), "learners": len(_alive[Learner]), "pools": len(_alive[VerifierPool]),
              "run_pools": len(run.rewarder.pools),
              "verifier_processes": len(multiprocessing.active_children()), "rss_kib": _rss_kib()}  # fmt: skip
    with open(os.environ["RLVR_CENSUS"], "a") as f:
        f.write(json.dumps(census) + "\n")
    return run


def _rss_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_real_logger_init = metrics.MetricsLogger.__init__
_loggers: list[bool] = []


def failing_first_logger(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    _loggers.append(True)
    if os.environ.get("RLVR_FAIL_FIRST_LOGGER") and len(_loggers) == 1:
        raise RuntimeError("the first job's logger failed (injected)")
    _real_logger_init(self, *args, **kwargs)


metrics.MetricsLogger.__init__ = failing_first_logger  # type: ignore[method-assign]
_registering(LLM)
_registering(Learner)
_registering(VerifierPool)
trainer.start = counted_start  # (the loop's own name for it)

if __name__ == "__main__":
    entry()
