"""The math verifier's extraction, normalization and exact comparison, and the arithmetic verifier: the behaviours the
mutation run (mutmut 3.8.1 over the pure core, issue 26) found untested, asserted on the functions' own outputs."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from rlvr.verifiers import Outcome, arithmetic
from rlvr.verifiers import math as math_verifier
from rlvr.verifiers.math import MAX_ANSWER_CHARS, _as_fraction, extract_answer, is_equivalent, normalize

B = "\\boxed"


def one(name: str, text: str) -> str | None:
    return extract_answer(text, extractors=(name,))


# ---------------------------------------------------------------- extraction


def test_a_brace_is_a_box_only_after_a_box_command() -> None:
    assert one("boxed", "{5}") is None
    assert one("boxed", "{{5}}") is None
    assert one("boxed", f"{B}{{1}} and {{{{5}}}}") == "1"


def test_nested_boxes_unwrap_three_levels() -> None:
    assert extract_answer(f"{B}{{{B}{{{B}{{{B}{{{B}{{9}}}}}}}}}}") == f"{B}{{9}}"  # 5 boxes: the outer + 3 unwrapped


def test_answer_line_keeps_letters_around_the_stars() -> None:
    assert one("answer_line", "Answer: **X**") == "X"


def test_phrase_ends_at_its_own_line() -> None:
    assert one("final_answer_phrase", "The answer is 5\nmore text\nand more") == "5"


def test_phrase_unwrapping() -> None:
    assert one("final_answer_phrase", "The answer is X.") == "X"
    assert one("final_answer_phrase", "The answer is **$X$**.") == "X"
    assert one("final_answer_phrase", "The answer is \\[5\\]") == "5"
    assert one("final_answer_phrase", "The answer is \\(5") == "\\(5"  # unbalanced: kept as written
    # three rounds of unwrapping, not more
    assert one("final_answer_phrase", "The answer is \\(\\(\\(\\(5\\)\\)\\)\\)") == "\\(5\\)"


def test_answer_tag_is_the_last_closed_one() -> None:
    assert one("answer_tag", "<answer>1</answer> then <answer>2") == "1"


def test_extractor_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"^no answer extractors in 'boxed';"):
        extract_answer("x", extractors="boxed")  # a string, not a tuple of names
    with pytest.raises(ValueError, match=r"^no answer extractors in \(\);"):
        extract_answer("x", extractors=())
    with pytest.raises(ValueError, match=r"^unknown answer extractor\(s\) \['nope'\];"):
        extract_answer("x", extractors=("boxed", "nope"))


# ---------------------------------------------------------------- normalization


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("\\left(1,2\\right)", "(1,2)"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("\\displaystyle 5", "5"),
        ("50\\%", "50"),
        ("50%", "50"),
        ("1\\!000", "1000"),
        ("X.", "X"),
        ("1.2e3", "1200"),
    ],
)
def test_normalize_spellings(answer: str, expected: str) -> None:
    assert normalize(answer) == expected


def test_normalize_works_on_answers_of_exactly_the_length_limit() -> None:
    answer = "$" + "1" * (MAX_ANSWER_CHARS - 2) + "$"
    assert len(answer) == MAX_ANSWER_CHARS
    assert normalize(answer) == "1" * (MAX_ANSWER_CHARS - 2)
    longer = "$" + answer + "$"
    assert normalize(longer) == longer  # over the limit: verbatim


# ---------------------------------------------------------------- comparison


def test_negative_latex_fraction_is_exact() -> None:
    assert _as_fraction("-\\frac{1}{2}") == Fraction(-1, 2)
    assert _as_fraction("\\frac{-1}{2}") == Fraction(-1, 2)
    assert _as_fraction("3/4") == Fraction(3, 4)


def test_an_unparseable_side_is_not_equivalent() -> None:
    assert is_equivalent(f"{B}{{?}}", "!") is False


def _equal(pred: str, gold: str) -> bool:
    return math_verifier._equivalent_normalized(pred, gold) is Outcome.CORRECT


def test_sympy_comparison_works_off_the_main_thread() -> None:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(is_equivalent(f"{B}{{(y+2)^2}}", "y^2+4y+4")))
    thread.start()
    thread.join()
    assert result == [True]


def test_an_empty_side_is_never_equal() -> None:
    equal = _equal
    assert (equal("", "5"), equal("5", ""), equal("", "")) == (False, False, False)


def test_strict_comparison_ignores_spaces_on_both_sides() -> None:
    """'@1' is nothing math_verify can parse, so only the strict comparison can find these equal."""
    equal = _equal
    assert equal("@ 1", "@1") and equal("@1", "@ 1")
    assert not equal("@1", "@2")


def test_answers_up_to_the_length_limit_are_compared_as_numbers_longer_ones_as_strings() -> None:
    equal = _equal
    at_limit = "1." + "0" * (MAX_ANSWER_CHARS - 2)
    assert len(at_limit) == MAX_ANSWER_CHARS
    assert equal(at_limit, "1") and equal("1", at_limit)
    over = at_limit + "0"
    assert not equal(over, "1") and not equal("1", over)


def test_a_number_against_an_expression_goes_to_sympy() -> None:
    assert _equal("2", "\\sqrt{4}")
    assert _equal("\\sqrt{4}", "2")


def test_a_refused_side_is_compared_as_a_string_only() -> None:
    """sympy would evaluate the substitution x|_{x=3} to 3; the refusal rule (a substitution is evaluated while
    parsing) keeps it from sympy, so only the strict comparison counts, on either side."""
    math_verifier._warmed()
    assert math_verifier._sympy_equivalent("x|_{x=3}", "3") is Outcome.CORRECT  # what sympy would have said
    equal = _equal
    assert not equal("x|_{x=3}", "3") and not equal("3", "x|_{x=3}")
    assert equal("x|_{x=3}", "x|_{x=3}")


# ---------------------------------------------------------------- arithmetic verifier


def test_arithmetic_verifier() -> None:
    assert arithmetic.extract(" -12\n") == "-12"
    assert arithmetic.extract("12 apples") is None
    assert arithmetic.verify(" 12 ", "12") is Outcome.CORRECT
    assert arithmetic.verify("13", "12") is Outcome.INCORRECT
    assert arithmetic.verify("twelve", "12") is Outcome.NO_ANSWER
    assert arithmetic.verify("012", "12") is Outcome.CORRECT  # compared as integers
