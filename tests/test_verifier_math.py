"""rlvr.verifiers.math: answer extraction, equivalence, and robustness on hostile outputs."""

from __future__ import annotations

import time

import pytest

from rlvr.verifiers import Outcome
from rlvr.verifiers.math import EXTRACTORS, extract_answer, is_equivalent, normalize, verify
from rlvr.verifiers.pool import VerifierPool

B = "\\boxed"

# (completion, ground truth, expected is_equivalent)
CASES = [
    # extraction forms
    (f"The answer is {B}{{42}}.", "42", True),
    (f"so {B}{{\\frac{{1}}{{2}}}}", "\\frac{1}{2}", True),
    (f"so {B}{{\\frac{{1}}{{2}}}}", "0.5", True),
    (f"{B}{{\\frac{{\\sqrt{{3}}}}{{2}}}}", "\\frac{\\sqrt3}{2}", True),
    ("\\fbox{7}", "7", True),
    (f"first {B}{{3}}, then corrected: {B}{{4}}", "4", True),
    (f"first {B}{{3}}, then corrected: {B}{{4}}", "3", False),
    (f"Problem: put your answer in {B}{{}} like {B}{{5}}.\nSolution: 2+2 = {B}{{4}}", "4", True),
    (f"Example format: {B}{{10}}\nMy answer: {B}{{12}}", "10", False),
    ("Some work.\nAnswer: 17", "17", True),
    ("Some work.\nanswer: 17", "17", True),
    ("Answer: 3\nWait, recheck.\nFinal Answer: 5", "5", True),
    ("**Final Answer:** $\\frac{3}{4}$", "0.75", True),
    ("Natalia sold 48 clips.\n#### 72", "72", True),
    ("#### 1,000", "1000", True),
    (f"{B}{{\\boxed{{9}}}}", "9", True),
    (f"{B}{{1}} and an unclosed {B}{{2", "1", True),
    # fractions and decimals
    (f"{B}{{\\frac12}}", "0.5", True),
    (f"{B}{{\\dfrac{{1}}{{2}}}}", "1/2", True),
    (f"{B}{{0.50}}", "1/2", True),
    (f"{B}{{1/2}}", "\\frac{1}{2}", True),
    (f"{B}{{0.5}}", "\\frac{1}{3}", False),
    (f"{B}{{1/3}}", "0.333333", True),
    (f"{B}{{3.0}}", "3", True),
    (f"{B}{{\\frac{{6}}{{4}}}}", "\\frac{3}{2}", True),
    (f"{B}{{1.5}}", "\\frac32", True),
    # percentages: the sign is dropped, so 50% is the number 50 (the MATH convention)
    (f"{B}{{50\\%}}", "50", True),
    (f"{B}{{50\\%}}", "50\\%", True),
    (f"{B}{{50}}", "50\\%", True),
    (f"{B}{{50\\%}}", "0.5", False),
    (f"{B}{{50%}}", "50", True),
    # units
    (f"{B}{{5 cm}}", "5", True),
    (f"{B}{{5\\text{{ cm}}}}", "5", True),
    (f"{B}{{12 \\text{{ inches}}}}", "12", True),
    (f"{B}{{42 apples}}", "42", True),
    (f"{B}{{10^\\circ}}", "10", True),
    (f"{B}{{\\$5}}", "5", True),
    (f"{B}{{6 cm}}", "5", False),
    # scientific notation and big numbers
    (f"{B}{{1.2e3}}", "1200", True),
    (f"{B}{{1.2\\times10^3}}", "1200", True),
    (f"{B}{{1.2e3}}", "120", False),
    (f"{B}{{1,000}}", "1000", True),
    (f"{B}{{1{{,}}000}}", "1000", True),
    (f"{B}{{1\\,000}}", "1000", True),
    (f"{B}{{12,345,678}}", "12345678", True),
    (f"{B}{{1,000}}", "1", False),
    # signs
    (f"{B}{{-3}}", "-3", True),
    (f"{B}{{-3}}", "3", False),
    (f"{B}{{7}}", "-7", False),
    (f"{B}{{-\\frac{{1}}{{2}}}}", "-0.5", True),
    # sets, intervals, tuples
    (f"{B}{{[1,2)}}", "[1,2)", True),
    (f"{B}{{(1,2]}}", "[1,2)", False),
    (f"{B}{{\\{{1,2\\}}}}", "\\{2,1\\}", True),
    (f"{B}{{(-\\infty, 3]}}", "(-\\infty,3]", True),
    (f"{B}{{(3,-1)}}", "(3, -1)", True),
    (f"{B}{{(3,1)}}", "(3, -1)", False),
    # expressions and symbols
    (f"{B}{{x^2+2x+1}}", "(x+1)^2", True),
    (f"{B}{{x^2+1}}", "(x+1)^2", False),
    (f"{B}{{2\\sqrt{{2}}}}", "\\sqrt{8}", True),
    (f"{B}{{\\pi r^2}}", "r^2\\pi", True),
    (f"{B}{{x=3}}", "3", True),
    (f"{B}{{\\text{{Monday}}}}", "Monday", True),
    (f"{B}{{\\text{{Tuesday}}}}", "Monday", False),
    # wrong, and no answer at all
    (f"{B}{{2}}", "3", False),
    ("The answer is probably 3", "3", False),
    ("", "3", False),
    (f"{B}{{}}", "3", False),
]


@pytest.mark.parametrize(("completion", "answer", "expected"), CASES)
def test_is_equivalent(completion: str, answer: str, expected: bool) -> None:
    assert is_equivalent(completion, answer) is expected


def test_table_is_large_and_balanced() -> None:
    assert len(CASES) >= 60
    assert 15 <= sum(not e for _, _, e in CASES) <= len(CASES) - 15


def test_extract_answer_forms_and_order() -> None:
    assert extract_answer(f"{B}{{a}} x {B}{{b}}") == "b"
    assert extract_answer(f"{B}{{\\frac{{1}}{{2}}}}") == "\\frac{1}{2}"
    assert extract_answer(f"{B}{{\\{{1,2\\}}}}") == "\\{1,2\\}"
    assert extract_answer(f"{B} {{7}}") == "7"
    assert extract_answer("Answer: 5\n#### 6") == "5"
    assert extract_answer("Answer: 5\n#### 6", extractors=("hashes", "answer_line")) == "6"
    assert extract_answer(f"{B}{{1}}\nAnswer: 2", extractors=("answer_line",)) == "2"
    assert extract_answer("no final answer here") is None
    assert extract_answer("Answer:   \n") is None
    with pytest.raises(ValueError, match="answer_line"):
        extract_answer("x", extractors=("boxed", "last_number"))
    assert set(EXTRACTORS) == {"boxed", "answer_line", "hashes"}


def test_extract_scans_only_the_tail() -> None:
    early = f"{B}{{1}}" + "x" * 30_000
    assert extract_answer(early) is None
    assert extract_answer("x" * 100_000 + f"{B}{{3}}") == "3"


def test_normalize() -> None:
    assert normalize(" $1{,}000$. ") == "1000"
    assert normalize("5\\text{ cm}") == "5"
    assert normalize("\\text{Monday}") == "Monday"
    assert normalize("2.5e-2") == "0.025"
    assert normalize("1,2") == "1,2"  # a list, not a thousands separator


def test_verify_outcomes() -> None:
    assert verify(f"{B}{{4}}", "4") is Outcome.CORRECT
    assert verify(f"{B}{{5}}", "4") is Outcome.INCORRECT
    assert verify("I think it is 4", "4") is Outcome.NO_ANSWER
    assert verify("", "4") is Outcome.NO_ANSWER


def test_plain_extraction_is_linear() -> None:
    start = time.monotonic()
    for text in ["{" * 100_000, f"{B}{{" * 10_000, "Answer:" * 20_000, "#" * 100_000, "1" * 100_000]:
        verify(text, "1")
    assert time.monotonic() - start < 5.0


HOSTILE = [
    "x" * 100_000,
    "x" * 100_000 + f"{B}{{3}}",
    f"{B}{{" + "{" * 10_000 + "3" + "}" * 10_000 + "}",
    "{" * 10_000 + "3",
    f"{B}{{" * 10_000,
    "\ud800",
    f"{B}{{\ud800}}",
    f"Answer: \udfff{B}{{\ud800 + 1}}",
    f"{B}{{9^{{9^{{9^{{9}}}}}}}}",
    f"{B}{{" + "1" * 5_000 + "}",
    f"{B}{{" + "(" * 300 + "1" + ")" * 300 + "}",
    "",
    f"{B}{{}}",
]


def test_hostile_outputs_return_through_the_pool() -> None:
    with VerifierPool("rlvr.verifiers.math:verify", workers=2, timeout_s=2.0) as pool:
        start = time.monotonic()
        results, stats = pool.score([(text, "3") for text in HOSTILE] + [(f"{B}{{3}}", "3")])
        elapsed = time.monotonic() - start
    assert len(results) == len(HOSTILE) + 1
    assert all(r in (Outcome.NO_ANSWER, Outcome.INCORRECT, Outcome.CORRECT) for r in results)
    assert results[-1] is Outcome.CORRECT
    assert results[1] is Outcome.CORRECT  # the answer at the end of a 100k-character output
    assert results[0] is Outcome.NO_ANSWER and results[-3] is Outcome.NO_ANSWER
    assert stats.errors == 0 and stats.timeouts <= 2  # 9^{9^{9^{9}}} may run out its time; nothing else
    assert results[HOSTILE.index(f"{B}{{9^{{9^{{9^{{9}}}}}}}}")] is not Outcome.CORRECT
    assert elapsed < 2.0 * (stats.timeouts + 1) + 10.0  # every timeout costs about timeout_s, no more


def test_format_score():
    from rlvr.verifiers.math import format_score

    assert format_score("so the answer is \\boxed{3}", "4") == 1.0  # the format term ignores correctness
    assert format_score("Answer: 12", "12") == 1.0
    assert format_score("I think it is three", "3") == 0.0
