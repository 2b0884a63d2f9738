"""Two-digit addition in fixed width: `07+95=` -> `102`, `12+34=` -> `046`.

Operands are written with two digits and sums with three, so every digit of every problem sits at
the same position: a 1M-parameter character model learns one algorithm instead of one per layout.

The 10,000 pairs (a, b) with 0 <= a, b <= 99 are split once, by a fixed seed that no
run can change, into an evaluation pool of 1,000 pairs and a training pool of 9,000.
The warm-start script and every RL run draw only from the training pool, so held-out
accuracy is measured on pairs the model has never been trained on.
"""

from __future__ import annotations

import random

from rlvr.types import Example

NUM_PAIRS = 100 * 100
EVAL_POOL_SIZE = 1000
_SPLIT_SEED = 20261130  # fixed forever: changing it would leak eval pairs into training


def _pair(index: int) -> tuple[int, int]:
    return divmod(index, 100)


def _split() -> tuple[list[int], list[int]]:
    order = list(range(NUM_PAIRS))
    random.Random(_SPLIT_SEED).shuffle(order)
    return sorted(order[EVAL_POOL_SIZE:]), order[:EVAL_POOL_SIZE]


TRAIN_POOL, EVAL_POOL = _split()


def example(index: int) -> Example:
    a, b = _pair(index)
    return Example(id=f"add-{a}-{b}", prompt=f"{a:02d}+{b:02d}=", answer=f"{a + b:03d}")


def train_examples() -> list[Example]:
    """The 9,000 training pairs, in a fixed order (callers shuffle)."""
    return [example(i) for i in TRAIN_POOL]


def eval_examples(n: int) -> list[Example]:
    """The first `n` pairs of the fixed evaluation pool (n <= 1000)."""
    if not 0 < n <= EVAL_POOL_SIZE:
        raise ValueError(f"eval size must be in 1..{EVAL_POOL_SIZE}, got {n}")
    return [example(i) for i in EVAL_POOL[:n]]
