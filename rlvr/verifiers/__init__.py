"""Rule-based verifiers: pure functions from (completion text, ground-truth answer) to an Outcome.

No torch, no vllm. Model output is untrusted text: parsed, never evaluated.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    NO_ANSWER = "no_answer"  # nothing parseable (also what a failed verifier call counts as)
    TIMEOUT = "timeout"  # the verifier gave up: its work budget or the pool's reward.timeout_s ran out (not the model's fault)
