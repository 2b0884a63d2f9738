"""Verifier for reasoning-gym tasks (rlvr.tasks.gym): the dataset's own `score_answer` on the last
`<answer>...</answer>` of the completion.

    verify(completion, answer) -> Outcome   CORRECT only at a full score of 1.0: reasoning-gym gives wrong
                                            answers small non-zero scores (0.01, 0.05, len(gold)/len(answer))
    score(completion, answer)  -> float     the dataset's score itself, 0.0 without an answer (reward.partial)
    check_gold(answer)         -> Outcome   the verdict on the entry's own answer in <answer> tags (rlvr.gold);
                                            None when the entry stores no answer

`answer` is the Example's JSON record (see `encode`): {"dataset", "options", "entry"}. The dataset object
whose `score_answer` is called is built once per (name, options) in each worker process, with size=1
(every scorer of reasoning-gym 0.1.25 scores the same from a size-1 instance; the task checks this).

Model output is untrusted. Some scorers run it through Python's `eval` or sympy's `parse_expr` (which
evals): binary_matrix, countdown, n_queens, number_sorting, puzzle24, spiral_matrix, string_insertion,
simple/intermediate_integration, polynomial_multiplication. So every extracted answer that parses as a
Python expression must be plain data and arithmetic (`is_safe`): no names or attributes starting with
"_", no calls except to a few math functions by name, no subscripts, lambdas, comprehensions, power
towers or sequence repetition ("Mr. Smith" parses as an attribute and passes; `__import__(...)`, `open(..)`
and `().__class__` do not). An answer that fails is INCORRECT (score 0.0) and never reaches the scorer.
This also closes a reward hack: the integration scorers give 1.0 to `Integral(<integrand>, x)`, which
sympy differentiates back to the integrand; `Integral` is not a safe call. Time is bounded by the worker
pool's per-sample timeout. No torch, no vllm.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Iterable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from rlvr.verifiers import Outcome
from rlvr.verifiers.extraction import extract_answer

try:  # imported here, not on the first call: a worker imports its verifier before its first timed sample (~3 s)
    import reasoning_gym
except ImportError:  # the task reports the missing package (rlvr.tasks.gym)
    reasoning_gym = None

DEFAULT_EXTRACT = ("answer_tag",)  # <answer>...</answer>, the form reasoning-gym's prompts ask for
MAX_ANSWER_CHARS = 10_000

# calls an answer may make (integration answers use exp/log/sin/..., countdown none)
SAFE_CALLS = frozenset(
    "sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh atanh exp log ln sqrt cbrt "
    "Abs abs sign floor ceiling factorial binomial gamma Rational Min Max min max round".split()
)
_SAFE_NODES = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
    ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Call, ast.keyword, ast.Attribute,
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)  # fmt: skip
_SEQUENCES = (ast.List, ast.Tuple, ast.Set, ast.Dict)


def extract(completion: str, *, extractors: Iterable[str] = DEFAULT_EXTRACT) -> str | None:
    """The answer the completion gives: by default the stripped content of its last complete <answer>...</answer>
    (as reasoning-gym's prompts ask); reward.extract may add other forms (rlvr.verifiers.extraction.extract_answer)."""
    return extract_answer(completion, extractors=extractors)


def verify(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> Outcome:
    """NO_ANSWER without an answer; CORRECT when the dataset scores the answer 1.0; else INCORRECT."""
    got = extract_answer(completion, extractors=extract)
    if got is None:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if _score(got, answer) >= 1.0 else Outcome.INCORRECT


def score(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> float:
    """The dataset's own score in [0, 1] for the completion's answer; 0.0 without one."""
    got = extract_answer(completion, extractors=extract)
    return 0.0 if got is None else _score(got, answer)


def check_gold(answer: str) -> Outcome | None:
    """The verdict on a perfect completion for this gold (rlvr.gold): the entry's own answer, as a person reads it
    (`shown`), in <answer> tags through `verify`, so the dataset's scorer must give it 1.0. NO_ANSWER when the
    record cannot be read; None when its entry stores no answer (boxnet, rush_hour, ...: their scorers check a
    solution, and there is no gold to check)."""
    try:
        gold = decode(answer)[2].get("answer")
        text = None if gold is None else shown(gold)
    except (ValueError, TypeError):
        return Outcome.NO_ANSWER
    return None if text is None else verify(f"<answer>{text}</answer>", answer)


def _score(got: str, answer: str) -> float:
    name, options, entry = decode(answer)
    if len(got) > MAX_ANSWER_CHARS or not is_safe(got):
        return 0.0
    return float(dataset(name, json.dumps(options, sort_keys=True)).score_answer(got, entry))


def is_safe(text: str) -> bool:
    """False if `text` is a Python expression that does more than build data and do arithmetic; True for
    plain data, arithmetic, and text that is not Python at all (which `eval` rejects anyway)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return True
    except Exception:  # RecursionError, MemoryError, null bytes: refuse rather than hand it to eval
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            return False
        if getattr(node, "id", getattr(node, "attr", "x")).startswith("_"):
            return False  # __import__, ().__class__, _private
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in SAFE_CALLS):
            return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.right)):
                return False  # 9**9**9**9: a power tower never finishes
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            if any(_is_sequence(n) for side in (node.left, node.right) for n in ast.walk(side)):
                return False  # [0]*10**10: sequence repetition can fill memory
    return True


def _is_sequence(node: ast.AST) -> bool:
    return isinstance(node, _SEQUENCES) or (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


@functools.lru_cache(maxsize=64)
def dataset(name: str, options_json: str) -> Any:
    """The reasoning-gym dataset object for (name, options), built once per process, size 1."""
    if reasoning_gym is None:
        raise ModuleNotFoundError("the gym verifier needs reasoning-gym: pip install reasoning-gym")
    return reasoning_gym.create_dataset(name, size=1, seed=0, **json.loads(options_json))


# ------------------------------------------------------------------------------------------- answer records


def encode(name: str, options: dict[str, Any], entry: dict[str, Any]) -> str:
    """Compact JSON of {"dataset", "options", "entry"}. Values JSON has no form for travel tagged, so that `decode`
    gives back what the generator made (scorers compare them: arc_agi and rearc tuple grids, gsm_symbolic fractions):
    tuples, sets, frozensets, Fractions, Decimals, complex numbers, numpy scalars and arrays (with their dtype), and
    dicts whose keys are not all strings (JSON would turn 1 into "1"). TypeError for anything else that is not JSON."""
    record = {"dataset": name, "options": options, "entry": entry}
    return json.dumps(_tag(record), separators=(",", ":"), ensure_ascii=False)


def decode(answer: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(dataset name, options, entry) from an `encode`d answer; ValueError if it is not one."""
    try:
        record = json.loads(answer, object_hook=_untag)
        name, options, entry = record["dataset"], record["options"], record["entry"]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"not a reasoning-gym answer record: {answer[:80]!r} ({type(e).__name__}: {e})") from None
    if not isinstance(name, str) or not isinstance(options, dict) or not isinstance(entry, dict):
        raise ValueError(f"not a reasoning-gym answer record: {answer[:80]!r}")
    return name, options, entry


def shown(value: Any) -> str:
    """An entry's answer as a person reads it (samples.jsonl's `gold`): a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(_tag(value), ensure_ascii=False)


def _tag(obj: Any) -> Any:
    """obj with every value JSON cannot hold as it is replaced by a one-key {"__kind__": payload} dict (_untag)."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list):
        return [_tag(x) for x in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: _tag(v) for k, v in obj.items()}
        return {"__dict__": [[_tag(k), _tag(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_tag(x) for x in obj]}
    if isinstance(obj, frozenset):  # (before set: a frozenset is no set subclass, but keep the order explicit)
        return {"__frozenset__": [_tag(x) for x in obj]}
    if isinstance(obj, set):
        return {"__set__": [_tag(x) for x in obj]}
    if isinstance(obj, Fraction):
        return {"__fraction__": [obj.numerator, obj.denominator]}
    if isinstance(obj, Decimal):
        return {"__decimal__": str(obj)}
    if isinstance(obj, complex):
        return {"__complex__": [obj.real, obj.imag]}
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype"):  # a numpy scalar or array (numpy not imported here)
        value = obj.tolist()
        return {"__numpy__": [str(obj.dtype), _tag(value), type(obj).__name__ != "ndarray"]}  # dtype, value, scalar?
    raise TypeError(f"Object of type {type(obj).__name__} cannot be stored as JSON ({obj!r:.80})")


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) != 1:
        return obj
    kind, payload = next(iter(obj.items()))
    if kind == "__tuple__":
        return tuple(payload)
    if kind == "__set__":
        return set(payload)
    if kind == "__frozenset__":
        return frozenset(payload)
    if kind == "__fraction__":
        return Fraction(*payload)
    if kind == "__decimal__":
        return Decimal(payload)
    if kind == "__complex__":
        return complex(*payload)
    if kind == "__dict__":
        return {k: v for k, v in payload}  # a tuple key came back as a tuple already (inner objects decode first)
    if kind == "__numpy__":
        import numpy as np

        dtype, value, scalar = payload
        return np.dtype(dtype).type(value) if scalar else np.array(value, dtype=dtype)
    return obj


_TAGS = ("__tuple__", "__set__", "__frozenset__", "__fraction__", "__decimal__", "__complex__", "__dict__", "__numpy__")
