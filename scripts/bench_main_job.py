"""Benchmark the main job: each recipe's default run on the built-in model, over several seeds.

    python scripts/bench_main_job.py [--recipes dapo grpo dr_grpo gspo] [--seeds 0 1 2] [--out bench-out]

Runs `rlvr train recipe=R trainer.seed=S` one after another (never two at once: the machine's
cores would be shared and every number would be wrong), then prints a markdown table of medians:
held-out greedy accuracy at the start and the end, wall-clock minutes from process start to exit
(engine start-up included), and optimizer steps per second of the loop. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run_once(recipe: str, seed: int, out: Path, extra: list[str]) -> dict[str, float]:
    folder = out / f"{recipe}-seed{seed}"
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "rlvr", "train", f"recipe={recipe}", f"trainer.seed={seed}",
         f"trainer.output_dir={folder}", "logger.progress=false", *extra],
        check=True, stdout=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if r["step"] > 0]
    loop_s = sum(r["timing/step_s"] for r in steps)
    return {"start": evals[0], "end": evals[-1], "minutes": wall / 60, "steps_per_s": len(steps) / loop_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", nargs="+", default=["dapo", "grpo", "dr_grpo", "gspo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    print("| recipe | start acc | end acc | minutes | steps/s | end acc per seed |")
    print("|---|---|---|---|---|---|")
    for recipe in args.recipes:
        results = [run_once(recipe, s, out, args.overrides) for s in args.seeds]
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        per_seed = ", ".join(f"{r['end']:.3f}" for r in results)
        print(f"| {recipe} | {med['start']:.3f} | {med['end']:.3f} | {med['minutes']:.2f} | "
              f"{med['steps_per_s']:.2f} | {per_seed} |", flush=True)


if __name__ == "__main__":
    main()
