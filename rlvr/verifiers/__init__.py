"""Rule-based verifiers: pure functions from (completion text, ground-truth answer) to an Outcome.

No torch, no vllm. Model output is untrusted text: parsed, never evaluated.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Outcome(enum.Enum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    NO_ANSWER = "no_answer"  # nothing parseable (also what a failed verifier call counts as)
    TIMEOUT = "timeout"  # the verifier gave up: its work budget or the pool's reward.timeout_s ran out (not the model's fault)


class Verdict(NamedTuple):
    """A verifier's full answer where an Outcome alone says too little (the code verifier): the outcome, the share of
    tests passed (the reward with reward.partial), and why (counted in the metrics as reward/detail/<detail>)."""

    outcome: Outcome
    score: float
    detail: str
    inner_checks: int = 0  # code: asserts judged inside the sandbox, apart from the program, not here (verifiers.code)
