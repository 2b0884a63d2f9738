"""The built-in tool task (`data=calc`): exact arithmetic that is hard to do in one's head and easy in Python.

Three kinds of question, drawn in turn: the product of two `digits`-digit numbers ("What is 4821 * 7393?"), the sum of
five (`digits` + 1)-digit numbers, and a modular power ("What is 347^59 mod 997?", the modulus a prime under 1000).
Each answer is the exact integer, checked by the math verifier (the task's own). The problems come from a seeded
generator: training from `data.seed`, the held-out set from `data.seed + EVAL_SEED_OFFSET`, and a training problem
whose question is also held out is dropped, so no run trains on a held-out question. Usable with and without
rollout.tools: without them the model must compute in its head (or in its reasoning), which a small model rarely does.

data.options: `digits` (2-6, default 4), `kinds` (any of product, sum, modpow; default all three).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from rlvr.config import ConfigError
from rlvr.types import Example

KINDS = ("product", "sum", "modpow")
EVAL_SEED_OFFSET = 1_000_000_007
PRIMES = [p for p in range(101, 1000) if all(p % d for d in range(2, int(p**0.5) + 1))]  # moduli of modpow


def question(kind: str, digits: int, rng: random.Random) -> tuple[str, int]:
    """One problem of `kind`: (its question, its exact answer)."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    if kind == "product":
        a, b = rng.randint(low, high), rng.randint(low, high)
        return f"What is {a} * {b}?", a * b
    if kind == "sum":
        terms = [rng.randint(low * 10, high * 10 + 9) for _ in range(5)]
        return f"What is {' + '.join(map(str, terms))}?", sum(terms)
    base, exponent, modulus = rng.randint(2, 999), rng.randint(10, 99), rng.choice(PRIMES)
    return f"What is {base}^{exponent} mod {modulus}?", pow(base, exponent, modulus)


def problems(count: int, seed: int, digits: int, kinds: tuple[str, ...]) -> list[tuple[str, int]]:
    """`count` problems from `seed`, the kinds in turn."""
    rng = random.Random(seed)
    return [question(kinds[i % len(kinds)], digits, rng) for i in range(count)]


def examples(*, size: int, eval_size: int, seed: int, options: Mapping[str, Any] | None) -> tuple[list[Example], list[Example]]:
    """(training, held-out) Examples; ConfigError naming data.options when they are wrong."""
    digits, kinds = _options(options)
    held_out = problems(eval_size, seed + EVAL_SEED_OFFSET, digits, kinds)
    seen = {q for q, _ in held_out}
    train = [Example(id=f"calc-train-{i}", prompt=q, answer=str(a))
             for i, (q, a) in enumerate(problems(size, seed, digits, kinds)) if q not in seen]  # fmt: skip
    return train, [Example(id=f"calc-eval-{i}", prompt=q, answer=str(a)) for i, (q, a) in enumerate(held_out)]


def _options(options: Mapping[str, Any] | None) -> tuple[int, tuple[str, ...]]:
    options = dict(options or {})
    unknown = sorted(set(options) - {"digits", "kinds"})
    if unknown:
        raise ConfigError(f"data.options: unknown option(s) {unknown} for data=calc; it takes digits (2-6) and kinds {list(KINDS)}")
    digits = options.get("digits", 4)
    if not isinstance(digits, int) or not 2 <= digits <= 6:
        raise ConfigError(f"data.options.digits must be an integer in 2..6 for data=calc, got {digits!r}")
    kinds = tuple(options.get("kinds", KINDS))
    if not kinds or any(k not in KINDS for k in kinds):
        raise ConfigError(f"data.options.kinds must be a non-empty list of {list(KINDS)}, got {list(kinds)}")
    return digits, kinds
