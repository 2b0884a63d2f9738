"""Examples for training and evaluation: a seeded, resumable stream of prompts.

The stream walks the training examples in a fresh seeded permutation per epoch; its position
(epoch, index) is all the state it has, so a checkpoint can restore it exactly.
"""

from __future__ import annotations

import random

from rlvr.config import DataConfig, Task, VerifierName
from rlvr.tasks import arithmetic
from rlvr.types import Example


def load_task(cfg: DataConfig) -> tuple[list[Example], list[Example], VerifierName]:
    """(training examples, held-out evaluation examples, the task's verifier) of the configured task."""
    if cfg.task is Task.arithmetic:
        return arithmetic.train_examples(), arithmetic.eval_examples(cfg.eval_size), VerifierName.arithmetic
    raise AssertionError(f"unhandled task {cfg.task}")


class PromptStream:
    """Endless seeded shuffle of `examples`, one permutation per epoch."""

    def __init__(self, examples: list[Example], seed: int) -> None:
        if not examples:
            raise ValueError("the training set is empty")
        self.examples = examples
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.examples[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation(self.epoch)
