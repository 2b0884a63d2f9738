"""The built-in task's split, its verifier, and the seeded, resumable prompt stream."""

from __future__ import annotations

import pytest

from rlvr.data import PromptStream
from rlvr.tasks import arithmetic
from rlvr.verifiers import Outcome
from rlvr.verifiers.arithmetic import verify


def test_eval_pool_is_disjoint_from_training_pool():
    train = {e.prompt for e in arithmetic.train_examples()}
    held_out = {e.prompt for e in arithmetic.eval_examples(arithmetic.EVAL_POOL_SIZE)}
    assert len(train) == 9000 and len(held_out) == 1000
    assert not train & held_out


def test_examples_know_their_answers():
    for e in arithmetic.eval_examples(50):
        a, b = e.prompt.rstrip("=").split("+")
        assert int(e.answer) == int(a) + int(b)


def test_eval_set_is_fixed_prefix():
    assert arithmetic.eval_examples(10) == arithmetic.eval_examples(100)[:10]
    with pytest.raises(ValueError, match="eval size"):
        arithmetic.eval_examples(1001)


@pytest.mark.parametrize(
    "text, answer, outcome",
    [
        ("46", "46", Outcome.CORRECT),
        (" 46\n", "46", Outcome.CORRECT),
        ("046", "46", Outcome.CORRECT),
        ("45", "46", Outcome.INCORRECT),
        ("46+1", "46", Outcome.NO_ANSWER),
        ("", "46", Outcome.NO_ANSWER),
        ("forty-six", "46", Outcome.NO_ANSWER),
        ("9" * 100_000, "46", Outcome.NO_ANSWER),
    ],
)
def test_arithmetic_verifier(text, answer, outcome):
    assert verify(text, answer) is outcome


def test_stream_is_seeded_and_resumable():
    examples = arithmetic.train_examples()[:25]
    a = PromptStream(examples, seed=3)
    first = a.take(40)  # crosses an epoch boundary
    assert len({e.id for e in first[:25]}) == 25  # an epoch is a permutation
    state = a.state_dict()
    rest = a.take(30)
    b = PromptStream(examples, seed=3)
    b.load_state_dict(state)
    assert b.take(30) == rest
    assert PromptStream(examples, seed=4).take(25) != first[:25]


def test_empty_training_set_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        PromptStream([], seed=0)
