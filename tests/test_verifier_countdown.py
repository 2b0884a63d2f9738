"""rlvr.verifiers.countdown: exact, ast-restricted checking of countdown expressions."""

from __future__ import annotations

import re
import time

import pytest

from rlvr.verifiers import Outcome
from rlvr.verifiers.countdown import (
    MAX_DEPTH,
    MAX_EXPR_CHARS,
    extract_expression,
    parse_answer,
    score_expression,
    verify,
)

ANSWER = "target=24;numbers=3,5,7,1"


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("<answer>(5 + 7) * (3 - 1)</answer>", ANSWER),
        ("<answer>(5 + 7) * (3 - 1) = 24</answer>", ANSWER),
        ("Let me think.\n(5+7)*(3-1) = 24", ANSWER),
        ("Let me think.\n(5+7)*(3-1) = 24.\nDone!", ANSWER),
        ("Try 3*5 = 15, no.\n<answer>3 * (7 + 1)</answer>", ANSWER),  # unused numbers are allowed
        ("<answer>$(5+7)\\times(3-1)$</answer>", ANSWER),
        ("<answer>(5+7) × (3-1)</answer>", ANSWER),
        ("<answer>8 / (3 - 8 / 3)</answer>", "target=24;numbers=3,3,8,8"),  # exact: 8 / (1/3), no float error
        ("<answer>6 * 4</answer>", "numbers = 4, 6 ; target = 24"),
        ("<answer>1 - 5</answer>", "target=-4;numbers=1,5"),
    ],
)
def test_correct(completion: str, answer: str) -> None:
    assert verify(completion, answer) is Outcome.CORRECT


@pytest.mark.parametrize(
    ("completion", "why"),
    [
        ("<answer>(5 + 7) * 3 - 1</answer>", "wrong value (35)"),
        ("<answer>(5 + 7) * (3 - 1) = 25</answer>", "claims a value other than the target"),
        ("<answer>5 * 5 - 1</answer>", "5 used twice"),
        ("<answer>(5 + 7) * 2</answer>", "2 is not given"),
        ("<answer>4 * 6</answer>", "4 and 6 are not given"),
        ("<answer>__import__('os').system('true')</answer>", "call"),
        ("<answer>2**10</answer>", "power"),
        ("<answer>x * 24</answer>", "name"),
        ("<answer>abs(24)</answer>", "call"),
        ("<answer>(5 + 7) // 1 * 2</answer>", "floor division"),
        ("<answer>-(1 - 7) * (3 + 1)</answer>", "unary minus"),
        ("<answer>+(5 + 7) * (3 - 1)</answer>", "unary plus"),
        ("<answer>0x18</answer>", "hex literal"),
        ("<answer>24.0</answer>", "float literal"),
        ("<answer>7 / (5 - 5)</answer>", "division by zero (and 5 reused)"),
        ("<answer>7 / (3 - 1 - 2)</answer>", "division by zero"),
        ("<answer>" + "(" * 150 + "1" + ")" * 150 + "</answer>", "too long"),
        ("<answer>" + "1+" * 120 + "1</answer>", "too long"),
        ("<answer>" + "(" * 90 + "3" + ")" * 90 + "</answer>", "parentheses only: the value is 3"),
        ("<answer>= 24</answer>", "a claim without an expression"),
        ("<answer>(5 + 7) * (3 - 1</answer>", "syntax error"),
        ("<answer>5 7 3 1</answer>", "no operator"),
    ],
)
def test_not_correct(completion: str, why: str) -> None:
    assert verify(completion, ANSWER) is not Outcome.CORRECT, why


def test_no_expression_is_no_answer() -> None:
    assert verify("I give up.", ANSWER) is Outcome.NO_ANSWER
    assert verify("", ANSWER) is Outcome.NO_ANSWER
    assert verify("<answer></answer>", ANSWER) is Outcome.NO_ANSWER
    assert verify("\ud800", ANSWER) is Outcome.NO_ANSWER


def test_extract_expression() -> None:
    assert extract_expression("<answer>1+2</answer> then <answer>3*4 = 12</answer>") == "3*4 = 12"
    assert extract_expression("first 1+1\nthen (3+5)*3 = 24.") == "(3+5)*3 = 24"
    assert extract_expression("<answer>unterminated 1+2") == "1+2"
    assert extract_expression("just 42") is None


def test_score_expression_bounds() -> None:
    assert score_expression("(5+7)*(3-1)", 24, [3, 5, 7, 1])
    assert not score_expression("1" * (MAX_EXPR_CHARS + 1), 24, [3, 5, 7, 1])
    assert not score_expression("3 * 8", 24, [3])
    assert score_expression("3 * 8 = 24", 24, [3, 8])
    assert not score_expression("3 * 8 = 25", 24, [3, 8])
    nested = "(" * 40 + "1" + "+1)" * 40  # 161 characters, 40 levels of BinOp
    assert score_expression(nested.replace("(" * 40, "(" * 10).replace("+1)" * 40, "+1)" * 10), 11, [1] * 11)
    assert not score_expression(nested, 41, [1] * 41)  # deeper than MAX_DEPTH


def test_malformed_ground_truth_raises() -> None:
    assert parse_answer("target=24;numbers=3,5,7,1") == (24, [3, 5, 7, 1])
    assert parse_answer("target=-4;numbers=1,5,") == (-4, [1, 5])  # a trailing comma is no number
    for bad, problem in [
        ("24", "expected 'target=T;numbers=a,b,...'"),
        ("target=24", "needs exactly the keys 'target' and 'numbers'"),
        ("target=24;numbers=3;extra=1", "needs exactly the keys"),
        ("target=x;numbers=1", "must be integers"),
        ("target==24;numbers=1", "must be integers"),  # split at the first '=': the key is 'target', its value '=24'
        ("target=24;numbers=1,2=3", "must be integers"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"countdown answer {bad!r}: ") + ".*" + re.escape(problem)):
            parse_answer(bad)


def test_the_answer_tag_wins_over_expressions_after_it() -> None:
    assert extract_expression("<answer>3 * 8</answer> and then 1+1") == "3 * 8"  # the tag at position 0 counts
    assert extract_expression("so <answer>3 * 8</answer> and then 1+1") == "3 * 8"
    # the last complete block: an opening tag after the last closing one does not start a new block
    assert extract_expression("<answer>1+2</answer> and <answer>3*4") == "1+2"


def test_an_answer_block_is_an_answer_unless_it_holds_only_a_claim_sign() -> None:
    assert extract_expression("<answer> = </answer>") is None
    assert verify("<answer> = </answer>", ANSWER) is Outcome.NO_ANSWER
    assert extract_expression("<answer>X</answer>") == "X"
    assert verify("<answer>X</answer>", ANSWER) is Outcome.INCORRECT  # an answer, wrong: not a missing one


def test_expression_length_limit_is_inclusive() -> None:
    exact = "3 * 8" + " " * (MAX_EXPR_CHARS - 5)
    assert len(exact) == MAX_EXPR_CHARS and score_expression(exact, 24, [3, 8])
    assert not score_expression(exact + " ", 24, [3, 8])


@pytest.mark.parametrize("side", ["left", "right"])
def test_depth_limit_counts_every_level_from_the_root(side: str) -> None:
    """The root BinOp is at depth 0; a chain of k operators puts its innermost literal at depth k, allowed up to
    MAX_DEPTH on either side of the tree."""

    def chain(k: int) -> str:
        return "1+" * k + "1" if side == "left" else "1+(" * k + "1" + ")" * k

    assert score_expression(chain(MAX_DEPTH), MAX_DEPTH + 1, [1] * (MAX_DEPTH + 1))
    assert not score_expression(chain(MAX_DEPTH + 1), MAX_DEPTH + 2, [1] * (MAX_DEPTH + 2))


def test_long_hostile_outputs_are_fast() -> None:
    start = time.monotonic()
    for text in ["1+" * 50_000, "<answer>" * 20_000, "(" * 100_000, "9" * 100_000 + "*9"]:
        assert verify(text, ANSWER) is not Outcome.CORRECT
    assert time.monotonic() - start < 5.0
