"""`python tests/poison.py train ...` is `rlvr train ...` whose advantages turn NaN from the Nth step on
(RLVR_POISON_FROM_STEP): the input of the non-finite-loss guard's test. Everything else is the real run."""

from __future__ import annotations

import os

import torch

from rlvr import algo
from rlvr.cli import entry

_real = algo.group_advantages
_calls = 0


def poisoned_group_advantages(*args, **kwargs) -> torch.Tensor:
    global _calls
    _calls += 1  # one call per step
    adv = _real(*args, **kwargs)  # [N]
    return adv * float("nan") if _calls >= int(os.environ["RLVR_POISON_FROM_STEP"]) else adv


algo.group_advantages = poisoned_group_advantages  # the trainer calls it through the module

if __name__ == "__main__":
    entry()
