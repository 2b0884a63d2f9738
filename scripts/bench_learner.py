"""Benchmark the learner's update phase: step time and peak memory per rank, for world sizes 1 and 2.

    python scripts/bench_learner.py [--models tiny 135m] [--worlds 1 2] [--micro-batch-rows 8] [--out bench-learner.json]

The script is its own launcher. For each (model, world size), one after another (never two at once: the
ranks of two measurements would share the cores and every number would be wrong), it runs

    python -m torch.distributed.run --standalone --nproc_per_node=W scripts/bench_learner.py --worker \
        --model-path P --result-dir D --rows R --prompt-len P --response-len T --micro-batch-rows M --threads-per-rank K

Each rank builds rlvr.learner.Learner (FSDP2 for world 2; a world of one trains the plain module; fp32 master weights; on CPU precision auto is fp32, on CUDA --precision
and --activation-checkpointing pass through), a synthetic batch (every row exactly prompt_len + response_len
tokens, random ids: the padded compute depends only on the shape), then runs --warmup updates (pi_old = pi_theta),
one learner.logprobs call for the old logprobs (timed on its own) and --steps timed updates with those old
logprobs. Each rank writes its numbers as JSON into D; the launcher prints one markdown table and, with --out,
dumps every rank's numbers. Models:

    tiny  the built-in model (builtin:tiny-arith, about 1M parameters); default batch 64 x (16 + 32) tokens
    135m  a randomly initialised Llama with SmolLM2-135M's architecture, written once to a temp folder (no
          download: memory and time do not depend on the weights' values); default batch 64 x (64 + 128) tokens

Memory: on CUDA torch.cuda.max_memory_allocated; on CPU the peak RSS (getrusage ru_maxrss, over the whole
process: checkpoint loading included) next to the RSS right after the learner was built, so the training
increment shows. Threads: --threads cores in all (default: the cores this process may use), split evenly
over the ranks with torch.set_num_threads (and OMP_NUM_THREADS). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # rlvr from this checkout, even where it is not installed (e.g. a lent GPU machine)
    sys.path.insert(0, str(REPO))

from rlvr.types import Completion, RolloutBatch  # noqa: E402

TINY_ASSETS = REPO / "rlvr" / "assets" / "tiny-arith"  # its tokenizer files also serve the random models
# SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M config.json); head_dim = 576 / 9 = 64
SMOLLM2_135M = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    hidden_act="silu",
    initializer_range=0.041666666666666664,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)
T = TypeVar("T")
# per model: (rows, prompt_len, response_len) when the command line does not say
DEFAULT_SHAPES = {"tiny": (64, 16, 32), "135m": (64, 64, 128)}
# DAPO's loss settings (token ratio, clip-higher, token-mean); no KL term, so no reference model
LOSS_KWARGS = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_coef=0.0, kl_estimator="k3", clip_ratio_c=None)


def build_random_llama(folder: Path, **overrides: object) -> Path:
    """Write a randomly initialised Llama (SmolLM2-135M's architecture unless overridden) and a tokenizer to `folder`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**SMOLLM2_135M, **overrides})
    model = LlamaForCausalLM(config)  # fp32, random weights
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json"):  # Learner.save needs a tokenizer; ids beyond its vocab are fine
        shutil.copy(TINY_ASSETS / name, folder / name)
    return folder


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab_size: int, seed: int = 0) -> RolloutBatch:
    """`rows` completions of exactly prompt_len + response_len random token ids (no padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (rows, prompt_len + response_len), generator=g)  # [N, P + T]
    completions = [
        Completion(prompt_ids=row[:prompt_len], token_ids=row[prompt_len:], text="", finish_reason="length",
                   engine_logprobs=[0.0] * response_len)  # fmt: skip
        for row in ids.tolist()
    ]
    rewards = [float(i % 2) for i in range(rows)]
    return RolloutBatch.from_completions(completions, rewards, [r > 0 for r in rewards], pad_id=0)


def rss_mib() -> float:
    """This process's resident set size now (MiB)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def max_rss_mib() -> float:
    """This process's peak resident set size so far (MiB; ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """(fn(), seconds), with the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def measure(
    model_path: str,
    *,
    rows: int,
    prompt_len: int,
    response_len: int,
    micro_batch_rows: int,
    warmup: int,
    steps: int,
    precision: str = "auto",
    activation_checkpointing: bool = False,
) -> dict:
    """Build a Learner on `model_path`, time its logprobs and updates on a synthetic batch; this rank's numbers."""
    from rlvr import distributed
    from rlvr.learner import Learner

    distributed.init()
    device = distributed.device()
    rss_start = rss_mib()
    learner, build_s = timed(
        lambda: Learner(model_path, dtype="float32", lr=1e-6, weight_decay=0.0, warmup_steps=0, lr_schedule="constant",
                        total_updates=10**6, grad_clip=1.0, micro_batch_rows=micro_batch_rows, with_reference=False,
                        precision=precision, activation_checkpointing=activation_checkpointing),  # fmt: skip
        device,
    )
    mem_after_build = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else rss_mib()
    max_rss_after_build = max_rss_mib()
    vocab_size = learner.model.config.vocab_size
    batch = synthetic_batch(rows, prompt_len, response_len, vocab_size)
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(1))  # [N]
    mask = batch.response_mask  # [N, T]
    kwargs = {**LOSS_KWARGS, "max_len": response_len}
    for _ in range(warmup):  # the first calls pay one-time costs (allocator, kernel choice, FSDP lazy init)
        learner.update(batch, advantages, mask, None, None, loss_kwargs=kwargs)
    distributed.barrier()
    old_logprobs, logprobs_s = timed(lambda: learner.logprobs(batch), device)  # [N, T]
    step_s, metrics = [], {}
    for _ in range(steps):
        distributed.barrier()  # every rank starts the clock together
        metrics, seconds = timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, loss_kwargs=kwargs), device)
        step_s.append(seconds)
    update_s = statistics.median(step_s)
    response_tokens = int(mask.sum())
    return {
        "rank": learner.rank,
        "world": learner.world_size,
        "device": device.type,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in learner.model.parameters()),  # DTensor numel is the global size
        "rows": rows,
        "prompt_len": prompt_len,
        "response_len": response_len,
        "micro_batch_rows": micro_batch_rows,
        "precision": precision,
        "activation_checkpointing": activation_checkpointing,
        "build_s": build_s,
        "logprobs_s": logprobs_s,
        "update_s": step_s,
        "update_s_median": update_s,
        "response_tokens": response_tokens,
        "update_tokens_per_s": response_tokens / update_s,
        "memory_kind": "cuda_allocated" if device.type == "cuda" else "rss",
        "rss_start_mib": rss_start,
        "mem_after_build_mib": mem_after_build,
        "max_rss_after_build_mib": max_rss_after_build,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else max_rss_mib(),
        "last_metrics": metrics,
    }


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: measure, write rank<r>.json into --result-dir."""
    torch.set_num_threads(args.threads_per_rank)
    result = measure(
        args.model_path, rows=args.rows, prompt_len=args.prompt_len, response_len=args.response_len,
        micro_batch_rows=args.micro_batch_rows, warmup=args.warmup, steps=args.steps,
        precision=args.precision, activation_checkpointing=args.activation_checkpointing,
    )  # fmt: skip
    Path(args.result_dir, f"rank{result['rank']}.json").write_text(json.dumps(result, indent=1))
    from rlvr import distributed

    distributed.shutdown()


def launch(model: str, model_path: str, world: int, args: argparse.Namespace, tmp: Path) -> list[dict]:
    """Run one measurement under torchrun with `world` ranks; every rank's numbers, in rank order."""
    rows, prompt_len, response_len = (given or default for given, default in zip(
        (args.rows, args.prompt_len, args.response_len), DEFAULT_SHAPES[model]))  # fmt: skip
    per_rank = max(1, args.threads // world)
    result_dir = tmp / f"{model}-world{world}"
    result_dir.mkdir()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", __file__, "--worker",
        "--model-path", model_path, "--result-dir", str(result_dir), "--rows", str(rows), "--prompt-len", str(prompt_len),
        "--response-len", str(response_len), "--micro-batch-rows", str(args.micro_batch_rows), "--warmup", str(args.warmup),
        "--steps", str(args.steps), "--threads-per-rank", str(per_rank), "--precision", args.precision,
        *(["--activation-checkpointing"] if args.activation_checkpointing else []),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(per_rank)}  # torchrun would otherwise force 1 thread per rank
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)  # the workers' chatter to stderr: stdout is the table
    return [json.loads((result_dir / f"rank{r}.json").read_text()) for r in range(world)]


def table_row(model: str, ranks: list[dict]) -> str:
    """One markdown row from every rank's numbers (time: the slowest rank's median; memory: each rank's)."""
    r0 = ranks[0]
    update_s = max(r["update_s_median"] for r in ranks)  # the ranks move in lockstep: the slowest sets the pace
    logprobs_s = max(r["logprobs_s"] for r in ranks)
    built = " / ".join(f"{r['mem_after_build_mib']:.0f}" for r in ranks)
    peak = " / ".join(f"{r['peak_mib']:.0f}" for r in ranks)
    increment = " / ".join(f"{r['peak_mib'] - r['mem_after_build_mib']:.0f}" for r in ranks)
    shape = f"{r0['rows']} x ({r0['prompt_len']}+{r0['response_len']})"
    return (f"| {model} | {r0['params'] / 1e6:.2f}M | {r0['world']} | {r0['threads']} | {shape} | {r0['micro_batch_rows']} | "
            f"{update_s:.3f} | {r0['response_tokens'] / update_s:,.0f} | {logprobs_s:.3f} | {built} | {peak} | {increment} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "135m"], choices=list(DEFAULT_SHAPES))
    ap.add_argument("--worlds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rows", type=int, help="batch rows (default: 64)")
    ap.add_argument("--prompt-len", type=int, help="prompt tokens per row (default: 16 tiny, 64 135m)")
    ap.add_argument("--response-len", type=int, help="response tokens per row (default: 32 tiny, 128 135m)")
    ap.add_argument("--micro-batch-rows", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    ap.add_argument("--steps", type=int, default=3, help="timed updates (the table shows the median)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="cores in all, split over the ranks")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"], help="Learner precision (auto: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--out", help="write every rank's numbers here (JSON)")
    # worker mode (the launcher passes these to itself under torchrun)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--result-dir", help=argparse.SUPPRESS)
    ap.add_argument("--threads-per-rank", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp_name:
        tmp = Path(tmp_name)
        results = []
        cuda = torch.cuda.is_available()
        memory = "allocated" if cuda else "RSS"  # torch.cuda.max_memory_allocated, or the process's resident set
        device = torch.cuda.get_device_name() if cuda else f"CPU, {len(os.sched_getaffinity(0))} cores, no GPU"
        print(f"device: {device}; times: median of {args.steps} updates after {args.warmup} warm-up; memory per rank "
              f"(r0 / r1), MiB{'' if cuda else '; peak RSS covers the whole process (checkpoint load included)'}\n")  # fmt: skip
        print(f"| model | params | world | threads/rank | rows x (prompt+response) | micro_batch_rows | update s (median) | "
              f"update tokens/s | logprobs s | {memory} after build | peak {memory} | peak - after build |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for model in args.models:
            if model == "tiny":
                from rlvr.models import resolve_model_path  # here, not at the top: rlvr.config needs omegaconf

                path = resolve_model_path("builtin:tiny-arith")
            else:
                path = str(build_random_llama(tmp / "smollm2-135m-random"))
            for world in args.worlds:
                ranks = launch(model, path, world, args, tmp)
                results.append({"model": model, "world": world, "ranks": ranks})
                print(table_row(model, ranks), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
