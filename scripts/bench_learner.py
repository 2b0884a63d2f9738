"""Benchmark the learner's update phase: step time and peak memory per rank, for world sizes 1 and 2.

    python scripts/bench_learner.py [--models tiny 135m] [--worlds 1 2] [--micro-batch-rows 8] [--out bench-learner.json]
        [--json] [--smoke] [--micro-batch-tokens auto] [--precision auto] [--activation-checkpointing auto] [--lora-rank 0] [--pad 0]

The script is its own launcher. For each (model, world size), one after another (never two at once: the
ranks of two measurements would share the cores and every number would be wrong), it runs

    python -m torch.distributed.run --standalone --nproc_per_node=W scripts/bench_learner.py --worker \
        --model-path P --result-dir D --rows R --prompt-len P --response-len T --micro-batch-rows M --threads-per-rank K

Each rank builds its learner as rlvr train builds one (scripts/bench_config.py: the recipe tree, DAPO, composed with
the model, fp32 master weights, lr 1e-6 constant, rollout.max_new_tokens = the response length and the command line's
trainer.micro_batch_rows, micro_batch_tokens, precision, activation_checkpointing and model.lora.rank, validated,
every `auto` resolved for this machine and world size, then Learner.from_config: FSDP2 for world 2, the plain module
for a world of one; the loss options are the recipe's, rlvr.learner.loss_options), a synthetic batch (every row exactly prompt_len + response_len
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
over the ranks with torch.set_num_threads (and OMP_NUM_THREADS). With --json the last line of stdout is one JSON object
(device, steps, warmup, smoke, and per measurement under "results": model, world, update_s, update_tokens_per_s,
logprobs_s, mem_after_build_mib and peak_mib per rank, the settings used, ...). --smoke: seconds (the built-in model,
8 x (8 + 8) tokens, worlds 1 and 2 unless --worlds says, no warm-up, one timed update); tests/test_scripts.py runs it.

Realistic mode: the learner against the obvious implementation, on one realistic batch

    python scripts/bench_learner.py --realistic [--json] [--smoke] [--rows 64] [--seed 0] [--steps 1] [--warmup 0] [--threads N]

Model: a randomly initialised Llama with SmolLM2-135M's architecture (--smoke: 2 decoder layers). Batch (seeded):
--rows rows (default 64; --smoke 8), prompt lengths uniform in 40..120, response lengths long-tailed (lognormal,
median 100, sigma 0.75, rounded and clamped to [1, 512]; --smoke clamps to 32) with 3 rows in 64 (chosen by the
seed) exactly at the maximum (finish reason "length"), random token ids, right-padded by RolloutBatch.from_completions;
advantages seeded randn per row. A one-line summary of the lengths goes to stderr. Two measurements, one after
the other, each in its own fresh process (`--realistic-worker naive|rlvr`) so that the peak RSS is its own, both
with --threads threads (torch.set_num_threads and OMP_NUM_THREADS):

    naive  transformers' AutoModelForCausalLM in fp32 as a plain module, torch.optim.AdamW(lr=1e-6); micro-batches of
           8 rows in order, every row padded to the batch's longest; the full-vocabulary logits at every position, an
           fp32 log_softmax, gather of the response tokens; DAPO's loss (token ratio against old = logp.detach(),
           clip 0.2 / 0.28, token-mean over the whole batch's response tokens), backward per micro-batch, then
           clip_grad_norm_(1.0), step, zero_grad. Also times a no-grad logprobs pass done the same way.
    rlvr   rlvr.learner.Learner, built as rlvr train builds it (scripts/bench_config.py: the recipe tree, DAPO, with the
           model, fp32 master weights, lr 1e-6 constant and rollout.max_new_tokens = the batch's maximum; every other
           setting the run's own, each `auto` resolved for this machine: trainer.micro_batch_rows, micro_batch_tokens,
           precision, activation_checkpointing, logits_chunk_tokens), updated with the recipe's loss options
           (rlvr.learner.loss_options: DAPO's clip-higher and token-mean, and its rollout correction against the
           batch's engine logprobs); the old logprobs from one timed learner.logprobs call.

Each runs --warmup untimed updates (default 0), then --steps timed ones (default 1; the median counts: on 2 CPU
cores one naive update is ~8 minutes, itself an average over its 8 micro-batches). Tokens/s
count real tokens only (prompt + response of every row, no padding). Memory: the RSS right after the model and
the optimizer are built (AdamW's state comes at the first step, so it is part of the increment) and the peak RSS
(ru_maxrss) after the updates; increment = peak - after build. A table goes to stdout; with --json the last line
of stdout is one JSON object (update_tokens_per_s, naive_tokens_per_s, logprobs_tokens_per_s, peak_rss_mb,
naive_peak_rss_mb, peak_increment_mb, naive_peak_increment_mb, speedup, memory_ratio, real_tokens, padded_tokens,
rows, threads, device, the rlvr settings and loss options used, ...). --smoke checks the plumbing in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TypeVar, cast

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # rlvr from this checkout, even where it is not installed (e.g. a lent GPU machine)
    sys.path.insert(0, str(REPO))

from peak import measure as measure_peak  # noqa: E402
from peak import share as peak_share  # noqa: E402

from rlvr import flops  # noqa: E402
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
SMOKE_SHAPE = (8, 8, 8)  # --smoke: rows, prompt_len, response_len (the built-in model, worlds 1 and 2, one update)


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


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab_size: int, seed: int = 0, pad: int = 0) -> RolloutBatch:
    """`rows` completions of exactly prompt_len + response_len random token ids (no padding); with `pad`, the last
    row's response is `pad` tokens shorter (right-padded: rows of two lengths in one micro-batch)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (rows, prompt_len + response_len), generator=g)  # [N, P + T]
    lengths = [response_len] * (rows - 1) + [response_len - pad]
    completions = [
        Completion(prompt_ids=row[:prompt_len], token_ids=row[prompt_len : prompt_len + n], text="", finish_reason="length",
                   engine_logprobs=[0.0] * n)  # fmt: skip
        for row, n in zip(ids.tolist(), lengths)
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


def machine_peak(args: argparse.Namespace) -> dict:
    """This machine's matmul peak (scripts/peak.py) on the benchmark's threads, measured in this run (--smoke: briefly)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return measure_peak(args.threads, size=256 if args.smoke else 2048, seconds=0.1 if args.smoke else 1.0, device=device)


def peak_words(machine: dict) -> str:
    return (f"matmul peak on {machine['threads']} threads, measured here: fp32 {machine['float32']:.1f} GFLOP/s, bf16 "
            f"{machine['bfloat16']:.1f} (update GFLOP/s: rlvr/flops.py's count, 6 x matmul params x real tokens + "
            f"attention, over the median update; of peak: of the peak of the dtype the learner computes in)")


def measure(
    model_path: str,
    *,
    rows: int,
    prompt_len: int,
    response_len: int,
    micro_batch_rows: int,
    warmup: int,
    steps: int,
    micro_batch_tokens: str = "auto",
    precision: str = "auto",
    activation_checkpointing: str = "auto",
    lora_rank: int = 0,
    pad: int = 0,
) -> dict:
    """Build a Learner on `model_path` as rlvr train builds one (learner_overrides), time its logprobs and updates on a
    synthetic batch; this rank's numbers."""
    from bench_config import build_learner, loss_options, run_config

    from rlvr import distributed

    distributed.init()
    device = distributed.device()
    rss_start = rss_mib()
    cfg = run_config(*learner_overrides(model_path, max_len=response_len), f"trainer.micro_batch_rows={micro_batch_rows}",
                     f"trainer.micro_batch_tokens={micro_batch_tokens}", f"trainer.precision={precision}",
                     f"trainer.activation_checkpointing={activation_checkpointing}", f"model.lora.rank={lora_rank}",
                     world_size=distributed.world_size())  # fmt: skip
    learner, build_s = timed(lambda: build_learner(cfg), device)
    mem_after_build = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else rss_mib()
    max_rss_after_build = max_rss_mib()
    vocab_size = learner.model.config.vocab_size
    batch = synthetic_batch(rows, prompt_len, response_len, vocab_size, pad=pad)
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(1))  # [N]
    mask = batch.response_mask  # [N, T]
    options = loss_options(cfg)
    for _ in range(warmup):  # the first calls pay one-time costs (allocator, kernel choice, FSDP lazy init)
        learner.update(batch, advantages, mask, None, None, options=options)
    distributed.barrier()
    flops_before = learner.flops
    old_logprobs, logprobs_s = timed(lambda: learner.logprobs(batch), device)  # [N, T]
    logprobs_flops, flops_before = learner.flops - flops_before, learner.flops
    step_s, metrics = [], {}
    for _ in range(steps):
        distributed.barrier()  # every rank starts the clock together
        metrics, seconds = timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, options=options), device)
        step_s.append(seconds)
    update_s = statistics.median(step_s)
    response_tokens = int(mask.sum())
    update_flops = (learner.flops - flops_before) / steps  # (rlvr.flops: 6 x matmul params x real tokens + attention)
    return {
        "rank": learner.rank,
        "world": learner.world_size,
        "device": device.type,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in learner.model.parameters()),  # DTensor numel is the global size
        "trained_params": sum(p.numel() for p in learner.trainable),
        "lora_rank": lora_rank,
        "rows": rows,
        "prompt_len": prompt_len,
        "response_len": response_len,
        "pad": pad,
        **used_settings(cfg),
        "sharded": learner.sharded,
        "build_s": build_s,
        "logprobs_s": logprobs_s,
        "update_s": step_s,
        "update_s_median": update_s,
        "response_tokens": response_tokens,
        "update_tokens_per_s": response_tokens / update_s,
        "update_gflop": update_flops / 1e9,
        "logprobs_gflop": logprobs_flops / 1e9,
        "memory_kind": "cuda_allocated" if device.type == "cuda" else "rss",
        "rss_start_mib": rss_start,
        "mem_after_build_mib": mem_after_build,
        "max_rss_after_build_mib": max_rss_after_build,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else max_rss_mib(),
        "last_metrics": metrics,
    }


def learner_overrides(model_path: str, *, max_len: int) -> list[str]:
    """What both modes fix on top of the run's config (recipes/config.yaml, DAPO): the model, fp32 master weights, a
    constant lr of 1e-6 from the first update, and the responses' length as rollout.max_new_tokens. Everything else
    (the loss, the micro-batch plan, precision, checkpointing, the logits chunk) is what rlvr train runs with, resolved
    for this machine (scripts/bench_config.py)."""
    return [f"model.path={model_path}", "model.dtype=float32", "trainer.lr=1e-6", "trainer.warmup_steps=0",
            "trainer.lr_schedule=constant", f"rollout.max_new_tokens={max_len}"]  # fmt: skip


def used_settings(cfg: object) -> dict:
    """The learner settings a resolved config gives (its trainer.* values)."""
    t = cfg.trainer  # type: ignore[attr-defined]
    return {"micro_batch_rows": t.micro_batch_rows, "micro_batch_tokens": int(t.micro_batch_tokens),
            "precision": str(t.precision.value), "activation_checkpointing": bool(t.activation_checkpointing),
            "logits_chunk_tokens": int(t.logits_chunk_tokens)}  # fmt: skip


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: measure, write rank<r>.json into --result-dir."""
    torch.set_num_threads(args.threads_per_rank)
    result = measure(
        args.model_path, rows=args.rows, prompt_len=args.prompt_len, response_len=args.response_len,
        micro_batch_rows=args.micro_batch_rows, warmup=args.warmup, steps=args.steps, micro_batch_tokens=args.micro_batch_tokens,
        precision=args.precision, activation_checkpointing=args.activation_checkpointing, lora_rank=args.lora_rank,
        pad=args.pad,
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
        "--micro-batch-tokens", args.micro_batch_tokens, "--activation-checkpointing", args.activation_checkpointing,
        "--lora-rank", str(args.lora_rank), "--pad", str(args.pad),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(per_rank)}  # torchrun would otherwise force 1 thread per rank
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)  # the workers' chatter to stderr: stdout is the table
    return [json.loads((result_dir / f"rank{r}.json").read_text()) for r in range(world)]


def achieved(ranks: list[dict], peak: dict) -> tuple[float, float]:
    """The update's rate (GFLOP/s, all ranks together, at the slowest rank's median) and its share of the peak of the
    dtype the learner computes in."""
    rate = ranks[0]["update_gflop"] / max(r["update_s_median"] for r in ranks)
    return rate, peak_share(rate, peak, "bfloat16" if ranks[0]["precision"] == "bf16" else "float32")


def table_row(model: str, ranks: list[dict], machine: dict) -> str:
    """One markdown row from every rank's numbers (time: the slowest rank's median; memory: each rank's)."""
    r0 = ranks[0]
    update_s = max(r["update_s_median"] for r in ranks)  # the ranks move in lockstep: the slowest sets the pace
    logprobs_s = max(r["logprobs_s"] for r in ranks)
    built = " / ".join(f"{r['mem_after_build_mib']:.0f}" for r in ranks)
    peak = " / ".join(f"{r['peak_mib']:.0f}" for r in ranks)
    increment = " / ".join(f"{r['peak_mib'] - r['mem_after_build_mib']:.0f}" for r in ranks)
    shape = f"{r0['rows']} x ({r0['prompt_len']}+{r0['response_len']})"
    model += f" LoRA r{r0['lora_rank']} ({r0['trained_params'] / 1e6:.2f}M trained)" if r0.get("lora_rank") else ""
    micro = f"{r0['micro_batch_rows']} / {r0['micro_batch_tokens']}; {r0['precision']}{', ckpt' if r0['activation_checkpointing'] else ''}"
    rate, share = achieved(ranks, machine)
    return (f"| {model} | {r0['params'] / 1e6:.2f}M | {r0['world']} | {r0['threads']} | {shape} | {micro} | "
            f"{update_s:.3f} | {r0['response_tokens'] / update_s:,.0f} | {rate:.1f} | {share:.0%} | {logprobs_s:.3f} | "
            f"{built} | {peak} | {increment} |")  # fmt: skip


def summary_row(model: str, ranks: list[dict], machine: dict) -> dict:
    """One measurement for the JSON line: the slowest rank's times, every rank's memory (MiB), the settings used."""
    r0 = ranks[0]
    update_s = max(r["update_s_median"] for r in ranks)
    keys = ("world", "params", "trained_params", "lora_rank", "rows", "prompt_len", "response_len", "response_tokens",
            "micro_batch_rows", "micro_batch_tokens", "precision", "activation_checkpointing", "logits_chunk_tokens",
            "sharded", "threads", "device", "memory_kind")  # fmt: skip
    return {"model": model, **{k: r0[k] for k in keys}, "update_s": update_s,
            "update_tokens_per_s": r0["response_tokens"] / update_s, "logprobs_s": max(r["logprobs_s"] for r in ranks),
            "mem_after_build_mib": [r["mem_after_build_mib"] for r in ranks], "peak_mib": [r["peak_mib"] for r in ranks],
            "update_gflop": r0["update_gflop"], "update_gflops_per_s": achieved(ranks, machine)[0],
            "peak_share": achieved(ranks, machine)[1],
            "pg_loss": r0["last_metrics"].get("pg_loss"), "grad_norm": r0["last_metrics"].get("grad_norm")}  # fmt: skip


# --- realistic mode: rlvr's Learner against the obvious implementation on one long-tailed batch ----------------------

PROMPT_LEN_RANGE = (40, 120)  # prompt lengths: uniform integers, both ends included
RESPONSE_MEDIAN, RESPONSE_SIGMA = 100.0, 0.75  # response lengths: lognormal(mu = ln 100, sigma), rounded
RESPONSE_MAX, SMOKE_RESPONSE_MAX = 512, 32  # ... clamped to [1, max]
FULL_LENGTH_PER_64 = 3  # rows (per 64) that run to the maximum: finish reason "length"
NAIVE_MICRO_BATCH_ROWS = 8
NAIVE_CLIP_LOW, NAIVE_CLIP_HIGH = 0.2, 0.28  # DAPO's clip-higher, as in recipes/recipe/dapo.yaml


def realistic_batch(rows: int, vocab_size: int, *, response_max: int, seed: int) -> tuple[RolloutBatch, torch.Tensor]:
    """A seeded batch with realistic lengths (see the module docstring) and its advantages [N] (randn per row)."""
    g = torch.Generator().manual_seed(seed)
    low, high = PROMPT_LEN_RANGE
    prompt_lens = torch.randint(low, high + 1, (rows,), generator=g)  # [N]
    lognormal = torch.exp(math.log(RESPONSE_MEDIAN) + RESPONSE_SIGMA * torch.randn(rows, generator=g))  # [N]
    response_lens = lognormal.round().clamp(1, response_max).long()  # [N]
    full = torch.randperm(rows, generator=g)[: max(1, round(rows * FULL_LENGTH_PER_64 / 64))]
    response_lens[full] = response_max
    ids = torch.randint(3, vocab_size, (rows, int((prompt_lens + response_lens).max())), generator=g)  # [N, L]
    completions = []
    for row, p, r in zip(ids.tolist(), prompt_lens.tolist(), response_lens.tolist()):
        completions.append(
            Completion(prompt_ids=row[:p], token_ids=row[p : p + r], text="", engine_logprobs=[0.0] * r,
                       finish_reason="length" if r == response_max else "stop")  # fmt: skip
        )
    advantages = torch.randn(rows, generator=g)  # [N]
    rewards = [float(a > 0) for a in advantages.tolist()]  # not used by the loss; from_completions wants them
    return RolloutBatch.from_completions(completions, rewards, [r > 0 for r in rewards], pad_id=0), advantages


def real_tokens(batch: RolloutBatch) -> int:
    """Prompt + response tokens over all rows, padding excluded."""
    return int(batch.attention_mask.sum())


def length_stats(batch: RolloutBatch) -> dict:
    """min / median / mean / max of the prompt and response lengths, and the real and padded token counts."""
    response = batch.response_mask.sum(1)  # [N]
    prompt = batch.attention_mask.sum(1) - response  # [N]

    def stats(x: torch.Tensor) -> dict:
        x = x.double()
        return {"min": int(x.min()), "median": float(x.median()), "mean": round(float(x.mean()), 1), "max": int(x.max())}

    return {
        "prompt_len": stats(prompt),
        "response_len": stats(response),
        "truncated_rows": int(batch.truncated.sum()),
        "real_tokens": real_tokens(batch),
        "padded_tokens": batch.input_ids.numel(),  # rows x the longest row
    }


def length_summary(batch: RolloutBatch) -> str:
    """One line describing the batch's lengths."""
    s = length_stats(batch)
    p, r = s["prompt_len"], s["response_len"]
    rows, width = batch.input_ids.shape
    return (f"batch: {rows} rows; prompt len min/median/mean/max {p['min']}/{p['median']:.0f}/{p['mean']}/{p['max']}; "
            f"response len {r['min']}/{r['median']:.0f}/{r['mean']}/{r['max']} ({s['truncated_rows']} rows finish 'length'); "
            f"real tokens {s['real_tokens']}; padded tokens {rows} x {width} = {s['padded_tokens']} "
            f"({s['real_tokens'] / s['padded_tokens']:.0%} real)")  # fmt: skip


def naive_response_logprobs(model: torch.nn.Module, micro: RolloutBatch) -> torch.Tensor:
    """The obvious way: full-vocabulary logits at every position, fp32 log_softmax, then the response tokens [m, T]."""
    logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits  # [m, L, V]
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [m, L - 1, V]: position j predicts token j + 1
    token_logp = logp_all.gather(-1, micro.input_ids[:, 1:, None])[:, :, 0]  # [m, L - 1]
    index = micro.response_index.clamp(max=token_logp.shape[1] - 1)  # [m, T] (padding columns clamped)
    return token_logp.gather(1, index)  # [m, T]


def naive_dapo_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """DAPO's clipped surrogate (token ratio, clip 0.2 / 0.28), token-mean over the whole batch's `num_tokens`.

    logp, mask: [m, T]; advantages: [m]. pi_old = pi_theta (old = logp.detach()), so the micro-batch losses sum to
    the batch loss.
    """
    ratio = torch.exp(logp - logp.detach())  # [m, T]
    adv = advantages[:, None]  # [m, 1]
    clipped = ratio.clamp(1 - NAIVE_CLIP_LOW, 1 + NAIVE_CLIP_HIGH)  # [m, T]
    per_token = -torch.minimum(ratio * adv, clipped * adv)  # [m, T]
    return (per_token * mask).sum() / num_tokens


def naive_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: RolloutBatch, advantages: torch.Tensor) -> None:
    """One optimizer update: micro-batches of NAIVE_MICRO_BATCH_ROWS rows in order, backward each, clip, step."""
    num_tokens = batch.response_mask.sum()  # [] the whole batch's response tokens
    for i in range(0, batch.num_rows, NAIVE_MICRO_BATCH_ROWS):
        rows = slice(i, i + NAIVE_MICRO_BATCH_ROWS)
        micro = batch.select(rows)  # every row still padded to the batch's longest row
        logp = naive_response_logprobs(model, micro)  # [m, T]
        naive_dapo_loss(logp, advantages[rows], micro.response_mask, num_tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


@torch.no_grad()
def naive_logprobs(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """A no-grad logprobs pass done the naive way: [N, T]."""
    return torch.cat([naive_response_logprobs(model, batch.select(slice(i, i + NAIVE_MICRO_BATCH_ROWS)))
                      for i in range(0, batch.num_rows, NAIVE_MICRO_BATCH_ROWS)])  # fmt: skip


def measure_naive(model_path: str, batch: RolloutBatch, advantages: torch.Tensor, *, warmup: int, steps: int) -> dict:
    """Time the naive update (and a naive logprobs pass); memory of this process."""
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.nn.Module.to(model, device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch, advantages = batch.to(device), advantages.to(device)
    rss_after_build = rss_mib()
    for _ in range(warmup):
        naive_update(model, optimizer, batch, advantages)
    _, logprobs_s = timed(lambda: naive_logprobs(model, batch), device)
    step_s = [timed(lambda: naive_update(model, optimizer, batch, advantages), device)[1] for _ in range(steps)]
    update_flops = flops.UPDATE_PASSES * flops.Shape.of(model).forward(flops.lengths(batch.attention_mask))  # real tokens
    return {"settings": {"micro_batch_rows": NAIVE_MICRO_BATCH_ROWS, "precision": "fp32"}, "update_s": step_s,
            "update_gflop": update_flops / 1e9,
            "logprobs_s": logprobs_s, "rss_after_build_mib": rss_after_build, **peak_memory(device)}  # fmt: skip


def measure_rlvr(model_path: str, batch: RolloutBatch, advantages: torch.Tensor, *, warmup: int, steps: int) -> dict:
    """Time Learner.update as rlvr train builds and calls it (the recipe's loss, the resolved trainer settings); memory of
    this process."""
    from bench_config import build_learner, loss_options, run_config

    from rlvr import distributed

    cfg = run_config(*learner_overrides(model_path, max_len=int(batch.response_ids.shape[1])))
    learner = build_learner(cfg)
    rss_after_build = rss_mib()
    mask = batch.response_mask  # [N, T]
    options = loss_options(cfg)
    for _ in range(warmup):  # pi_old = pi_theta
        learner.update(batch, advantages, mask, None, None, options=options)
    old_logprobs, logprobs_s = timed(lambda: learner.logprobs(batch), learner.device)  # [N, T]
    flops_before = learner.flops
    step_s = [timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, options=options),
                    learner.device)[1] for _ in range(steps)]  # fmt: skip
    result = {"settings": used_settings(cfg), "loss": options.kwargs(), "update_s": step_s, "logprobs_s": logprobs_s,
              "update_gflop": (learner.flops - flops_before) / steps / 1e9,
              "rss_after_build_mib": rss_after_build, **peak_memory(learner.device)}  # fmt: skip
    distributed.shutdown()
    return result


def peak_memory(device: torch.device) -> dict:
    """This process's peak RSS (MiB) and, on CUDA, the peak allocated device memory."""
    out = {"peak_rss_mib": max_rss_mib()}
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def save_batch(path: Path, batch: RolloutBatch, advantages: torch.Tensor) -> None:
    """Write the batch's tensors and the advantages, for the measurement processes."""
    torch.save({"batch": {f.name: getattr(batch, f.name) for f in fields(batch)}, "advantages": advantages}, path)


def load_batch(path: Path) -> tuple[RolloutBatch, torch.Tensor]:
    """What save_batch wrote: (batch, advantages [N])."""
    saved = torch.load(path, weights_only=True)
    return RolloutBatch(**saved["batch"]), saved["advantages"]


def realistic_worker(args: argparse.Namespace) -> None:
    """One measurement (naive or rlvr) in this fresh process; its numbers go to --result-dir/<mode>.json."""
    torch.set_num_threads(args.threads)
    batch, advantages = load_batch(Path(args.batch_file))
    measure = measure_naive if args.realistic_worker == "naive" else measure_rlvr
    result = measure(args.model_path, batch, advantages, warmup=args.warmup, steps=args.steps)
    result["threads"] = torch.get_num_threads()
    Path(args.result_dir, f"{args.realistic_worker}.json").write_text(json.dumps(result, indent=1))


def run_realistic(args: argparse.Namespace) -> None:
    """Build the model and the batch, run the two measurements one after the other, print the table (and JSON)."""
    rows = args.rows or (8 if args.smoke else 64)
    response_max = SMOKE_RESPONSE_MAX if args.smoke else RESPONSE_MAX
    layers = 2 if args.smoke else cast(int, SMOLLM2_135M["num_hidden_layers"])
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else f"CPU, {len(os.sched_getaffinity(0))} cores, no GPU"
    with tempfile.TemporaryDirectory(prefix="bench-learner-realistic-") as tmp_name:
        tmp = Path(tmp_name)
        model_path = build_random_llama(tmp / "smollm2-135m-random", num_hidden_layers=layers)
        vocab_size = cast(int, SMOLLM2_135M["vocab_size"])
        batch, advantages = realistic_batch(rows, vocab_size, response_max=response_max, seed=args.seed)  # [N, L], [N]
        print(length_summary(batch), file=sys.stderr, flush=True)
        machine = machine_peak(args)  # before the measurements, on their threads
        save_batch(tmp / "batch.pt", batch, advantages)
        results = {}
        for mode in ("naive", "rlvr"):  # one after the other: never two measurements on the same cores
            cmd = [sys.executable, __file__, "--realistic-worker", mode, "--model-path", str(model_path),
                   "--batch-file", str(tmp / "batch.pt"), "--result-dir", str(tmp), "--threads", str(args.threads),
                   "--warmup", str(args.warmup), "--steps", str(args.steps)]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)  # its chatter to stderr: stdout is the report
            results[mode] = json.loads((tmp / f"{mode}.json").read_text())
    summary = realistic_summary(batch, results, rows=rows, threads=args.threads, device=device, layers=layers,
                                response_max=response_max, args=args, machine=machine)  # fmt: skip
    print(realistic_table(summary, results), flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)


def realistic_summary(batch: RolloutBatch, results: dict, *, rows: int, threads: int, device: str, layers: int,
                      response_max: int, args: argparse.Namespace, machine: dict) -> dict:  # fmt: skip
    """The JSON object: throughput (real tokens), memory and the settings of both measurements."""
    tokens = real_tokens(batch)
    naive, rlvr = results["naive"], results["rlvr"]
    update_s, naive_s = statistics.median(rlvr["update_s"]), statistics.median(naive["update_s"])
    increment = rlvr["peak_rss_mib"] - rlvr["rss_after_build_mib"]
    naive_increment = naive["peak_rss_mib"] - naive["rss_after_build_mib"]
    dtype = "bfloat16" if rlvr["settings"]["precision"] == "bf16" else "float32"
    rate, naive_rate = rlvr["update_gflop"] / update_s, naive["update_gflop"] / naive_s
    summary = {
        "update_tokens_per_s": tokens / update_s,
        "update_gflops_per_s": rate,
        "peak_share": peak_share(rate, machine, dtype),
        "naive_update_gflops_per_s": naive_rate,
        "naive_peak_share": peak_share(naive_rate, machine, "float32"),
        "peak": machine,
        "naive_tokens_per_s": tokens / naive_s,
        "logprobs_tokens_per_s": tokens / rlvr["logprobs_s"],
        "naive_logprobs_tokens_per_s": tokens / naive["logprobs_s"],
        "peak_rss_mb": rlvr["peak_rss_mib"],
        "naive_peak_rss_mb": naive["peak_rss_mib"],
        "rss_after_build_mb": rlvr["rss_after_build_mib"],
        "naive_rss_after_build_mb": naive["rss_after_build_mib"],
        "peak_increment_mb": increment,
        "naive_peak_increment_mb": naive_increment,
        "speedup": naive_s / update_s,
        "memory_ratio": increment / naive_increment if naive_increment > 0 else None,
        "update_s": rlvr["update_s"],
        "naive_update_s": naive["update_s"],
        "logprobs_s": rlvr["logprobs_s"],
        "naive_logprobs_s": naive["logprobs_s"],
        "real_tokens": tokens,
        "padded_tokens": batch.input_ids.numel(),
        "response_tokens": int(batch.response_mask.sum()),
        "rows": rows,
        "lengths": length_stats(batch),
        "threads": threads,
        "device": device,
        **rlvr["settings"],
        "loss": rlvr["loss"],
        "naive_micro_batch_rows": NAIVE_MICRO_BATCH_ROWS,
        "num_hidden_layers": layers,
        "response_max": response_max,
        "seed": args.seed,
        "warmup": args.warmup,
        "steps": args.steps,
        "smoke": args.smoke,
    }
    for key, mode in (("cuda_peak_mb", rlvr), ("naive_cuda_peak_mb", naive)):
        if "cuda_peak_mib" in mode:
            summary[key] = mode["cuda_peak_mib"]
    return summary


def realistic_table(summary: dict, results: dict) -> str:
    """A markdown table of the two measurements, and the ratios."""
    s = summary
    settings = (f"micro_batch_rows={s['micro_batch_rows']}, micro_batch_tokens={s['micro_batch_tokens']}, "
                f"precision={s['precision']}, activation_checkpointing={s['activation_checkpointing']}")  # fmt: skip
    lines = [
        f"device: {s['device']}; {s['threads']} threads; {s['num_hidden_layers']} layers; {s['rows']} rows, "
        f"{s['real_tokens']} real tokens ({s['padded_tokens']} padded); times: median of {s['steps']} updates after "
        f"{s['warmup']} warm-up; tokens/s count real tokens; memory: RSS, MiB\n",
        f"{peak_words(s['peak'])}\n",
        "| implementation | update s (median) | update tokens/s | update GFLOP/s | of peak | logprobs s | logprobs tokens/s | "
        "RSS after build | peak RSS | peak - after build |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r, share in ((f"naive (micro-batches of {NAIVE_MICRO_BATCH_ROWS} rows, full padding, fp32)", results["naive"],
                            s["naive_peak_share"]), (f"rlvr Learner ({settings})", results["rlvr"], s["peak_share"])):  # fmt: skip
        update_s = statistics.median(r["update_s"])
        lines.append(f"| {name} | {update_s:.3f} | {s['real_tokens'] / update_s:,.0f} | {r['update_gflop'] / update_s:.1f} | "
                     f"{share:.0%} | {r['logprobs_s']:.3f} | "
                     f"{s['real_tokens'] / r['logprobs_s']:,.0f} | {r['rss_after_build_mib']:.0f} | {r['peak_rss_mib']:.0f} | "
                     f"{r['peak_rss_mib'] - r['rss_after_build_mib']:.0f} |")  # fmt: skip
    ratio = "n/a" if s["memory_ratio"] is None else f"{s['memory_ratio']:.2f}"
    lines.append(f"\nspeedup (update tokens/s, rlvr / naive): {s['speedup']:.2f}x; memory ratio (peak increment, "
                 f"rlvr / naive): {ratio}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(DEFAULT_SHAPES), help="default: tiny 135m (--smoke: tiny)")
    ap.add_argument("--worlds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rows", type=int, help="batch rows (default: 64; --smoke: 8)")
    ap.add_argument("--prompt-len", type=int, help="prompt tokens per row (default: 16 tiny, 64 135m)")
    ap.add_argument("--response-len", type=int, help="response tokens per row (default: 32 tiny, 128 135m)")
    ap.add_argument("--micro-batch-rows", type=int, default=8)
    ap.add_argument("--warmup", type=int, help="untimed updates first (default: 1; --realistic: 0)")
    ap.add_argument("--steps", type=int, help="timed updates, the median counts (default: 3; --realistic: 1)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="cores in all, split over the ranks (--realistic: each measurement's threads)")
    ap.add_argument("--micro-batch-tokens", default="auto", help="trainer.micro_batch_tokens (auto: as rlvr train resolves it; 0: rows only)")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"], help="trainer.precision (auto: as rlvr train resolves it)")
    ap.add_argument("--activation-checkpointing", nargs="?", const="true", default="auto", choices=["auto", "true", "false"],
                    help="trainer.activation_checkpointing (auto: as rlvr train resolves it; the bare flag: true)")
    ap.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank on every linear layer (0: every weight)")
    ap.add_argument("--pad", type=int, default=0, help="the last row's response this many tokens shorter (padding in a micro-batch)")
    ap.add_argument("--out", help="write every rank's numbers here (JSON)")
    ap.add_argument("--realistic", action="store_true", help="rlvr's Learner against the naive implementation on a realistic batch")
    ap.add_argument("--json", action="store_true", help="the last line of stdout: one JSON object")
    ap.add_argument("--smoke", action="store_true", help="seconds: the built-in model, 8 x (8 + 8) tokens, one update "
                    "(--realistic: 2 layers, 8 rows, responses up to 32 tokens)")
    ap.add_argument("--seed", type=int, default=0, help="(--realistic) the batch's seed")
    # worker mode (the launcher passes these to itself under torchrun)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--result-dir", help=argparse.SUPPRESS)
    ap.add_argument("--threads-per-rank", type=int, default=1, help=argparse.SUPPRESS)
    # realistic mode's measurement processes
    ap.add_argument("--realistic-worker", choices=["naive", "rlvr"], help=argparse.SUPPRESS)
    ap.add_argument("--batch-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    realistic = args.realistic or args.realistic_worker
    if args.steps is None:  # a realistic naive update is ~8 minutes on 2 cores: one of each, unless asked
        args.steps = 1 if realistic or args.smoke else 3
    if args.warmup is None:
        args.warmup = 0 if realistic or args.smoke else 1
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.models is None:
        args.models = ["tiny"] if args.smoke else ["tiny", "135m"]
    if args.smoke and not realistic:
        args.rows, args.prompt_len, args.response_len = (given or default for given, default in zip(
            (args.rows, args.prompt_len, args.response_len), SMOKE_SHAPE))  # fmt: skip
    if args.worker:
        worker(args)
        return
    if args.realistic_worker:
        realistic_worker(args)
        return
    if args.realistic:
        run_realistic(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp_name:
        tmp = Path(tmp_name)
        results = []
        cuda = torch.cuda.is_available()
        memory = "allocated" if cuda else "RSS"  # torch.cuda.max_memory_allocated, or the process's resident set
        device = torch.cuda.get_device_name() if cuda else f"CPU, {len(os.sched_getaffinity(0))} cores, no GPU"
        machine = machine_peak(args)
        print(f"device: {device}; times: median of {args.steps} updates after {args.warmup} warm-up; memory per rank "
              f"(r0 / r1), MiB{'' if cuda else '; peak RSS covers the whole process (checkpoint load included)'}; "
              f"{peak_words(machine)}\n")  # fmt: skip
        print(f"| model | params | world | threads/rank | rows x (prompt+response) | micro-batch rows / tokens; precision | update s (median) | "
              f"update tokens/s | update GFLOP/s | of peak | logprobs s | {memory} after build | peak {memory} | peak - after build |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for model in args.models:
            if model == "tiny":
                path = "builtin:tiny-arith"  # model.path as the recipes name it (the built-in model's own settings)
            else:
                path = str(build_random_llama(tmp / "smollm2-135m-random"))
            for world in args.worlds:
                ranks = launch(model, path, world, args, tmp)
                results.append({"model": model, "world": world, "ranks": ranks})
                print(table_row(model, ranks, machine), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps({"device": device, "steps": args.steps, "warmup": args.warmup, "smoke": args.smoke, "peak": machine,
                          "results": [summary_row(r["model"], r["ranks"], machine) for r in results]}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
