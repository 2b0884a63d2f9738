"""Verifier for the countdown task: combine given numbers with + - * / to reach a target.

Ground-truth format (what a countdown dataset stores in its answer field)::

    "target=24;numbers=3,5,7,1"

Keys in any order, spaces allowed; a malformed ground truth raises ValueError (a dataset bug, not
a model error).

The completion's expression is the content of its last `<answer>...</answer>` block, else the last
run of expression characters (digits, spaces, parentheses, + - * / =) in the text that holds a
digit and an operator. It may end in "= <integer>", the claimed value: that claim is removed before
parsing, and a claim other than the target makes the answer INCORRECT (the value is recomputed,
never trusted). `×`, `÷`, `\\times`, `\\cdot` and `\\div` are read as * and /.

Accepted syntax: decimal integer literals, binary + - * /, parentheses. Everything else is rejected
as INCORRECT: names, calls, attributes, `**`, `//`, `%`, unary signs (write `5-3`, not `-3+5`),
hex / underscore literals. Each literal must be one of the given numbers, each given number used
at most once (numbers may be left unused). The value is computed exactly with `Fraction` (no
float, so `(1/3)*3` is exactly 1) and must equal the target. Division by zero is INCORRECT.

Bounds: the completion's last `SCAN_CHARS` characters are searched; expressions longer than
`MAX_EXPR_CHARS` or nested deeper than `MAX_DEPTH` are rejected before evaluation. Parsed with
`ast`, never `eval`.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from rlvr.verifiers import Outcome

SCAN_CHARS = 20_000
MAX_EXPR_CHARS = 200
MAX_DEPTH = 32  # AST depth; 200 characters cannot build a useful deeper expression anyway

_EXPR_RUN = re.compile(r"[\d\s()+\-*/=]+")  # one character class: linear, no backtracking
_ALLOWED = re.compile(r"[\d\s()+\-*/]+")
_CLAIMED_VALUE = re.compile(r"=\s*(-?\d{1,20})\s*$")
_SYMBOLS = {"×": "*", "÷": "/", "\\times": "*", "\\cdot": "*", "\\div": "/"}
_OPERATORS = {
    ast.Add: Fraction.__add__,
    ast.Sub: Fraction.__sub__,
    ast.Mult: Fraction.__mul__,
    ast.Div: Fraction.__truediv__,
}


class _Rejected(Exception):
    """The expression uses syntax or numbers the task does not allow."""


def parse_answer(answer: str) -> tuple[int, list[int]]:
    """(target, numbers) from "target=24;numbers=3,5,7,1"; ValueError if malformed."""
    fields: dict[str, str] = {}
    for part in answer.split(";"):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"countdown answer {answer!r}: expected 'target=T;numbers=a,b,...'")
        fields[key.strip()] = value.strip()
    if set(fields) != {"target", "numbers"}:
        raise ValueError(f"countdown answer {answer!r}: needs exactly the keys 'target' and 'numbers'")
    try:
        return int(fields["target"]), [int(n) for n in fields["numbers"].split(",") if n.strip()]
    except ValueError:
        raise ValueError(f"countdown answer {answer!r}: the target and the numbers must be integers") from None


def extract_expression(completion: str) -> str | None:
    """The expression a completion proposes (see the module docstring), with any "= value"; None if none."""
    text = completion[-SCAN_CHARS:]
    close = text.rfind("</answer>")
    open_ = text.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ >= 0:
        found: str | None = text[open_ + len("<answer>") : close]
    else:
        found = None
        for symbol, op in _SYMBOLS.items():
            text = text.replace(symbol, op)
        for m in _EXPR_RUN.finditer(text):
            run = m.group()
            if any(c.isdigit() for c in run) and any(c in "+-*/" for c in run):
                found = run
    if found is None:
        return None
    for symbol, op in _SYMBOLS.items():
        found = found.replace(symbol, op)
    found = found.replace("$", "").strip()
    return found if found.strip("= ") else None


def _evaluate(node: ast.AST, used: list[int], depth: int = 0) -> Fraction:
    """Exact value of an allowed AST; appends every literal to `used`; raises _Rejected."""
    if depth > MAX_DEPTH:
        raise _Rejected("too deep")
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left = _evaluate(node.left, used, depth + 1)
        right = _evaluate(node.right, used, depth + 1)
        return _OPERATORS[type(node.op)](left, right)  # ZeroDivisionError is the caller's
    raise _Rejected(type(node).__name__)


def score_expression(expression: str, target: int, numbers: list[int]) -> bool:
    """True if `expression` is allowed, uses only given numbers (each at most once) and equals `target`."""
    if len(expression) > MAX_EXPR_CHARS:
        return False
    if claim := _CLAIMED_VALUE.search(expression):
        if int(claim.group(1)) != target:
            return False
        expression = expression[: claim.start()]
    if not _ALLOWED.fullmatch(expression):
        return False
    try:
        tree = ast.parse(expression, mode="eval")
        used: list[int] = []
        value = _evaluate(tree.body, used)
    except (SyntaxError, ValueError, RecursionError, MemoryError, ZeroDivisionError, _Rejected):
        return False
    if Counter(used) - Counter(numbers):  # some literal is not given, or used too often
        return False
    return value == target


def check_gold(answer: str) -> Outcome:
    """The verdict on a perfect completion for this gold (rlvr.gold). A countdown gold is the puzzle, not a solution,
    so there is none to write: CORRECT when the verifier can read it (target and numbers), NO_ANSWER when not."""
    try:
        parse_answer(answer)
    except ValueError:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT


def verify(completion: str, answer: str) -> Outcome:
    """NO_ANSWER if no expression is found, else CORRECT / INCORRECT (see the module docstring)."""
    target, numbers = parse_answer(answer)
    expression = extract_expression(completion)
    if expression is None:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if score_expression(expression, target, numbers) else Outcome.INCORRECT
