"""Math verifications per second through VerifierPool (target: >= 1,000/s on 2 workers).

    OMP_NUM_THREADS=1 python scripts/bench_verifiers.py [--n 2000] [--workers 2] [--reps 3]
    OMP_NUM_THREADS=1 python scripts/bench_verifiers.py --per-pair [--reps 3]
    python scripts/bench_verifiers.py --reward-step

Each mode's last line of stdout is one JSON object. --smoke (any mode) runs it in seconds: 64 verifications and one
repetition; --per-pair on the corpus and 32 generated pairs, once; --reward-step 3 calls (tests/test_scripts.py).

--per-pair times each pair of the tests' corpus (tests/math_pairs.py) and of one generated batch (below) in this
process, one `verify` call each, with the verifier's own caches emptied before it (after the one-off warm-up): the
median, p99 and max over the pairs (each pair's median over --reps passes), and the verdicts that differ from the
corpus's expected ones. It runs against any version of the verifier on the path (PYTHONPATH=<old checkout> for a
before/after comparison on the same pairs).

--reward-step times `Rewarder.score` on a batch of the main job's shape (DAPO's 64 prompts x 8 samples, the built-in
arithmetic verifier in process, overlong shaping): the median of 30 calls, the Rewarder built as rlvr.startup builds
it from the run's config (scripts/bench_config.py). RECIPES_DIR=<old checkout>/recipes with PYTHONPATH=<old checkout>
times an older version against its own recipe tree.

A batch looks like a rollout: n / 16 prompts with 16 completions each, a few hundred characters of
reasoning ending in a boxed answer written as the ground truth, another spelling of it (fraction vs
decimal vs LaTeX), a wrong value, or an expression. Every repetition draws new numbers from a wide
range, so the verifier's caches help mostly within a batch (same answers in one group), as in
training; a small warm-up batch first pays the one-off sympy / parser start-up.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import VerifierPool

FILLER = (
    "First, let us restate the problem and name the unknown quantity. ",
    "We substitute the given values into the equation and simplify both sides. ",
    "Multiplying through by the common denominator removes the fractions. ",
    "Checking the boundary cases shows that no other solution is possible. ",
    "Combining like terms gives a linear equation that is easy to solve. ",
)


def _problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(ground truth, correct spellings, wrong answers) for one random problem."""
    kind = rng.randrange(4)
    if kind == 0:  # integer
        n = rng.randint(-500, 5000)
        return str(n), [str(n), f"{n}.0", f"{n:,}"], [str(n + 1), str(-n - 1)]
    if kind == 1:  # fraction
        p, q = rng.randint(1, 999), rng.choice([2, 4, 5, 8, 16, 20, 25, 40])
        return (
            f"\\frac{{{p}}}{{{q}}}",
            [f"\\dfrac{{{p}}}{{{q}}}", f"{p}/{q}", str(p / q)],
            [f"\\frac{{{q}}}{{{p + q}}}"],
        )
    if kind == 2:  # surd
        a, b = rng.randint(2, 99), rng.choice([2, 3, 5, 7, 11, 13])
        return f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}"], [f"{a + 1}\\sqrt{{{b}}}"]
    a = rng.randint(1, 99)  # polynomial
    return f"(x+{a})^2", [f"x^2+{2 * a}x+{a * a}", f"(x+{a})^2"], [f"x^2+{a}x+{a * a}"]


def make_batch(n: int, seed: int, group: int = 16) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n // group):
        gold, right, wrong = _problem(rng)
        for _ in range(group):
            answer = rng.choice(right) if rng.random() < 0.5 else rng.choice(wrong)
            reasoning = "".join(rng.choice(FILLER) for _ in range(rng.randint(3, 6)))
            pairs.append((f"{reasoning}Step {rng.randint(1, 99)}: so the answer is $\\boxed{{{answer}}}$.", gold))
    return pairs


def per_pair(reps: int, generated: int = 320) -> None:
    """Each pair's verify time in this process (module docstring); the last line is JSON."""
    from rlvr.verifiers import math as verifier

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from math_pairs import PAIRS

    getattr(verifier, "warm_up", getattr(verifier, "_warm_up", None))()  # type: ignore[misc]
    pairs = [(c, g, want) for c, g, want in PAIRS] + [(c, g, None) for c, g in make_batch(generated, seed=7)]
    caches = [getattr(verifier, name) for name in ("_equivalent_normalized", "_parse") if hasattr(verifier, name)]
    times: list[list[float]] = [[] for _ in pairs]
    wrong: list[tuple[str, str, str, str]] = []
    for rep in range(reps):
        for i, (completion, gold, want) in enumerate(pairs):
            for cache in caches:
                cache.cache_clear()
            start = time.perf_counter()
            outcome = verifier.verify(completion, gold)
            times[i].append(time.perf_counter() - start)
            if rep == 0 and want is not None and outcome.value != want:
                wrong.append((completion[-60:], gold, want, outcome.value))
    each = sorted(statistics.median(t) for t in times)
    p99 = each[min(len(each) - 1, round(0.99 * (len(each) - 1)))]
    for row in wrong:
        print("differs from expected:", row)
    print(f"{len(pairs)} pairs: median {statistics.median(each) * 1e3:.2f} ms, p99 {p99 * 1e3:.1f} ms, "
          f"max {each[-1] * 1e3:.1f} ms; {len(wrong)} of {len(PAIRS)} corpus verdicts differ from expected")  # fmt: skip
    print(json.dumps({"pairs": len(pairs), "median_ms": statistics.median(each) * 1e3, "p99_ms": p99 * 1e3,
                      "max_ms": each[-1] * 1e3, "corpus_wrong": len(wrong), "corpus": len(PAIRS)}))  # fmt: skip


def reward_step(calls: int = 30) -> None:
    """The main job's reward time per step (module docstring)."""
    import os

    from rlvr.config import VerifierName, validate
    from rlvr.rewards import Rewarder
    from rlvr.types import Completion

    if "RECIPES_DIR" in os.environ:  # an older checkout's recipe tree (and its own rlvr on PYTHONPATH)
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=os.environ["RECIPES_DIR"], version_base=None):
            cfg = validate(compose("config", overrides=["recipe=dapo", "trainer.output_dir=/tmp/unused"]))
    else:
        from bench_config import run_config

        cfg = run_config("recipe=dapo")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=VerifierName.arithmetic)
    rng = random.Random(0)
    n = cfg.algo.prompts_per_step * cfg.algo.group_size
    lengths = [rng.randint(1, 6) for _ in range(n)]
    completions = [Completion(prompt_ids=[1], token_ids=[1] * k, text=str(rng.randint(0, 200)), finish_reason="stop",
                              engine_logprobs=[0.0] * k) for k in lengths]  # fmt: skip
    answers = [str(rng.randint(0, 200)) for _ in range(n)]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        rewarder.score(completions, answers)
        times.append(time.perf_counter() - start)
    rewarder.close()
    print(f"{n} completions: median reward time per step {statistics.median(times) * 1e3:.2f} ms")
    print(json.dumps({"completions": n, "calls": calls, "median_ms": statistics.median(times) * 1e3}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-pair", action="store_true", help="time each pair in this process (docstring)")
    parser.add_argument("--reward-step", action="store_true", help="the main job's reward time per step (docstring)")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--smoke", action="store_true", help="seconds: a small batch, one repetition (docstring)")
    args = parser.parse_args()
    if args.smoke:
        args.n, args.reps = 64, 1
    print("command:", shlex.join([sys.executable, *sys.argv]))
    if args.per_pair:
        per_pair(args.reps, generated=32 if args.smoke else 320)
        return
    if args.reward_step:
        reward_step(calls=3 if args.smoke else 30)
        return
    start = time.perf_counter()
    with VerifierPool("rlvr.verifiers.math:verify", workers=args.workers, timeout_s=args.timeout_s) as pool:
        pool_start_s = time.perf_counter() - start
        print(f"pool start: {pool_start_s:.2f} s ({args.workers} workers)")
        pool.score(make_batch(16 * 4 * max(1, args.workers), seed=10_000))  # warm-up, not timed
        rates = []
        for rep in range(args.reps):
            pairs = make_batch(args.n, seed=1 + rep)
            start = time.perf_counter()
            results, stats = pool.score(pairs)
            seconds = time.perf_counter() - start
            rates.append(len(pairs) / seconds)
            counts = Counter(r.value if isinstance(r, Outcome) else "score" for r in results)
            print(f"rep {rep}: {len(pairs)} in {seconds:.2f} s = {rates[-1]:,.0f}/s  {dict(counts)}  {stats}")
    print(f"median: {statistics.median(rates):,.0f} verifications/s")
    print(json.dumps({"verifications_per_s": statistics.median(rates), "rates": rates, "n": args.n, "workers": args.workers,
                      "reps": args.reps, "pool_start_s": pool_start_s}))  # fmt: skip


if __name__ == "__main__":
    main()
