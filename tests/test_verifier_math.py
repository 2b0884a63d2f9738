"""rlvr.verifiers.math: answer extraction, equivalence, and robustness on hostile outputs."""

from __future__ import annotations

import functools
import pickle
import threading
import time

import pytest

from rlvr.verifiers import Outcome
from rlvr.verifiers import math as math_verifier
from rlvr.verifiers.math import (
    DEFAULT_EXTRACT,
    EXTRACTORS,
    WORK_CALLS,
    extract_answer,
    format_score,
    is_equivalent,
    normalize,
    verify,
)
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
    ("Adding them up.\nThe final answer is 16.", "16", True),
    ("The answer is: 14", "14", True),
    ("so the answer is $\\frac{1}{2}$.", "0.5", True),
    ("So, the final answer is 22", "22", True),
    ("The final answer is 16. I hope it is correct.", "61", False),
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
    assert extract_answer("Answer: 5\n#### 6") == "6"  # "####" is explicit, a plain "Answer:" is not
    assert extract_answer("Answer: 5\n#### 6", extractors=("hashes", "answer_line")) == "6"
    assert extract_answer(f"{B}{{1}}\nAnswer: 2", extractors=("answer_line",)) == "2"
    assert extract_answer("no final answer here") is None
    assert extract_answer("Answer:   \n") is None
    assert set(EXTRACTORS) == {"boxed", "answer_line", "final_answer_phrase", "hashes", "answer_tag", "last_number"}
    assert DEFAULT_EXTRACT == ("boxed", "answer_line", "final_answer_phrase", "hashes")


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
    # the pool's timeout is only a backstop now: each call is bounded in-process (a worker's first sympy call
    # also pays sympy's start-up, hence the slack)
    with VerifierPool("rlvr.verifiers.math:verify", workers=2, timeout_s=5.0) as pool:
        start = time.monotonic()
        results, stats = pool.score([(text, "3") for text in HOSTILE] + [(f"{B}{{3}}", "3")])
        elapsed = time.monotonic() - start
    assert len(results) == len(HOSTILE) + 1
    assert results == [verify(text, "3") for text in HOSTILE] + [Outcome.CORRECT]  # what the function says, in order
    assert results[-1] is Outcome.CORRECT
    assert results[1] is Outcome.CORRECT  # the answer at the end of a 100k-character output
    assert results[0] is Outcome.NO_ANSWER and results[-3] is Outcome.NO_ANSWER
    assert stats.errors == 0 and stats.timeouts == 0  # 9^{9^{9^{9}}} is refused before sympy sees it
    assert results[HOSTILE.index(f"{B}{{9^{{9^{{9^{{9}}}}}}}}")] is not Outcome.CORRECT
    assert elapsed < 15.0


# (extractor, completion, what it extracts)
EXTRACTIONS = [
    ("final_answer_phrase", "The final answer is 16.", "16"),
    ("final_answer_phrase", "The answer is: 14", "14"),
    ("final_answer_phrase", "so the answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("final_answer_phrase", "So, the final answer is 22", "22"),
    ("final_answer_phrase", "Final answer: 7", "7"),
    ("final_answer_phrase", "The final answer is **3.5**.\nDone.", "3.5"),
    ("final_answer_phrase", "The final answer is $16$. I hope it is correct.", "16"),
    ("final_answer_phrase", "The answer is 1, 2, ..., 10.", "1, 2, ..., 10"),
    ("final_answer_phrase", "I thought the answer is 3. Wait: the answer is 4.", "4"),
    ("final_answer_phrase", "The final answer is \\(\\sqrt{2}\\).", "\\sqrt{2}"),
    ("final_answer_phrase", "the answer is $\\boxed{5}$", "5"),
    ("final_answer_phrase", "no answers here", None),
    ("final_answer_phrase", "The answer is", None),
    ("hashes", "Natalia sold 48 clips.\n#### 14", "14"),
    ("answer_tag", "<think>7 + 7</think> <answer>14</answer>", "14"),
    ("answer_tag", "<answer>1</answer> then <answer> 2 </answer>", "2"),
    ("answer_tag", "<answer>unterminated 5", None),
    ("answer_tag", "<answer></answer>", None),
    ("last_number", "...so 5 + 9 = 14", "14"),
    ("last_number", "so 9-3 is the difference", "3"),
    ("last_number", "x = -3.", "-3"),
    ("last_number", "it costs 1,250.50 dollars", "1,250.50"),
    ("last_number", "no digits at all", None),
]


@pytest.mark.parametrize(("name", "completion", "expected"), EXTRACTIONS)
def test_each_extractor(name: str, completion: str, expected: str | None) -> None:
    assert extract_answer(completion, extractors=(name,)) == expected


def test_extractor_order_and_defaults() -> None:
    both = f"The final answer is 16. {B}{{17}}"
    assert extract_answer(both) == "17"  # two explicit statements: the later one
    assert extract_answer(both, extractors=("final_answer_phrase", "boxed")) == "17"  # the order does not change that
    assert extract_answer(both, extractors=("final_answer_phrase",)) == "16"
    assert extract_answer(f"{B}{{17}} The final answer is 16.") == "16"
    assert extract_answer("#### 6\nThe answer is 5") == "6"  # "####" is explicit, "the answer is" plain
    assert extract_answer("The answer is 5\n#### 6") == "6"
    assert extract_answer("#### 6\nThe answer is 5", extractors=("final_answer_phrase",)) == "5"
    assert extract_answer("Answer: 5\nthe answer is 6") == "6"  # two plain ones: the later
    assert extract_answer("Final Answer: 5", extractors=("answer_line", "final_answer_phrase")) == "5"  # same place
    assert extract_answer("no final answer", extractors=("boxed", "last_number")) is None
    assert extract_answer("so 5 + 9 = 14", extractors=("boxed", "last_number")) == "14"  # falls through to the last
    # the lenient extractors are opt-in: by default a text that merely ends in the number has no answer
    assert verify("so 5 + 9 = 14", "14") is Outcome.NO_ANSWER
    assert verify("so 5 + 9 = 14", "14", extract=("last_number",)) is Outcome.CORRECT
    assert verify("<answer>14</answer>", "14") is Outcome.NO_ANSWER
    assert is_equivalent("<answer>\\frac{28}{2}</answer>", "14", extract=("answer_tag",))
    assert format_score("<answer>14</answer>", "14") == 0.0
    assert format_score("<answer>14</answer>", "14", extract=("answer_tag",)) == 1.0


def test_unknown_extractors_are_refused() -> None:
    for bad in (("boxed", "last_line"), (), "boxed"):
        with pytest.raises(ValueError, match="answer_line, final_answer_phrase, hashes, answer_tag, last_number"):
            extract_answer("Answer: 3", extractors=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="last_line"):
        verify("Answer: 3", "3", extract=("last_line",))


def test_verify_with_extractors_pickles() -> None:
    """The trainer sends functools.partial(verify, extract=...) to spawn worker processes."""
    fn = pickle.loads(pickle.dumps(functools.partial(verify, extract=("answer_tag", "last_number"))))
    assert fn("<answer>7</answer> and 8", "7") is Outcome.CORRECT
    assert fn("no tag, just 8", "8") is Outcome.CORRECT


def _long(unit: str, head: str = "", tail: str = "") -> str:
    """head + unit repeated + tail, at least 100,000 characters."""
    return head + unit * -(-(100_000 - len(head) - len(tail)) // len(unit)) + tail


# Per extractor: 100,000-character inputs built to make a backtracking pattern go quadratic.
HOSTILE_EXTRACTION = {
    "boxed": [_long(f"{B}{{"), _long("{"), _long("}"), _long(B), _long("\\{")],
    "answer_line": [_long(" ", "answer"), _long("answer *"), _long("Answer:"), _long("answer")],
    "final_answer_phrase": [
        _long(" \t", "answer"),
        _long("answer is "),
        _long("1.", "the answer is "),
        _long(".", "the answer is "),
        _long("*", "answer"),
        _long("$*", "The answer is: "),
        _long(" ", "The answer is:"),
        _long(" \n", "Final Answer:"),
        _long(" ", "answer", "is"),
    ],
    "hashes": [_long("#"), _long(" ", "####"), _long("#### 1")],
    "answer_tag": [_long("<answer>"), _long("</answer>"), _long("<answer", tail="</answer>")],
    "last_number": [_long("1"), _long("1,"), _long("-1"), _long("1.1."), _long("1,000"), _long(",000"), _long("a1")],
}


@pytest.mark.parametrize("name", EXTRACTORS)
def test_extractors_are_linear_on_hostile_input(name: str) -> None:
    texts = HOSTILE_EXTRACTION[name]
    assert all(len(t) >= 100_000 for t in texts)
    for text in texts:
        start = time.monotonic()
        extract_answer(text, extractors=(name,))
        # a linear scan of the 20,000-character window takes about a millisecond; a quadratic one, seconds
        assert time.monotonic() - start < 0.5, (name, text[:30])


# Answers whose evaluation would not finish (or would exhaust memory) if sympy saw them: refused by the guard,
# which reads an estimate of the digits they could evaluate to from the text, in well under a millisecond.
REFUSED = [
    "(x+1)^{1000}",
    "\\sin(x)^{100}+\\cos(x)^{100}",
    "9^{9^{9^{9}}}",
    "9^9^9",
    "9^{9^9}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2}}}}",
    "9**9**9**9",
    "9^{99999999}",
    "\\left(9\\right)^{\\left(9^{9}\\right)}",
    "e^{10^{10}}",
    "\\exp(10^{10})",
    "\\sin(10^{10^{5}})",
    "99999999!",
    "(10^6)!",
    "((5!)!)!",
    "\\Gamma(10^{10})",
    "\\binom{10^9}{5*10^8}",
    "{99999 \\choose 50000}",
    "\\sum_{i=1}^{10^9} i^{i}",
    "\\prod_{i=1}^{10^9} i",
    "\\gcd(10^{10^{10}}, 6)",
    "\\sqrt[10^{10^{10}}]{2}",
    "1e99999",
    "\\operatorname{zeros}(99999, 99999)",
    "x^{x^{x}}|_{x=9}",
    "9" * 400 + "^{99}",
    "(" * 300,
    "\\sqrt{" * 60 + "2" + "}" * 60,
    "x^x^x^x^x^x^x^x^x^x",
]
# Answers the guard lets through but sympy works on slowly (or parses slowly): stopped by the work budget.
SLOW = ["(x+1)^{1000}", "\\sum_{i=1}^{10^9} i", "a" * 450, "1+" * 240 + "1"]
# Answers longer than MAX_ANSWER_CHARS: compared as strings only.
LONG = ["9" * 5_000, "(" * 100_000, "\\frac{1}{" * 1_000 + "2" + "}" * 1_000]


def test_dangerous_answers_are_refused_before_sympy() -> None:
    assert all(math_verifier._refused(normalize(answer)) for answer in REFUSED)


def test_adversarial_answers_return_from_a_thread() -> None:
    """The bound holds in the calling process, off the main thread (where SIGALRM cannot help): refused and long
    answers are compared as strings, slow ones stop at the work budget and come back TIMEOUT, not INCORRECT."""
    adversarial = REFUSED + SLOW + LONG
    assert len(adversarial) >= 15
    for answer in adversarial:
        for completion, gold in ((f"{B}{{{answer}}}", "1"), (f"{B}{{1}}", answer)):  # the guard reads both sides
            outcome: list[Outcome] = []
            worker = threading.Thread(target=lambda c=completion, g=gold, o=outcome: o.append(verify(c, g)), daemon=True)
            worker.start()
            # REFUSED and LONG answers return in about a millisecond, SLOW ones once they have made WORK_CALLS Python
            # calls (about a second on these machines); 60 s only catches a bound that does not hold at all
            worker.join(timeout=60.0)
            assert not worker.is_alive() and outcome, f"{answer[:40]!r} did not return"
            if answer in REFUSED + LONG:  # never reached sympy (a 100,000-character one is past the scanned tail)
                assert outcome[0] in (Outcome.INCORRECT, Outcome.NO_ANSWER), answer[:40]
            else:
                assert outcome[0] in (Outcome.INCORRECT, Outcome.TIMEOUT), (answer[:40], outcome)
    assert verify(f"{B}{{\\sin(x)^{{20}}\\cos(x)^{{20}}}}", "1") is Outcome.TIMEOUT  # its expansion outruns the budget
    assert verify(f"{B}{{(x+1)^{{1000}}}}", "1") is Outcome.INCORRECT  # a symbolic power over 30: refused, a string
    # sympy still works after being interrupted
    assert verify(f"{B}{{x^2+2x+1}}", "(x+1)^2") is Outcome.CORRECT
    assert verify(f"{B}{{2^{{10}}}}", "1024") is Outcome.CORRECT


def test_the_budget_stops_a_comparison_and_its_verdict_is_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A true equivalence that needs sympy: with a budget too small for it, the comparison stops and says TIMEOUT (not
    INCORRECT); with the real budget it is CORRECT. (A tracer that never raises fails the first; a budget that is
    not counted per pair, or a timeout read as "not equal", fails one of them.)"""
    pair = (f"{B}{{(x+2)^2}}", "x^2+4x+4")
    math_verifier._warmed()  # the one-off start-up work is not counted
    for cache in (math_verifier._equivalent_normalized, math_verifier._parse):
        cache.cache_clear()
    monkeypatch.setattr(math_verifier, "WORK_CALLS", 1_000)
    assert verify(*pair) is Outcome.TIMEOUT
    for cache in (math_verifier._equivalent_normalized, math_verifier._parse):
        cache.cache_clear()
    monkeypatch.setattr(math_verifier, "WORK_CALLS", WORK_CALLS)
    assert verify(*pair) is Outcome.CORRECT


def test_guards_keep_ordinary_math() -> None:
    """The guard refuses nothing an answer is likely to be: these still go through math_verify."""
    for pred, gold in [
        ("2^{10}", "1024"),
        ("\\frac{1}{2}", "0.5"),
        ("\\sqrt{2}", "2^{1/2}"),
        ("2^{2^{2^{2}}}", "65536"),
        ("10!", "3628800"),
        ("\\binom{5}{2}", "10"),
        ("{5 \\choose 2}", "10"),
        ("\\sum_{i=1}^{100} i", "5050"),
        ("\\prod_{k=1}^{5} k", "120"),
        ("e^{-x^2}", "e^{-x^{2}}"),
        ("x^{2024}", "x^{2024}"),
        ("\\frac{100!}{98!}", "9900"),
        ("2^{2023} - 2^{2023}", "0"),
        ("\\left(\\frac{3}{2}\\right)^{2}", "2.25"),
    ]:
        assert is_equivalent(f"{B}{{{pred}}}", gold), (pred, gold)


def test_format_score():
    from rlvr.verifiers.math import format_score

    assert format_score("so the answer is \\boxed{3}", "4") == 1.0  # the format term ignores correctness
    assert format_score("Answer: 12", "12") == 1.0
    assert format_score("I think it is three", "3") == 0.0
