"""`python tests/run_faults.py train ...` is `rlvr train ...` with one fault injected where RLVR_FAULT says, at step
RLVR_FAULT_STEP: the input of tests/test_faults.py. Everything else is the real run (vLLM, the learner, the CLI).

  enospc    the checkpoint of that step fails to write: the disk is full (OSError ENOSPC, as a full filesystem gives)
  engine    the engine raises while it samples that step's rollout (the N-th sampling call: one a step with GRPO)
  oom       the learner runs out of memory in that step's first update (after the N-th sampling call)
"""

from __future__ import annotations

import errno
import os

import torch

from rlvr import checkpoint
from rlvr.cli import entry
from rlvr.learner import Learner
from rlvr.rollout import Engine

FAULT, STEP = os.environ["RLVR_FAULT"], int(os.environ["RLVR_FAULT_STEP"])
_real_save, _real_generate, _real_update = checkpoint.save_state, Engine.generate, Learner.update
_calls: list[str] = []


def full_disk(path, obj) -> None:  # type: ignore[no-untyped-def]
    if path.parent.name == f".tmp-step_{STEP:08d}":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    _real_save(path, obj)


def counting_generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    if kwargs.get("temperature", 0) > 0:  # a rollout (the evaluations are greedy)
        _calls.append("rollout")
        if FAULT == "engine" and _calls.count("rollout") == STEP:
            raise RuntimeError("the engine's worker died (injected)")
    return _real_generate(self, *args, **kwargs)


def out_of_memory(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    if _calls.count("rollout") == STEP:
        raise torch.OutOfMemoryError("CPU out of memory (injected): tried to allocate 8.00 GiB")
    return _real_update(self, *args, **kwargs)


Engine.generate = counting_generate  # type: ignore[method-assign]
if FAULT == "enospc":
    checkpoint.save_state = full_disk  # type: ignore[assignment]
elif FAULT == "oom":
    Learner.update = out_of_memory  # type: ignore[method-assign]

if __name__ == "__main__":
    entry()
