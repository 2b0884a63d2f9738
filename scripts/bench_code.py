"""The code verifier's speed: the sandbox's start, programs per second through the worker pool, HumanEval's 164
canonical solutions (and a wrong variant of each), and one training step's reward phase next to the math verifier's.

    python scripts/bench_code.py [--reps 5] [--n 400] [--workers 2] [--humaneval] [--json] [--smoke]

- start: one trivial program (`x = 1`, one reported value) through `sandbox.run`, one after another: the median
  wall time per run with bubblewrap, and without it (reward.code.sandbox=none: the harness alone), over --reps rounds
  of 20 runs. Their difference is bubblewrap's own cost.
- throughput: --n programs, each a trivial `add` with 3 assert tests, through VerifierPool("rlvr.verifiers.code:verify",
  workers=--workers): programs per second (median of --reps; target >= 50 on 2 cores).
- humaneval: every problem's canonical solution must score CORRECT, and a wrong variant of each (its body replaced by
  `return None`... a constant answer) must not; the wall time of both passes through the pool.
- step: a reward phase of SmolLM2's code run's shape (8 prompts x 8 samples: half correct, a quarter wrong, one in
  eight that does not compile, one in eight without code) through Rewarder.score with reward.code.time_limit_s=1,
  the same with one program in 64 that never returns, and the math verifier on 64 boxed answers; medians of --reps.
  The Rewarder is built as rlvr.startup builds it, from the run's config (scripts/bench_config.py).
The last line is JSON with every number. --smoke: seconds (one repetition, 8 programs, one round of 2 runs for the
start; tests/test_scripts.py runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from rlvr.verifiers import Outcome
from rlvr.verifiers.code import sandbox
from rlvr.verifiers.pool import VerifierPool

ADD = json.dumps({"tests": [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(2, 2) == 4"},
                            {"assert": "assert add(-1, 1) == 0"}]})  # fmt: skip
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"


def start_ms(reps: int, runs: int = 20) -> dict[str, float]:
    job = {"mode": "functions", "program": "x = 1", "setup": "", "tests": ["__rlvr_value__(0, x)"]}
    out = {}
    for sandboxed in (True, False):
        rounds = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(runs):
                sandbox.run(job, sandbox.Limits(), wall_s=10, sandbox=sandboxed)
            rounds.append((time.perf_counter() - t) / runs * 1000)
        out["start_ms_bwrap" if sandboxed else "start_ms_harness_only"] = statistics.median(rounds)
    return out


def throughput(n: int, workers: int, reps: int) -> float:
    with VerifierPool("rlvr.verifiers.code:verify", workers=workers, timeout_s=10) as pool:
        pool.score([(GOOD, ADD)] * (4 * workers))  # warm: every worker has started a sandbox once
        rates = []
        for _ in range(reps):
            t = time.perf_counter()
            results, _ = pool.score([(GOOD, ADD)] * n)
            rates.append(n / (time.perf_counter() - t))
            assert all(r is Outcome.CORRECT for r in results), results
    return statistics.median(rates)


def humaneval(workers: int) -> dict[str, float]:
    from rlvr.tasks import code as tasks
    from rlvr.verifiers.code import record as code_record

    problems = tasks.humaneval_examples()
    records = [code_record.parse(p.answer) for p in problems]
    good = [(f"```python\n{r['solution']}\n```", p.answer) for r, p in zip(records, problems)]
    entry = [r["tests"][0]["entry_point"] for r in records]
    wrong = [(f"```python\ndef {e}(*args, **kwargs):\n    return None\n```", p.answer) for e, p in zip(entry, problems)]
    with VerifierPool("rlvr.verifiers.code:verify", workers=workers, timeout_s=10) as pool:
        t = time.perf_counter()
        good_results, _ = pool.score(good)
        wrong_results, _ = pool.score(wrong)
        seconds = time.perf_counter() - t
    failing = [p.id for p, r in zip(problems, good_results) if r is not Outcome.CORRECT]
    passing_wrong = [p.id for p, r in zip(problems, wrong_results) if r is Outcome.CORRECT]
    print(f"humaneval: {164 - len(failing)}/164 canonical solutions CORRECT, {len(passing_wrong)} wrong variants CORRECT "
          f"({seconds:.1f} s for both passes)", file=sys.stderr)  # fmt: skip
    assert not failing and not passing_wrong, (failing, passing_wrong)
    return {"humaneval_correct": 164 - len(failing), "humaneval_wrong_correct": len(passing_wrong),
            "humaneval_seconds": seconds}  # fmt: skip


def reward_step(reps: int) -> dict[str, float]:
    from bench_config import run_config

    from rlvr.config import VerifierName
    from rlvr.rewards import Rewarder
    from rlvr.types import Completion

    def completion(text: str) -> Completion:
        return Completion(prompt_ids=[1], token_ids=[5] * 64, text=text, finish_reason="stop", engine_logprobs=[0.0] * 64)

    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    broken = "```python\ndef add(a, b)\n    return a + b\n```"
    hung = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    mix = [GOOD, wrong, GOOD, broken, wrong, GOOD, "I think the answer is add.", GOOD] * 8  # [64]
    code_batch = ([completion(t) for t in mix], [ADD] * 64)
    hung_batch = ([completion(t) for t in mix[:-1] + [hung]], [ADD] * 64)  # one program in 64 never returns
    math_batch = ([completion(f"We add them up. The answer is $\\boxed{{{i}}}$.") for i in range(64)], [str(i % 7) for i in range(64)])
    out = {}
    for name, verifier, batch in (("code", "code", code_batch), ("code_one_hung", "code", hung_batch),
                                  ("math", "math", math_batch)):
        cfg = run_config(f"reward.verifier={verifier}", "reward.workers=2", "reward.code.time_limit_s=1", "rollout.max_new_tokens=192")
        rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=VerifierName.arithmetic)
        try:
            rewarder.score(*batch)  # the workers' start-up
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                rewarder.score(*batch)
                times.append(time.perf_counter() - t)
        finally:
            rewarder.close()
        out[f"reward_step_s_{name}"] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--humaneval", action="store_true", help="also run HumanEval's canonical and wrong solutions")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    ap.add_argument("--smoke", action="store_true", help="seconds: one repetition, 8 programs (docstring)")
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.n = 1, 8
    sandbox.check()
    result: dict[str, float] = {**start_ms(args.reps, runs=2 if args.smoke else 20),
                                "programs_per_s": throughput(args.n, args.workers, args.reps)}  # fmt: skip
    if args.humaneval:
        result.update(humaneval(args.workers))
    result.update(reward_step(args.reps))
    if not args.json:
        for key, value in result.items():
            print(f"{key:28s} {value:10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
