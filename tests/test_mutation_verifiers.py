"""The answer extraction, the math verifier's normalization, comparison and gold check, the arithmetic and countdown
gold checks and the code verifier's test record: the behaviours the mutation runs (mutmut 3.8.1 over the pure core,
issues 26 and 43) found untested, asserted on the functions' own outputs."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from rlvr.verifiers import Outcome, arithmetic, countdown
from rlvr.verifiers import math as math_verifier
from rlvr.verifiers.code import record as code_record
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


def test_arithmetic_gold_is_checked_as_its_own_completion() -> None:
    assert arithmetic.check_gold("-7") is Outcome.CORRECT
    assert arithmetic.check_gold("046") is Outcome.CORRECT
    assert arithmetic.check_gold("4.5") is Outcome.NO_ANSWER


# ---------------------------------------------------------------- countdown and code record golds


def test_countdown_gold_is_correct_when_readable() -> None:
    assert countdown.check_gold("target=24;numbers=3,5,7,1") is Outcome.CORRECT
    assert countdown.check_gold("target=abc;numbers=1,2") is Outcome.NO_ANSWER


def test_code_record_parse_reads_json_then_validates() -> None:
    record = {"tests": [{"assert": "assert f(1) == 2"}], "setup": "import math"}
    assert code_record.parse(code_record.encode(record)) == record
    with pytest.raises(ValueError, match=r"^the code test record is not JSON: Expecting value: line 1 column 1"):
        code_record.parse("not json")
    with pytest.raises(ValueError, match=r"^a record must be an object, got list \[\]$"):
        code_record.parse("[]")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"tests": [5]}, "test 0 must be an object, got int 5"),
        ({"tests": [{"call": 5, "args": [], "expected": 1}]}, "test 0's call must be a function name, got int 5"),
        ({"tests": [{"assert": ""}]}, "test 0's assert must be non-empty Python code, got str ''"),
        (
            {"tests": [{"check": "def check(:", "entry_point": "f"}]},
            "test 0's check is not valid Python (invalid syntax, line 1)",
        ),
        ({"tests": [{"assert": "assert ("}]}, "test 0's assert is not valid Python ('(' was never closed, line 1)"),
        # a lone surrogate (JSON's "\ud800" reads as one) cannot be encoded to parse: a ValueError with no msg or line
        (
            {"tests": [{"assert": 'assert "\ud800"'}]},
            "test 0's assert is not valid Python ('utf-8' codec can't encode character '\\ud800' in position 8: "
            "surrogates not allowed)",
        ),
        # a null byte: a SyntaxError without a line on Python 3.11 (no "line None")
        ({"tests": [{"assert": "assert 1\x00"}]}, "test 0's assert is not valid Python (source code string cannot contain null bytes)"),
        (
            {"tests": [{"assert": "assert 1"}], "x": 1},
            "the record has unknown key 'x'; its keys are tests, setup, solution, float_tol",
        ),
        ({"tests": []}, "the record's tests must be a non-empty list, got list []"),
        (
            {"tests": [{"assert": "assert 1"}], "float_tol": -1},
            "the record's float_tol must be a finite number >= 0, got int -1",
        ),
        ({"tests": [{"stdin": 1, "stdout": "3"}]}, "test 0's stdin must be a string, got int 1"),
        ({"tests": [{"call": "f", "args": 5, "expected": 1}]}, "test 0's args must be a list of arguments, got int 5"),
        (
            {"tests": [{"call": "f", "args": [], "expected": {"a": float("nan")}}]},
            "test 0's expected is not plain JSON (finite numbers, strings, lists, objects with string keys)",
        ),
    ],
)
def test_code_record_errors_name_the_test_the_field_and_the_value(record: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        code_record.validate(record)
    assert str(err.value) == message


def test_code_record_shows_values_up_to_sixty_characters_of_repr() -> None:
    assert code_record.show("x" * 58) == "str '" + "x" * 58 + "'"  # a repr of 60 characters, whole
    assert code_record.show("x" * 59) == "str '" + "x" * 56 + "..."  # 61: cut to 57 and "..."


# ---------------------------------------------------------------- math gold check and extraction ties


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        ("#### 72", Outcome.NO_ANSWER),  # a GSM8K solution's tail, not reduced to its answer
        ("3\n4", Outcome.NO_ANSWER),  # several lines
        ("Is x > 1?", Outcome.NO_ANSWER),  # a question, however short
        ("1" * MAX_ANSWER_CHARS, Outcome.CORRECT),  # the length limit is inclusive
        ("1" * (MAX_ANSWER_CHARS + 1), Outcome.NO_ANSWER),
        ("\\text{two hundred and five}", Outcome.CORRECT),  # MAX_GOLD_WORDS = 4 words are still an answer
        ("\\text{two hundred and fifty five}", Outcome.NO_ANSWER),  # 5 are prose
    ],
)
def test_math_gold_check_limits(gold: str, expected: Outcome) -> None:
    assert math_verifier.check_gold(gold) is expected


def test_an_answer_tag_and_a_box_are_ordered_by_position() -> None:
    """Both explicit: the one that comes last wins, whichever extractor is listed first."""
    for extractors in (("boxed", "answer_tag"), ("answer_tag", "boxed")):
        assert extract_answer(f"{B}{{1}} then <answer>2</answer>", extractors=extractors) == "2"
        assert extract_answer(f"<answer>2</answer> then {B}{{1}}", extractors=extractors) == "1"
    for extractors in (("boxed", "hashes"), ("hashes", "boxed")):
        assert extract_answer(f"{B}{{1}}\n#### 2", extractors=extractors) == "2"


def test_code_record_encode_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError, match="^Out of range float values are not JSON compliant"):
        code_record.encode({"tests": [{"assert": "assert 1"}], "float_tol": float("nan")})


def test_code_record_describe_counts_checks_and_names_one_called_function() -> None:
    check = {"check": "def check(candidate):\n    assert candidate(1)\n", "entry_point": "f"}
    assert code_record.describe({"tests": [check, {**check, "entry_point": "g"}]}) == "2 checks"
    call = {"call": "f", "args": [], "expected": 1}
    assert code_record.describe({"tests": [call]}) == "1 call of f"
    assert code_record.describe({"tests": [call, {**call, "call": "g"}]}) == "2 calls"  # of two functions: none named


# ---------------------------------------------------------------- what reads as a statement of the answer


def test_a_final_answer_that_points_elsewhere_or_runs_on_is_only_plain() -> None:
    """An explicit "Final Answer:" that is a pointer word (punctuation aside) or three words without math does not
    beat an earlier box; two words ("no solution"), or a word that only contains a pointer word, do."""
    box = f"{B}{{5}}\nFinal Answer: "
    assert extract_answer(box + "above!") == "5"
    assert extract_answer(box + "one two three") == "5"
    assert extract_answer(box + "no solution") == "no solution"
    assert extract_answer(box + "Xabove") == "Xabove"


def test_a_hashes_heading_is_no_answer() -> None:
    assert one("hashes", "#### Xylophones") is None  # a Markdown heading: no digit, no math character
    assert one("hashes", "#### x = 5") == "x = 5"
    assert one("hashes", "#### **72**") == "72"  # bold stripped
    assert one("hashes", "#### X = 5") == "X = 5"  # only the stars: letters stay


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        ("The value of $y$is 5.", "5"),  # "is" right after the math is outside it
        ("The area $A is \\pi r^2$ is 12.", "12"),  # an "is" inside math is skipped, not the end of the search
        ("5, so $y$ is 3.", "5"),  # a value, then "so": what follows derives from the answer
        ("The largest $n$ is $34$, as required.", "34"),  # a hedge word after the "is" does not count
        ("The largest $n$ is 34, so we are done.", "34"),  # nor does a "so" after it
    ],
)
def test_a_final_answer_sentence_gives_what_its_subject_is(line: str, answer: str) -> None:
    assert one("answer_line", f"Final Answer: {line}") == answer


def test_display_math_after_the_phrase_is_taken_whole() -> None:
    """Display math is the answer as written, not a sentence whose subject "is" something."""
    assert one("final_answer_phrase", "The answer is:\n$$2x is \\frac{1}{2}$$") == "2x is \\frac{1}{2}"


def test_math_after_up_to_four_words_is_the_answer() -> None:
    assert one("final_answer_phrase", "The answer is thus exactly equal to $12$.") == "12"
    # five words before it: prose that holds math, not a statement of the math
    assert one("final_answer_phrase", "The answer is the area of the triangle $T$.").startswith(
        "the area of the triangle"
    )


def test_after_the_answer_is_the_answer_is_not_read_as_a_sentence() -> None:
    """What follows "the answer is" is the answer; only a whole sentence (after "Final Answer:") has a subject."""
    assert one("final_answer_phrase", "The answer is $x^2$ when $x$ is 4.") == "x^2"


def test_bold_math_is_unwrapped_whole_and_a_lead_in_word_leaves_the_math() -> None:
    """Bold around the statement is decoration: "**\\(x\\) = 5**" is the equation, "**$\\$18.90$**" the amount, not
    the first math span alone; a word before the math (even a one-letter one) makes the math the answer."""
    assert one("answer_line", "Final Answer: **\\(x\\) = 5**") == "\\(x\\) = 5"
    assert one("final_answer_phrase", "The answer is **$\\$18.90$**.") == "\\$18.90"
    assert one("final_answer_phrase", "The answer is X $5$.") == "5"


@pytest.mark.parametrize(
    "text",
    [
        "**The answer is:**\n\\[ x = 5 \\]",  # bold markers left on the phrase's line
        "The answer is $$\nx = 5\n$$",  # the display opens on the phrase's line
        "The answer is \\[\nx = 5\n\\]",
    ],
)
def test_a_display_after_the_phrase_is_the_answer(text: str) -> None:
    assert one("final_answer_phrase", text) == "x = 5"


def test_the_work_budget_counts_both_parses_then_leaves_the_rest_to_the_comparison(monkeypatch) -> None:
    """WORK_CALLS bounds one pair: the gold's and the prediction's parse, then the comparison gets what is left; with
    nothing left the pair is a TIMEOUT before anything else (an unparsed side included)."""
    math_verifier._warmed()
    math_verifier._parse.cache_clear()
    gold_calls = math_verifier._parse("x^2+1")[1]  # ([x**2 + 1, "x^2+1"], calls); "!" parses to ["!"]: strings only
    for left, pred, expected in (
        (0, "x^2+1", Outcome.TIMEOUT),
        (1, "x^2+1", Outcome.TIMEOUT),  # the comparison takes more than one call
        (10_000, "x^2+1", Outcome.CORRECT),  # it takes ~20
        (0, "!", Outcome.TIMEOUT),
        (1, "!", Outcome.INCORRECT),  # an unparsed side: no comparison, so one call left is enough
    ):
        calls = gold_calls + math_verifier._parse(pred)[1]
        monkeypatch.setattr(math_verifier, "WORK_CALLS", calls + left)
        assert math_verifier._sympy_equivalent(pred, "x^2+1") is expected, (left, pred)


def test_a_set_lists_its_elements_and_a_set_expression_is_one_answer() -> None:
    assert math_verifier._items("\\{1, 2, 3\\}") == 3
    assert math_verifier._items("(1, 2), 3") == 2
    assert math_verifier._items("\\{1,2\\}^c") == 1  # the complement of a set: its braces do not wrap the whole answer
    assert math_verifier._items("((1, 2), 3), 4") == 2  # commas count at the top level only, at any nesting depth
    assert math_verifier._items("((1, 2), 3)") == 1
    assert math_verifier._items("\\{(1, 2), (3, 4)\\}") == 2
    assert math_verifier._items("\\{1, 2,\\}") == 3  # top-level commas + 1, a trailing one too


def test_boxes_apart_count_only_when_a_box_is_the_answer() -> None:
    """The gold lists two answers; boxed one by one they are read together, but a later "Final Answer:" line that
    states one of them is the answer, and it is incomplete."""
    boxed_apart = f"First {B}{{1}}. Then we get {B}{{2}}."
    assert math_verifier.verify(boxed_apart, "1, 2") is Outcome.CORRECT
    assert math_verifier.verify(boxed_apart + "\nFinal Answer: 1", "1, 2") is Outcome.INCORRECT


def test_final_is_looked_for_in_the_twelve_characters_before_answer() -> None:
    lines = ("boxed", "answer_line")
    assert extract_answer(f"{B}{{1}}\nFinal{'_' * 7}Answer: 2", extractors=lines) == "2"  # explicit: beats the box
    assert extract_answer(f"{B}{{1}}\nFinal{'_' * 8}Answer: 2", extractors=lines) == "1"  # plain: the box wins


def test_an_answer_line_that_holds_the_phrase_reads_the_phrase() -> None:
    assert one("answer_line", "Final Answer: x is 3, so the answer is 6.") == "6"


def test_a_final_answer_heading_is_explicit_and_ordered_by_position() -> None:
    assert extract_answer(f"{B}{{1}}\n### Final Answer\n2") == "2"
    assert extract_answer(f"### Final Answer\n2\n\n{B}{{1}}") == "1"


def test_boxes_are_one_answer_up_to_forty_separator_characters_apart() -> None:
    assert one("boxed", f"{B}{{1}}{' ' * 40}{B}{{2}}") == "1, 2"
    assert one("boxed", f"{B}{{1}}{' ' * 41}{B}{{2}}") == "2"
    assert one("boxed", f"{B}{{1}}x{B}{{2}}") == "2"  # one character that is no separator parts them


def test_a_brace_after_other_text_is_not_the_box_argument() -> None:
    assert one("boxed", "\\boxed x {5}") is None


def test_within_an_answer_line_the_later_statement_counts() -> None:
    assert one("answer_line", "Final Answer: The final answer is 5. No wait, the answer is 6.") == "6"


def test_unwrapping_never_empties_a_found_box() -> None:
    """A box inside the found box is unwrapped only to something: an empty inner box leaves the content as written."""
    assert extract_answer(f"{B}{{{B}{{}}}}") == f"{B}{{}}"


def test_at_the_same_place_the_extractor_listed_first_wins() -> None:
    """ "Answer:" starts both an answer line (read as a sentence: 34) and a phrase (read as stated: n), both plain."""
    text = "Answer: The largest $n$ is 34"
    assert extract_answer(text, extractors=("answer_line", "final_answer_phrase")) == "34"
    assert extract_answer(text, extractors=("final_answer_phrase", "answer_line")) == "n"


def test_only_a_found_value_that_is_a_box_is_unwrapped() -> None:
    assert one("answer_line", "Answer: x = \\boxed{5}") == "x = \\boxed{5}"


def test_math_joined_by_separators_only_is_one_answer() -> None:
    assert one("final_answer_phrase", "The answer is $3$ and $5$.") == "3, 5"
