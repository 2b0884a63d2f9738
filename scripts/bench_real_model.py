"""Benchmark: RL on a real pretrained model raises held-out accuracy (issue: "proof that it learns a real model").

    python scripts/bench_real_model.py [--seeds 0 1] [--out bench-real] [extra Hydra overrides]
    python scripts/bench_real_model.py --smoke --out /tmp/b    # seconds (tests/test_scripts.py)

Runs the command below once per seed, one after another (never two at once: the 2 cores would be shared), timing
each metrics.jsonl row as it appears (wall clock from launch: model conversion, engine start-up and evaluations
included). Prints a markdown table: held-out greedy accuracy at the start, the best evaluation within 30 minutes
of launch and at the end, the minutes to the first evaluation 15 points above the start, total minutes, and the
median step split; the last line of stdout is one JSON object with every seed's numbers. Each run is `rlvr train`
itself, so it starts as every run does. --smoke runs this script's machinery (the launch, the timing of each row as it
appears, the table and the JSON) in seconds on the built-in model and task: COMMAND's recipe part (RECIPE: Dr.GRPO, 8
prompts a step, lr 1e-5) with SMOKE (1 step, evaluations before and after it) instead of SmolLM2 on chain_sum (MODEL_DATA),
which neither fits the built-in model's 64-token context nor runs in seconds on a CPU. Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

# DR.GRPO (no KL, so no reference model; no refill rounds) on SmolLM2-135M-Instruct, reasoning-gym's chain_sum with
# two one-digit terms. The model ends its answers with the result ("7 - 6 = 1"), so last_number reads it when there
# is no <answer> tag; a short system prompt replaces SmolLM2's 20-token default (the learner's cost is mostly prompt).
RECIPE = ["recipe=dr_grpo", "algo.prompts_per_step=8", "trainer.lr=1e-5", "trainer.save_every=0", "logger.progress=false"]
MODEL_DATA = [
    "model=smollm2_135m",
    "data=gym", "data.name=chain_sum", "data.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
    "data.eval_size=100", "data.system_prompt=You are a helpful assistant.", "reward.extract=[answer_tag,last_number]",
    "trainer.max_steps=24", "trainer.eval_every=4", "rollout.max_new_tokens=64",
]  # fmt: skip
COMMAND = RECIPE + MODEL_DATA
SMOKE = RECIPE + ["trainer.max_steps=1", "trainer.eval_every=1", "data.eval_size=32"]
BUDGET_S = 30 * 60


def run_once(seed: int, out: Path, extra: list[str], command: list[str] = COMMAND) -> dict[str, float]:
    folder = out / f"seed{seed}"
    metrics = folder / "metrics.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr", "train", *command, f"trainer.seed={seed}",
                             f"trainer.output_dir={folder}", *extra], stdout=subprocess.DEVNULL)  # fmt: skip
    seen: list[tuple[float, dict]] = []  # (seconds since launch, row)
    while True:
        done = proc.poll() is not None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        seen += [(time.monotonic() - t0, json.loads(line)) for line in lines[len(seen) :]]
        if done:
            break
        time.sleep(0.2 if command is SMOKE else 1.0)
    if proc.returncode:
        raise SystemExit(f"seed {seed}: rlvr train exited {proc.returncode}")
    evals = [(t, r["eval/accuracy"]) for t, r in seen if "eval/accuracy" in r]
    start = evals[0][1]
    steps = [r for _, r in seen if r["step"] > 0]
    return {
        "start": start,
        "in_budget": max(a for t, a in evals if t <= BUDGET_S),
        "end": evals[-1][1],
        "to_plus15_min": next((t / 60 for t, a in evals if a >= start + 0.15), float("nan")),
        "minutes": (time.monotonic() - t0) / 60,
        "step_s": statistics.median(r["timing/step_s"] for r in steps),
        "rollout_s": statistics.median(r["timing/rollout_s"] for r in steps),
        "update_s": statistics.median(r["timing/update_s"] for r in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 (--smoke: 0)")
    ap.add_argument("--out", default="bench-real")
    ap.add_argument("--smoke", action="store_true", help="seconds: the built-in model and task, 1 step (docstring)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    if args.smoke:
        args.seeds = args.seeds or [0]
    args.seeds = args.seeds or [0, 1]
    print("| seed | start acc | best acc within 30 min | end acc | minutes to +15 points | minutes | median step s (rollout / update) |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for seed in args.seeds:
        r = results[str(seed)] = run_once(seed, Path(args.out), args.overrides, SMOKE if args.smoke else COMMAND)
        print(f"| {seed} | {r['start']:.2f} | {r['in_budget']:.2f} | {r['end']:.2f} | {r['to_plus15_min']:.1f} | "
              f"{r['minutes']:.1f} | {r['step_s']:.0f} ({r['rollout_s']:.0f} / {r['update_s']:.0f}) |", flush=True)
    nan_free = {seed: {k: None if math.isnan(v) else v for k, v in r.items()} for seed, r in results.items()}
    print(json.dumps({"smoke": args.smoke, "budget_s": BUDGET_S, "seeds": nan_free}), flush=True)


if __name__ == "__main__":
    main()
