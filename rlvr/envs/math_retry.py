"""math_retry (rollout.env=rlvr.envs.math_retry:make): a wrong answer is told so and the model tries again.

Each turn's answer is checked with the task's verifier (arithmetic, math or countdown: the verifier the example names,
run here in the step); a right one ends the episode with reward discount^(k-1) at attempt k, a wrong one (or none)
gets `message` ("That is not right, try again."; `{prompt}` in it is the example's prompt) and another attempt, up to
`attempts`; after the last wrong one the episode ends with reward 0. Options (rollout.env_options): attempts (3),
discount (0.5), message. Use it with reward.verifier=none: the verifier already gave the return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.verifiers import Outcome

MESSAGE = "That is not right, try again."


def _checker(verifier: str | None) -> Callable[[str, str], Outcome]:
    if verifier == "arithmetic":
        from rlvr.verifiers.arithmetic import verify
    elif verifier in (None, "math"):
        from rlvr.verifiers.math import verify  # type: ignore[assignment]
    elif verifier == "countdown":
        from rlvr.verifiers.countdown import verify  # type: ignore[assignment]
    else:
        raise ValueError(f"math_retry checks answers with the arithmetic, math or countdown verifier; this task's is "
                         f"{verifier!r}")  # fmt: skip
    return verify


class MathRetry:
    def __init__(self, example: dict[str, Any], attempts: int, discount: float, message: str) -> None:
        if attempts < 1 or not 0 < discount <= 1:
            raise ValueError(f"math_retry needs attempts >= 1 and discount in (0, 1], got {attempts}, {discount}")
        self.answer, self.attempts, self.discount = example["answer"], attempts, discount
        self.message = message.replace("{prompt}", example.get("prompt") or "")
        self.check = _checker(example.get("verifier"))
        self.attempt = 0

    def reset(self, *, seed: int) -> tuple[None, dict[str, Any]]:
        self.attempt = 0
        return None, {}

    def step(self, action: str) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        self.attempt += 1
        if self.check(action, self.answer) is Outcome.CORRECT:
            return None, self.discount ** (self.attempt - 1), True, False, {"success": True, "attempts": self.attempt}
        if self.attempt >= self.attempts:
            return None, 0.0, True, False, {"success": False, "attempts": self.attempt}
        return self.message, 0.0, False, False, {"attempts": self.attempt}


def make(example: dict[str, Any], attempts: int = 3, discount: float = 0.5, message: str = MESSAGE) -> MathRetry:
    return MathRetry(example, attempts, discount, message)
