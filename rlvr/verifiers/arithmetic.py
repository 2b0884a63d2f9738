"""Verifier for the built-in arithmetic task: the whole completion must be one integer."""

from __future__ import annotations

import re

from rlvr.verifiers import Outcome

_INTEGER = re.compile(r"-?\d{1,32}")  # bounded: a 100k-digit "answer" is not parsed


def extract(completion: str) -> str | None:
    """The stripped completion if it is one integer, else None."""
    text = completion.strip()
    return text if _INTEGER.fullmatch(text) else None


def verify(completion: str, answer: str) -> Outcome:
    """CORRECT if the stripped completion is exactly the integer `answer`."""
    text = extract(completion)
    if text is None:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if int(text) == int(answer) else Outcome.INCORRECT


def check_gold(answer: str) -> Outcome:
    """The verdict on a perfect completion for this gold (rlvr.gold): the gold itself as the completion."""
    return verify(answer, answer)
