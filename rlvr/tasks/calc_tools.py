"""A function tool for `data=calc`, and the example of one: `rollout.tools=[rlvr.tasks.calc_tools:calculate]`.

A tool function is any importable function with type hints and a Google-style docstring (rlvr.function_tools); this
one evaluates exact integer arithmetic, safely: it walks the expression's syntax tree (numbers, + - * / // % **,
parentheses, pow(a, b, m)) and evaluates nothing else, with a bound on the size of powers. It runs in the trainer's
process, as every function tool does.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

MAX_DIGITS = 1000  # the largest result (and power) it computes, in decimal digits
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}  # fmt: skip


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "4821 * 7393", "12 + 34 + 56" or "pow(347, 59, 997)".

    Args:
        expression: integers with + - * / // % ** (or ^), parentheses, and pow(base, exponent, modulus); "mod" is %
    """
    text = re.sub(r"\bmod\b", "%", expression.replace("^", "**").replace("×", "*"))
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    value = _evaluate(tree.body)
    return str(value.numerator if value.denominator == 1 else value)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        assert isinstance(node.value, int | float)
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ZeroDivisionError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_evaluate(node.left), _evaluate(node.right), None)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "pow" and 2 <= len(node.args) <= 3 and not node.keywords:
        args = [_evaluate(a) for a in node.args]
        return _power(args[0], args[1], args[2] if len(args) == 3 else None)
    raise ValueError(f"only numbers, + - * / // % **, parentheses and pow() are allowed, not {ast.unparse(node)[:40]!r}")


def _power(base: Fraction, exponent: Fraction, modulus: Fraction | None) -> Fraction:
    if exponent.denominator != 1:
        raise ValueError("only whole exponents are allowed")
    if modulus is not None:
        if base.denominator != 1 or modulus.denominator != 1 or exponent < 0 or modulus == 0:
            raise ValueError("pow(base, exponent, modulus) takes integers, a non-negative exponent and a non-zero modulus")
        return Fraction(pow(int(base), int(exponent), int(modulus)))
    digits = abs(int(exponent)) * max(len(str(abs(base.numerator))), len(str(base.denominator)))
    if digits > MAX_DIGITS:
        raise ValueError(f"the result would have about {digits} digits, more than {MAX_DIGITS}")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("0 to a negative power")
    return base ** int(exponent)


def _bounded(value: Fraction) -> Fraction:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_DIGITS:
        raise ValueError(f"a result has more than {MAX_DIGITS} digits")
    return value
