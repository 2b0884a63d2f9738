"""The code verifier's test record: its one definition, shared by the verifier (rlvr.verifiers.code) and the tasks
that write records (rlvr.tasks.code). No torch, no model code runs here: code in a record is parsed, never run.

The record is JSON, writable by hand (an Example's `answer`; `encode` writes it compactly)::

    {"tests": [TEST, ...],          required, 1 to MAX_TESTS
     "setup": "import math",        optional: run before the program, in its namespace (MBPP's test_setup_code)
     "solution": "def f(x): ...",   optional: a reference solution; the start-up gold check runs it
     "float_tol": 1e-6}             optional: stdin/stdout outputs compared token by token as floats within this

    TEST is exactly one of
    {"assert": "assert f(2) == 4"}                                    statements run after the program (MBPP)
    {"check": "def check(candidate): ...", "entry_point": "f"}        check(f) is called (HumanEval)
    {"stdin": "1 2\\n", "stdout": "3\\n"}                               the program's stdout for this input (APPS, TACO)
    {"call": "f", "args": [1, 2], "expected": 3}                      f(*args) == expected (APPS' fn_name)
"""

from __future__ import annotations

import ast
import builtins
import json
import math
from typing import Any

MAX_TESTS = 1000  # tests one record may hold
KINDS = {"assert": ("assert",), "check": ("check", "entry_point"), "stdin": ("stdin", "stdout"), "call": ("call", "args", "expected")}
OPTIONAL = ("setup", "solution", "float_tol")


def encode(record: dict[str, Any]) -> str:
    """The record as compact JSON, the form an Example's `answer` holds."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def validate(record: Any) -> None:
    """ValueError naming the first problem of `record`: keys, types, test shapes, code that does not parse."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be an object, got {show(record)}")
    unknown = [k for k in record if k not in ("tests", *OPTIONAL)]
    if unknown:
        raise ValueError(f"the record has unknown key {unknown[0]!r}; its keys are tests, {', '.join(OPTIONAL)}")
    tests = record.get("tests")
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"the record's tests must be a non-empty list, got {show(tests)}")
    if len(tests) > MAX_TESTS:
        raise ValueError(f"the record has {len(tests)} tests, more than {MAX_TESTS}")
    for key in ("setup", "solution"):
        if key in record:
            parsed_code(record[key], f"the record's {key}")
    tol = record.get("float_tol", 0)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"the record's float_tol must be a finite number >= 0, got {show(tol)}")
    for i, test in enumerate(tests):
        _validate_test(test, f"test {i}")


def _validate_test(test: Any, where: str) -> None:
    if not isinstance(test, dict):
        raise ValueError(f"{where} must be an object, got {show(test)}")
    kinds = [k for k in KINDS if k in test]
    if len(kinds) != 1:
        raise ValueError(f"{where} must have exactly one of {', '.join(KINDS)}; it has {', '.join(kinds) or 'none'}")
    keys = KINDS[kinds[0]]
    if set(test) != set(keys):
        raise ValueError(f"{where} must have exactly the keys {', '.join(keys)}; it has {', '.join(test)}")
    if "assert" in test:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(parsed_code(test["assert"], f"{where}'s assert"))):
            raise ValueError(f"{where}'s assert code holds no assert statement, so it checks nothing")
    elif "check" in test:
        tree = parsed_code(test["check"], f"{where}'s check")
        if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
            raise ValueError(f"{where}'s check code does not define a function check(candidate)")
        _name(test["entry_point"], f"{where}'s entry_point")
    elif "stdin" in test:
        for key in keys:
            if not isinstance(test[key], str):
                raise ValueError(f"{where}'s {key} must be a string, got {show(test[key])}")
    else:
        _name(test["call"], f"{where}'s call")
        if not isinstance(test["args"], list):
            raise ValueError(f"{where}'s args must be a list of arguments, got {show(test['args'])}")
        for key in ("args", "expected"):
            if not _is_json(test[key]):
                raise ValueError(f"{where}'s {key} is not plain JSON (finite numbers, strings, lists, objects with string keys)")


def parsed_code(value: Any, what: str) -> ast.Module:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be non-empty Python code, got {show(value)}")
    try:
        return ast.parse(value)
    except (SyntaxError, ValueError) as e:  # a null byte: a SyntaxError without a line (3.11); a lone surrogate: ValueError
        line = getattr(e, "lineno", None)
        raise ValueError(f"{what} is not valid Python ({getattr(e, 'msg', e)}{f', line {line}' if line else ''})") from None


def _name(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(f"{what} must be a function name, got {show(value)}")


def _is_json(value: Any) -> bool:
    """Whether `value` survives a JSON round trip unchanged."""
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _is_json(v) for k, v in value.items())


def describe(record: dict[str, Any]) -> str:
    """A short text for people: "3 asserts on add_k", "check(has_close_elements)", "4 stdin/stdout cases"."""
    tests = record["tests"]
    parts = []
    asserts = [t["assert"] for t in tests if "assert" in t]
    if asserts:
        name = _called(asserts[0])
        parts.append(_count(len(asserts), "assert") + (f" on {name}" if name else ""))
    checks = [t["entry_point"] for t in tests if "check" in t]
    if checks:
        parts.append(f"check({checks[0]})" if len(checks) == 1 else _count(len(checks), "check"))
    cases = sum("stdin" in t for t in tests)
    if cases:
        parts.append(_count(cases, "stdin/stdout case"))
    calls = [t["call"] for t in tests if "call" in t]
    if calls:
        parts.append(_count(len(calls), "call") + (f" of {calls[0]}" if len(set(calls)) == 1 else ""))
    return ", ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _called(code: str) -> str | None:
    """The first non-builtin function an assert calls by name."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            return node.func.id
    return None


def show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def parse(answer: str) -> dict[str, Any]:
    """The record in an Example's `answer`; ValueError naming the first problem."""
    try:
        record = json.loads(answer)
    except ValueError as e:
        raise ValueError(f"the code test record is not JSON: {e}") from None
    validate(record)
    return record
