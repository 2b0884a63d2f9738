"""Verifier for the built-in arithmetic task: the whole completion must be one integer."""

from __future__ import annotations

import re

from rlvr.verifiers import Outcome

_INTEGER = re.compile(r"-?\d{1,32}")  # bounded: a 100k-digit "answer" is not parsed


def verify(completion: str, answer: str) -> Outcome:
    """CORRECT if the stripped completion is exactly the integer `answer`."""
    text = completion.strip()
    if not _INTEGER.fullmatch(text):
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if int(text) == int(answer) else Outcome.INCORRECT
