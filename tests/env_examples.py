"""Environments written for the tests (rollout.env=env_examples:<factory>, with tests/ on the path): one the built-in
tiny model can play (AddChain: a new addition problem every turn) and ones that break the protocol in each way the
driver must survive. Not built-ins: rlvr.envs has those."""

from __future__ import annotations

import random
import threading
import time

CLOSED: list[str] = []  # ids of the episodes whose close ran (the tests read it)
_LOCK = threading.Lock()


def problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"{a:02d}+{b:02d}=", f"{a + b:03d}"


class AddChain:
    """The built-in task as an episode: the first problem is the example's own prompt (reset's observation None), each
    step scores the model's answer (1 if right) and shows the next problem, drawn from the reset seed; `turns` problems
    in all, then it terminates. Success: every answer right."""

    def __init__(self, example: dict, turns: int = 3, sep: str = "") -> None:
        self.example, self.turns, self.sep = example, turns, sep
        self.gold = example["answer"]
        self.right = 0
        self.steps = 0

    def reset(self, *, seed: int):
        self.rng = random.Random(seed)
        return None, {"seed": seed}

    def step(self, action: str):
        self.steps += 1
        self.right += action.strip() == self.gold
        reward = float(action.strip() == self.gold)
        if self.steps >= self.turns:
            return None, reward, True, False, {"success": self.right == self.turns}
        shown, self.gold = problem(self.rng)
        return self.sep + shown, reward, False, False, {}

    def close(self) -> None:
        with _LOCK:
            CLOSED.append(self.example["id"])


def add_chain(example: dict, turns: int = 3, sep: str = "") -> AddChain:
    return AddChain(example, turns, sep)


class Scripted:
    """Steps as a script says: reset gives `first` (None keeps the prompt); step k returns script[k] (a tuple), or calls
    it when it is callable; the actions are kept."""

    def __init__(self, example: dict, script: list, first: str | None = None, reset_fails: bool = False) -> None:
        self.example, self.script, self.first, self.reset_fails = example, script, first, reset_fails
        self.actions: list[str] = []
        self.seed: int | None = None

    def reset(self, *, seed: int):
        if self.reset_fails:
            raise RuntimeError("no world today")
        self.seed = seed
        return self.first, {}

    def step(self, action: str):
        self.actions.append(action)
        out = self.script[min(len(self.actions), len(self.script)) - 1]
        return out() if callable(out) else out

    def close(self) -> None:
        with _LOCK:
            CLOSED.append(self.example["id"])


def hangs() -> tuple:
    time.sleep(5)
    return "late", 0.0, False, False, {}


def raises() -> tuple:
    raise ValueError("the world broke")


class NoStep:
    def __init__(self, example: dict) -> None:
        pass

    def reset(self, *, seed: int):
        return None, {}


def no_step(example: dict) -> NoStep:
    return NoStep(example)


def make_raises(example: dict):
    raise RuntimeError("cannot build the world")


NOT_A_FUNCTION = 3
