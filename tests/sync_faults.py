"""`python tests/sync_faults.py train ...` is `rlvr train ...` whose weight push at step RLVR_FAULT_STEP goes wrong
in the way RLVR_FAULT names: the input of rlvr.sync_check's tests. Everything else is the real run.

  dropped    the push never reaches the engine
  previous   the engine is given the previous push's weights again
  asleep     the engine sleeps as level 2 does (every weight dropped: here zeroed, through a stand-in for vLLM's sleep,
             which vLLM has not on CPU), and at the fault step wakes through a push whose reload writes no weight
  adapter    (model.lora.sync=adapter) the adapter is written and loaded, but generation runs without it
"""

from __future__ import annotations

import os

import torch

from rlvr import startup
from rlvr.cli import entry
from rlvr.rollout import Engine, Memory

FAULT, STEP = os.environ["RLVR_FAULT"], f"step {os.environ['RLVR_FAULT_STEP']}"
_real_push, _real_reload = startup.Run.push, Engine.load_weights
_last_pushed: list[tuple[str, torch.Tensor]] = []


def faulty_push(run: startup.Run, where: str) -> dict[str, float]:
    if where != STEP:
        if FAULT == "previous":  # what this push sends: the next push sends it again
            _last_pushed[:] = [(n, w.clone()) for n, w in run.learner.named_weights()]
        if FAULT == "asleep" and not isinstance(run.engine.memory.llm, ZeroingSleep):
            run.engine.memory = Memory(ZeroingSleep(run.engine.llm), enabled=True, level=2)
        return _real_push(run, where)
    if FAULT == "previous":
        run.engine.load_weights(iter(_last_pushed))
    elif FAULT == "asleep":
        run.engine.load_weights(iter([]))  # woken, and the reload wrote no weight (vLLM's issue #29341's outcome)
    elif FAULT == "adapter":
        startup.push_weights(run.engine, run.learner, run.sync, run.out)
        run.engine.adapter = None
    return run.sync_check.after_push(where)


class ZeroingSleep:
    """vLLM's LLM with a level-2 sleep on CPU: sleep zeroes every weight (what a woken engine holds when nothing
    refills it: here zeros rather than freed memory's garbage), wake_up does nothing more."""

    def __init__(self, llm) -> None:  # type: ignore[no-untyped-def]
        self.llm = llm

    def sleep(self, level: int) -> None:
        assert level == 2
        self.llm.collective_rpc(_zero_weights)

    def wake_up(self, tags: list[str]) -> None:
        pass


def _zero_weights(worker) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        for p in worker.model_runner.model.parameters():
            p.zero_()


startup.Run.push = faulty_push  # type: ignore[method-assign]

if __name__ == "__main__":
    entry()
