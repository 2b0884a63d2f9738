"""Benchmark the main job: each recipe's default run on the built-in model, over several seeds.

    python scripts/bench_main_job.py [--recipes dapo grpo dr_grpo gspo] [--seeds 0 1 2] [--out bench-out] [--json]
    python scripts/bench_main_job.py --smoke --out /tmp/b      # seconds: dapo, seed 0, 1 step (tests/test_scripts.py)

Runs `rlvr train recipe=R trainer.seed=S` one after another (never two at once: the machine's
cores would be shared and every number would be wrong), then prints a markdown table of medians:
held-out greedy accuracy at the start and the end, seconds from launch to the first evaluation at or above
--target (0.90; the row's time/elapsed_s, engine start-up included; "-" when no evaluation reached it), wall-clock
minutes from process start to exit, optimizer steps per second of the loop, and engine calls (rollout rounds) per
step, and the learner phase's arithmetic rate (the median step's perf/learner_gflops_per_s: rlvr/flops.py's count of its
updates and logprob passes over timing/update_s) with its share of this machine's matmul peak in the dtype the run's
learner computes in (settings.json), the peak measured first in the same command on the run's threads (scripts/peak.py);
then the per-seed numbers. Each run is `rlvr train` itself, so it starts as every run does. The last line of stdout
is one JSON object: the peak, and per recipe the medians and the per-seed numbers (to_target_s null where no evaluation
reached it).
--smoke: recipe dapo, seed 0, SMOKE overrides (1 step, evaluations before and after it on 64 held-out prompts). Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peak import measure as measure_peak
from peak import share as peak_share

SMOKE = ["trainer.max_steps=1", "trainer.eval_every=1", "data.eval_size=64", "trainer.save_every=0"]


def run_once(recipe: str, seed: int, out: Path, extra: list[str], target: float, peak: dict) -> dict[str, float]:
    folder = out / f"{recipe}-seed{seed}"
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "rlvr", "train", f"recipe={recipe}", f"trainer.seed={seed}",
         f"trainer.output_dir={folder}", "logger.progress=false", *extra],
        check=True, stdout=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    reached = [r["time/elapsed_s"] for r in evals if r["eval/accuracy"] >= target]
    steps = [r for r in rows if r["step"] > 0]
    loop_s = sum(r["timing/step_s"] for r in steps)
    learner = statistics.median(r["perf/learner_gflops_per_s"] for r in steps if "perf/learner_gflops_per_s" in r)
    precision = json.loads((folder / "settings.json").read_text())["settings"]["precision"]
    return {"start": evals[0]["eval/accuracy"], "end": evals[-1]["eval/accuracy"],
            "to_target_s": reached[0] if reached else math.inf, "minutes": wall / 60,
            "steps_per_s": len(steps) / loop_s, "rounds": statistics.mean(r.get("sampling/rounds", 1) for r in steps),
            "learner_gflops_per_s": learner,
            "peak_share": peak_share(learner, peak, "bfloat16" if precision == "bf16" else "float32")}


def seconds(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", nargs="+", default=["dapo", "grpo", "dr_grpo", "gspo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--target", type=float, default=0.90, help="held-out accuracy for the time-to-target column")
    ap.add_argument("--smoke", action="store_true", help="seconds: dapo, seed 0, 1 step (SMOKE)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    if args.smoke:
        args.recipes, args.seeds, args.overrides = ["dapo"], [0], [*SMOKE, *args.overrides]
    out = Path(args.out)
    target = f"s to {args.target:.2f}"
    peak = measure_peak(len(os.sched_getaffinity(0)), size=256 if args.smoke else 2048, seconds=0.1 if args.smoke else 1.0)
    print(f"matmul peak on {peak['threads']} threads, measured here: fp32 {peak['float32']:.1f} GFLOP/s, bf16 "
          f"{peak['bfloat16']:.1f}\n")  # fmt: skip
    print(f"| recipe | start acc | end acc | {target} | minutes | steps/s | rounds/step | learner GFLOP/s | of peak | "
          f"end acc per seed | {target} per seed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for recipe in args.recipes:
        results = [run_once(recipe, s, out, args.overrides, args.target, peak) for s in args.seeds]
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        per_seed = ", ".join(f"{r['end']:.3f}" for r in results)
        per_seed_s = ", ".join(seconds(r["to_target_s"]) for r in results)
        print(f"| {recipe} | {med['start']:.3f} | {med['end']:.3f} | {seconds(med['to_target_s'])} | {med['minutes']:.2f} | "
              f"{med['steps_per_s']:.2f} | {med['rounds']:.2f} | {med['learner_gflops_per_s']:.1f} | {med['peak_share']:.0%} | "
              f"{per_seed} | {per_seed_s} |", flush=True)
        summary[recipe] = {"median": finite(med), "seeds": dict(zip(map(str, args.seeds), map(finite, results)))}
    print(json.dumps({"target": args.target, "smoke": args.smoke, "overrides": args.overrides, "peak": peak,
                      "recipes": summary}), flush=True)  # fmt: skip


def finite(row: dict[str, float]) -> dict[str, float | None]:
    """The numbers for JSON: inf (the target never reached) as null."""
    return {k: None if math.isinf(v) else v for k, v in row.items()}


if __name__ == "__main__":
    main()
