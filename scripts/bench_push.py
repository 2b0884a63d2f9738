"""Benchmark the weight push: the time and the all-gathers of gathering a sharded learner's full weights
(Learner.named_weights, what every step hands the rollout engine), against the old per-parameter gather.

    python scripts/bench_push.py [--models tiny qwen2-200m] [--world 2] [--pushes 5] [--json]

The script is its own launcher: for each model, one after another, it runs

    python -m torch.distributed.run --standalone --nproc_per_node=W scripts/bench_push.py --worker \
        --model-path P --result-dir D --pushes N --threads-per-rank K

Each rank builds its learner as rlvr train builds one (scripts/bench_config.py: the recipe tree composed with the
model and fp32 master weights, every `auto` resolved for this machine and world size, then Learner.from_config:
FSDP2 over W ranks on gloo where there is no GPU), then times, --pushes times each (the median counts; every rank
drains the iterator and drops each tensor, as the engine drops its copy source; a barrier before each):

    per_parameter   the old push, kept here only as the baseline: DTensor.full_tensor of every parameter in turn, in
                    the master dtype (one all-gather per parameter)
    unit            Learner.named_weights(): one all-gather per FSDP unit (the root, each decoder layer), fp32
    unit_bf16       Learner.named_weights(torch.bfloat16): the same, gathered in bf16, what a bf16 engine is sent

and counts the all-gathers of one push of each (DTensor.full_tensor calls; torch.distributed.all_gather_single calls).
Models:

    tiny        the built-in model (builtin:tiny-arith, 4 layers, about 1M parameters)
    qwen2-200m  a randomly initialised Qwen2 (20 layers, hidden 1024, 16 heads / 4 KV heads, MLP 2816, vocab 32000,
                tied embeddings: 258M parameters, 1.0 GB in fp32), written to a temp folder (no download: the time
                does not depend on the weights' values)

Threads: the cores this process may use, split evenly over the ranks. A markdown table goes to stdout; with --json
the last line of stdout is one JSON object (per model: each way's median and every push's seconds, its all-gathers,
the parameters and their tensors, the world size and threads per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # rlvr from this checkout, even where it is not installed
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

TINY_ASSETS = REPO / "rlvr" / "assets" / "tiny-arith"  # its tokenizer files also serve the random model
QWEN2_200M = dict(hidden_size=1024, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
                  intermediate_size=2816, vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip


def build_random_qwen2(folder: Path) -> Path:
    """A randomly initialised fp32 Qwen2 of QWEN2_200M's shape and the tiny model's tokenizer, written to `folder`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_200M))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_ASSETS / name, folder / name)
    return folder


def per_parameter_push(learner) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """The old Learner.named_weights (baseline only): one DTensor.full_tensor per parameter, in the master dtype."""
    from rlvr import sharding

    for name, param in learner.model.named_parameters():
        yield name, sharding.full_tensor(param, learner.device)


def counted_gathers(push: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> int:
    """All-gathers one drained push takes: DTensor.full_tensor and torch.distributed.all_gather_single calls."""
    from torch.distributed.tensor import DTensor

    calls = []
    full_tensor, all_gather_single = DTensor.full_tensor, torch.distributed.all_gather_single

    def count(fn: Callable) -> Callable:
        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(fn)
            return fn(*args, **kwargs)

        return counting

    DTensor.full_tensor = count(full_tensor)  # type: ignore[method-assign]
    torch.distributed.all_gather_single = count(all_gather_single)
    try:
        for _ in push():
            pass
    finally:
        DTensor.full_tensor = full_tensor  # type: ignore[method-assign]
        torch.distributed.all_gather_single = all_gather_single
    return len(calls)


def timed_pushes(push: Callable[[], Iterator[tuple[str, torch.Tensor]]], n: int) -> list[float]:
    times = []
    for _ in range(n):
        torch.distributed.barrier()
        start = time.perf_counter()
        for _ in push():  # each tensor dropped as the next arrives
            pass
        times.append(time.perf_counter() - start)
    return times


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: time each way's pushes, rank 0 writes result.json into --result-dir."""
    torch.set_num_threads(args.threads_per_rank)
    from bench_config import build_learner, run_config

    from rlvr import distributed

    world = int(os.environ["WORLD_SIZE"])
    cfg = run_config(f"model.path={args.model_path}", "model.dtype=float32", "algo.kl_coef=0", world_size=world)
    learner = build_learner(cfg)
    ways = {"per_parameter": lambda: per_parameter_push(learner), "unit": learner.named_weights,
            "unit_bf16": lambda: learner.named_weights(torch.bfloat16)}  # fmt: skip
    params = [p for _, p in learner.model.named_parameters()]  # (tied weights once)
    result: dict = {"tensors": len(params), "numel": sum(p.numel() for p in params), "world": world,
                    "threads_per_rank": args.threads_per_rank, "sharded": learner.sharded}  # fmt: skip
    for name, push in ways.items():
        result[f"{name}_gathers"] = counted_gathers(push)
        times = timed_pushes(push, args.pushes)
        result[f"{name}_s"] = statistics.median(times)
        result[f"{name}_all_s"] = times
    if distributed.rank() == 0:
        Path(args.result_dir, "result.json").write_text(json.dumps(result, indent=1))
    distributed.shutdown()


def launch(model_path: str, args: argparse.Namespace, result_dir: Path) -> dict:
    threads = len(os.sched_getaffinity(0))
    per_rank = max(1, threads // args.world)
    result_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}", __file__,
           "--worker", "--model-path", model_path, "--result-dir", str(result_dir), "--pushes", str(args.pushes),
           "--threads-per-rank", str(per_rank)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(per_rank)}  # torchrun would otherwise force 1 thread per rank
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)  # the workers' chatter to stderr: stdout is the table
    return json.loads((result_dir / "result.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "qwen2-200m"], choices=["tiny", "qwen2-200m"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--result-dir", help=argparse.SUPPRESS)
    ap.add_argument("--threads-per-rank", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-push-") as tmp:
        for model in args.models:
            path = str(TINY_ASSETS) if model == "tiny" else str(build_random_qwen2(Path(tmp) / model))
            results[model] = launch(path, args, Path(tmp) / f"{model}-result")
    print("| model | parameters (tensors) | world | per-parameter push (all-gathers) | per-unit fp32 | per-unit bf16 |")
    print("|---|---|---|---|---|---|")
    for model, r in results.items():
        ways = " | ".join(f"{r[f'{w}_s']:.3f} s ({r[f'{w}_gathers']})" for w in ("per_parameter", "unit", "unit_bf16"))
        print(f"| {model} | {r['numel'] / 1e6:.1f}M ({r['tensors']}) | {r['world']} | {ways} |")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
