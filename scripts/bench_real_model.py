"""Benchmark: RL on a real pretrained model raises held-out accuracy (issue: "proof that it learns a real model").

    python scripts/bench_real_model.py [--seeds 0 1] [--out bench-real] [extra Hydra overrides]

Runs the command below once per seed, one after another (never two at once: the 2 cores would be shared), timing
each metrics.jsonl row as it appears (wall clock from launch: model conversion, engine start-up and evaluations
included). Prints a markdown table: held-out greedy accuracy at the start, the best evaluation within 30 minutes
of launch and at the end, the minutes to the first evaluation 15 points above the start, total minutes, and the
median step split. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# DR.GRPO (no KL, so no reference model; no refill rounds) on SmolLM2-135M-Instruct, reasoning-gym's chain_sum with
# two one-digit terms. The model ends its answers with the result ("7 - 6 = 1"), so last_number reads it when there
# is no <answer> tag; a short system prompt replaces SmolLM2's 20-token default (the learner's cost is mostly prompt).
COMMAND = [
    "recipe=dr_grpo", "model=smollm2_135m",
    "data=gym", "data.name=chain_sum", "data.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
    "data.eval_size=100", "data.system_prompt=You are a helpful assistant.", "reward.extract=[answer_tag,last_number]",
    "algo.prompts_per_step=8", "trainer.max_steps=24", "trainer.eval_every=4", "trainer.lr=1e-5",
    "rollout.max_new_tokens=64", "trainer.save_every=0", "logger.progress=false",
]  # fmt: skip
BUDGET_S = 30 * 60


def run_once(seed: int, out: Path, extra: list[str]) -> dict[str, float]:
    folder = out / f"seed{seed}"
    metrics = folder / "metrics.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr", "train", *COMMAND, f"trainer.seed={seed}",
                             f"trainer.output_dir={folder}", *extra], stdout=subprocess.DEVNULL)  # fmt: skip
    seen: list[tuple[float, dict]] = []  # (seconds since launch, row)
    while True:
        done = proc.poll() is not None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        seen += [(time.monotonic() - t0, json.loads(line)) for line in lines[len(seen) :]]
        if done:
            break
        time.sleep(1.0)
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
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--out", default="bench-real")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    print("| seed | start acc | best acc within 30 min | end acc | minutes to +15 points | minutes | median step s (rollout / update) |")
    print("|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        r = run_once(seed, Path(args.out), args.overrides)
        print(f"| {seed} | {r['start']:.2f} | {r['in_budget']:.2f} | {r['end']:.2f} | {r['to_plus15_min']:.1f} | "
              f"{r['minutes']:.1f} | {r['step_s']:.0f} ({r['rollout_s']:.0f} / {r['update_s']:.0f}) |", flush=True)


if __name__ == "__main__":
    main()
