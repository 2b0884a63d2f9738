"""The device check: rlvr's learner on one GPU (an H200), on Qwen2.5-1.5B's shapes, and where vLLM is installed the
engine beside it (sleep, wake, weight and adapter pushes, CUDA graphs, `rlvr train`), on Qwen2.5-0.5B's, in at most 8
minutes.

    python scripts/gpu_check.py                 # on the GPU machine, from the repo root (rlvr need not be installed)
    python scripts/gpu_check.py --allow-cpu     # no GPU: the same code on a tiny Qwen2 and batch (CI's smoke test)

The GPU machine has torch and transformers but neither omegaconf (rlvr.config needs it) nor Hydra, and installs
nothing: carry them from the project's venv (pure Python) in a folder that git ignores, and put it on PYTHONPATH:

    echo /.pydeps/ >> .git/info/exclude; mkdir -p .pydeps
    cp -r .venv/lib/python3.*/site-packages/{omegaconf,antlr4,hydra} .pydeps/
    # then, there (carry: .pydeps):  PYTHONPATH=.pydeps PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py

Model: a randomly initialised Qwen2ForCausalLM with Qwen2.5-1.5B's shapes (hidden 1536, MLP 8960, 28 layers, 12 heads
over 2 KV heads, head_dim 128, q/k/v biases, vocabulary 151,936, tied head; 1.54B parameters), written as fp32
safetensors to a temp folder (no download: memory and time do not depend on the weights' values). Batch (seeded): 64
rows, prompts uniform in 150..250 tokens, responses long-tailed (lognormal, median 400, sigma 0.9, rounded and clamped
to [1, 2048]; 3 rows at exactly 2048), random token ids, right-padded. --allow-cpu: the same family shrunk (CPU_MODEL,
CPU_BATCH, a 256-token budget so that the batch splits). The settings are those a run would get, and every learner is
built as `rlvr train` builds its own (scripts/bench_config.py): the recipe tree (recipes/config.yaml and its defaults,
by Hydra's compose API, or by a plain OmegaConf merge of the same files where Hydra is missing) with model.path set to
the model, model.dtype=float32, lr 1e-6 constant and rollout.max_new_tokens the batch's longest response, validated,
every `auto` resolved by rlvr.settings.for_this_machine in a world of one, then Learner.from_config; the loss is the
recipe's (DAPO: rlvr.learner.loss_options). The learner always computes in bf16 (fp32 master weights), whatever the
device resolves.

Sections, in this order, each timed and printed as a markdown table as it goes; an exception in one (an OOM) is
recorded as a failed check and the next one runs:

 update     Learner.from_config(precision=bf16, and the resolved micro_batch_tokens, logits_chunk_tokens,
            activation_checkpointing, tf32), DAPO's loss: --warmup updates, one timed logprobs pass (the old logprobs),
            --steps timed updates (device synchronised around each; median). Update tokens/s = the batch's real tokens
            (prompt + response, no padding) / seconds. MFU = model FLOPs / seconds / --peak-tflops (989: the H100/H200
            SXM dense bf16 datasheet rate), model FLOPs = 6 x (the decoder layers' matmul parameters) x real tokens
            + 6 x vocab x hidden x response tokens (the head runs only there) + 6 x layers x heads x head_dim x
            sum(row length^2) (causal attention's two products, forward and backward); recompute is not counted.
            `mfu_6nd` is the plain 6 x all parameters x real tokens.
 plan       rlvr.memory.learner_memory (what `rlvr plan` adds up) for each micro-batch the learner makes of the batch
            (its padded tokens, row length and response tokens; rlvr.batching's plan), the largest, against
            torch.cuda.max_memory_allocated over the timed updates: within --plan-tol (15%).
 lifecycle  the engine's share held by a placeholder (torch.empty of rollout.gpu_memory_utilization x the device's
            memory, as a colocated vLLM holds it awake): one update at the resolved budget (sized for an engine that
            sleeps) - does it fit? - and one at the budget and checkpointing resolve gives with rollout.sleep=false
            (must fit; its peak less the share is also set against rlvr.memory's prediction); then the placeholder
            released (what sleep gives back) and empty_cache, and the first update again (must fit). Peaks include
            the placeholder. On CPU nothing is held: the code path runs.
 head       rlvr.lm_head.token_logprobs forward + backward on --head-tokens tokens of hidden 1536 x vocab 151,936
            under bf16 autocast (fp32 weight and hidden, as in the learner), at the old CPU rule's chunk (64 MiB of
            fp32 logits: 110 tokens), the resolved GPU chunk and 4096: median seconds, TFLOP/s (four products of
            2 M H V: forward, backward's recompute, the two gradients), peak memory over what was allocated before;
            logprobs and gradients must agree across chunk sizes, and the resolved chunk must beat the old one.
 numerics   response logprobs of --numerics-rows rows under fresh learners with trainer.precision=fp32 (TF32
            off) and bf16 on the same weights: max and mean abs difference within the tolerances.

The engine sections, after those: the only ones that import vLLM (rlvr.rollout, rlvr.startup). vLLM is blocked until
then (an `import vllm` on the learner's path fails here as it would on the lent GPU machine, which has none); where it
is not installed they are skipped ("skipped: vllm is not installed", engine_checked false: not a failed check). Their
model: a random Qwen2 of Qwen2.5-0.5B's shapes (hidden 896, MLP 4864, 24 layers, 14 heads over 2 KV heads, head_dim
64, q/k/v biases, vocabulary 151,936, tied head; 494M parameters) as fp32 safetensors, with tiny-arith's character
tokenizer padded by placeholder tokens to the full vocabulary (every id decodes; the arithmetic task's prompts encode).
Config: recipes/config.yaml (DAPO) with that model, data.max_prompt_tokens 256 and rollout.max_new_tokens 64,
resolved for the device as `rlvr train` resolves it; learner and engine built as rlvr.startup builds them
(Learner.from_config, then Engine.from_config: on a GPU bf16, CUDA graphs, sleep mode, the resolved KV cache), pushes
by rlvr.startup.push_weights. Logprobs compared: Engine.prompt_logprobs (vLLM's prompt logprobs, temperature 1) and
Learner.sequence_logprobs on the same sequences (4 prompts of 48-256 random ids + their 64 greedy tokens).

 engine     greedy generate; the checkpoint's logprobs: engine vs learner within --sync-mean-tol (0.02) and
            --sync-max-tol (0.3) nats; then --pushes (2) rounds of: sleep; (first round) two updates of the micro-batch
            `rlvr plan` plans for this config (its rows x 320 tokens; the second one's peak is the learner phase);
            noise of --push-noise (0.1) x each weight's RMS on every learner weight; the full-weight push (wakes the
            weights, loads, wakes the KV cache); the engine's logprobs moved (mean |change| >= --moved-factor (5) x
            the engine-learner mismatch) and match the learner's new ones (same tolerances); a greedy generate after
            the push. Then rlvr.plan.plan's per-phase GiB for this config on this GPU against what was measured:
            rollout phase (after the last push's generate: device memory used by the process, cudaMemGetInfo) and
            learner phase (torch.cuda.max_memory_allocated over the update beside the sleeping engine), host RSS
            (VmRSS, VmHWM) at both, and vLLM's own report (its model runner's model_memory_usage, its KV cache
            tensors) against the plan's engine weights and KV cache. Reported, not checked: nothing of it ran yet.
 adapters   the same with model.lora.rank=--lora-rank (8), model.lora.sync=adapter: an engine with LoRA enabled;
            the checkpoint (a fresh adapter is the base), then --pushes adapter pushes (noise of --adapter-noise
            (0.01) on every adapter weight, the peft folder loaded as a new vLLM adapter), each moved and matched.
 train      --train-steps (2; 0 under --allow-cpu) steps of `python -m rlvr train` in a process of its own on the same
            model (GRPO on the built-in task, 16 prompts x 4, 32 new tokens): exit 0, every step in metrics.jsonl,
            finite losses, no skipped update; its per-step timings and the children's peak RSS reported.

--allow-cpu runs the engine sections on vLLM's CPU build (no sleep mode: Engine(sleep=False), no CUDA graphs) with
CPU_MODEL's shapes (heads of 32: vLLM's CPU attention has no head_dim 16), 2 prompts, 6 new tokens, a 16-row update,
and no `rlvr train` steps (a fresh process costs ~13 s of imports on 2 cores; tests/test_gpu_check.py tests the
metrics reading on a file). The plan there describes an 80 GiB GPU: the code path, measured against nothing.

Then one line per check (ok / FAIL), a PASS or FAIL line, and as the very last line one JSON object with every number
(tokens_per_s, mfu, head_s, *_peak_bytes, plan_ratio, numerics_*, device, torch, elapsed_s; engine_checked,
engine_skipped, engine_start_s, engine_start_gap, engine_push_gaps / engine_push_moved and adapter_push_gaps /
adapter_push_moved (per push: mean_abs, max_abs, tokens), engine_phases (plan vs measured), train_step_s; and each
section's details under "sections"). Exit status 0 on pass, 1 on a failed check, 2 when there is no CUDA device and no
--allow-cpu. Sections left when --budget-s (420) has passed are skipped (a failed check).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path[:0] = [str(REPO), str(SCRIPTS)]  # rlvr from this checkout (not installed there), and bench_config
# As on the GPU machine, which has no vLLM: any `import vllm` on the learner's path raises ImportError, until the engine
# sections (the only ones that import rlvr.rollout) put back what was there (a warm test process imported it already).
_VLLM = sys.modules.get("vllm")
sys.modules["vllm"] = None  # type: ignore[assignment]

import torch  # noqa: E402

TINY_ASSETS = REPO / "rlvr" / "assets" / "tiny-arith"  # its tokenizer files serve the random model (ids beyond it are fine)
# Qwen/Qwen2.5-1.5B's config.json shapes (q/k/v biases are Qwen2's own)
QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                  hidden_act="silu", initializer_range=0.02, use_sliding_window=False,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
# Qwen/Qwen2.5-0.5B's (the engine sections' model: vLLM, a learner and `rlvr train` on one GPU in minutes)
QWEN25_05B = {**QWEN25_15B, **dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                   head_dim=64)}  # fmt: skip
# --allow-cpu: the same architecture family, shrunk so that a 2-core CPU runs the whole check in seconds
CPU_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, vocab_size=1024)  # fmt: skip
GPU_BATCH = dict(rows=64, prompt_min=150, prompt_max=250, response_median=400, response_sigma=0.9, response_max=2048, full_rows=3)
CPU_BATCH = dict(rows=8, prompt_min=8, prompt_max=24, response_median=16, response_sigma=0.9, response_max=64, full_rows=1)
CPU_MICRO_BATCH_TOKENS = 256  # several micro-batches on the tiny batch, so the per-micro-batch plan arithmetic runs
CPU_HEAD = dict(tokens=256, chunks=(64, 256))  # the tiny vocabulary's CPU rule would be one chunk: two that differ
GPU_HEAD_CHUNKS = (4096,)  # besides the old CPU rule's and the resolved one
MIB = 2**20
GIB = 2**30


def say(text: str = "") -> None:
    print(text, flush=True)


def cuda() -> bool:
    return torch.cuda.is_available()


def allocated() -> int | None:
    return torch.cuda.memory_allocated() if cuda() else None


def peak() -> int | None:
    return torch.cuda.max_memory_allocated() if cuda() else None


def reset_peak() -> None:
    if cuda():
        torch.cuda.reset_peak_memory_stats()


def free() -> None:
    """Drop what is unreachable and hand cached blocks back, so the next peak starts from what is live. (On CPU, where
    no peak is measured, the young generations only: a full collection beside vLLM's objects costs ~0.1 s a call.)"""
    gc.collect() if cuda() else gc.collect(1)
    if cuda():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), seconds), the device synchronised on both sides."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def rounded(x: Any) -> Any:
    """Floats to 4 significant digits for the JSON line (ints, strings, None and containers as they are)."""
    if isinstance(x, float):
        return float(f"{x:.4g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------------- set-up


def build_model(folder: Path, fields: dict) -> Path:
    """A randomly initialised Qwen2ForCausalLM of `fields`' shapes, fp32 safetensors, and a tokenizer, in `folder`
    (initialised on the GPU when there is one: 1.5B parameters initialise in seconds there, a minute on a CPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda" if cuda() else "cpu"):
        model = Qwen2ForCausalLM(Qwen2Config(**fields))  # fp32, random weights
    model.to("cpu")  # safetensors writes host memory
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    write_tokenizer(folder, fields["vocab_size"])
    free()
    return folder


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """The built-in model's character-level tokenizer (tiny-arith's 99 tokens: the arithmetic task's prompts encode as
    they do there) with placeholder tokens `<xN>` for every further id of the model's vocabulary, so that the engine
    decodes any id the random model samples."""
    tokenizer = json.loads((TINY_ASSETS / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab))), "tiny-arith's ids are 0..n-1"
    vocab.update({f"<x{i}>": i for i in range(len(vocab), vocab_size)})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    shutil.copy(TINY_ASSETS / "tokenizer_config.json", folder / "tokenizer_config.json")


def long_tailed_batch(rows: int, vocab_size: int, *, prompt_min: int, prompt_max: int, response_median: float,
                      response_sigma: float, response_max: int, full_rows: int, seed: int = 0):  # fmt: skip
    """(RolloutBatch, advantages [N]): uniform prompt lengths, lognormal response lengths clamped to [1, response_max]
    with `full_rows` rows at exactly response_max (finish reason "length"), random ids, right-padded."""
    from rlvr.types import Completion, RolloutBatch

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(prompt_min, prompt_max + 1, (rows,), generator=g)  # [N]
    response = torch.exp(math.log(response_median) + response_sigma * torch.randn(rows, generator=g)).round().clamp(1, response_max).long()
    response[torch.randperm(rows, generator=g)[:full_rows]] = response_max  # [N]
    ids = torch.randint(3, vocab_size, (rows, int((prompt + response).max())), generator=g)  # [N, L]
    completions = [
        Completion(prompt_ids=row[:p], token_ids=row[p : p + r], text="", engine_logprobs=[0.0] * r,
                   finish_reason="length" if r == response_max else "stop")  # fmt: skip
        for row, p, r in zip(ids.tolist(), prompt.tolist(), response.tolist())
    ]
    advantages = torch.randn(rows, generator=g)  # [N]
    rewards = [float(a > 0) for a in advantages.tolist()]
    return RolloutBatch.from_completions(completions, rewards, [r > 0 for r in rewards], pad_id=0), advantages


def run_overrides(model_path: str, batch_spec: dict) -> list[str]:
    """What the check fixes on top of the run's config (recipes/config.yaml, DAPO): the model, fp32 master weights, a
    constant lr of 1e-6 from the first update, the batch's longest response as rollout.max_new_tokens."""
    return [f"model.path={model_path}", "model.dtype=float32", "trainer.lr=1e-6", "trainer.warmup_steps=0",
            "trainer.lr_schedule=constant", f"rollout.max_new_tokens={batch_spec['response_max']}"]  # fmt: skip


def resolved_settings(model_path: str, batch_spec: dict, *, sleep: bool | None = None):
    """(cfg, shape, Settings, composition method): what `rlvr train model.path=<model>` resolves on this device
    (scripts/bench_config.py: the recipe tree composed, validated, rlvr.settings.for_this_machine in a world of one)."""
    from bench_config import composition, run_config, settings_of

    from rlvr.memory import ModelShape

    cfg = run_config(*run_overrides(model_path, batch_spec), *([] if sleep is None else [f"rollout.sleep={str(sleep).lower()}"]))
    shape = ModelShape.from_config(json.loads((Path(model_path) / "config.json").read_text()))
    return cfg, shape, settings_of(cfg), composition()


def make_learner(ctx: dict, *, precision: str, tf32: bool | None = None):
    """A Learner as `rlvr train` builds one in a world of one (Learner.from_config; fp32 master weights, no reference),
    with the check's settings: `s`'s (the resolved ones), the check's micro-batch budget, `precision` (and `tf32`)."""
    from bench_config import build_learner, run_config

    s = ctx["settings"]
    cfg = run_config(*run_overrides(ctx["model_path"], ctx["batch_spec"]), f"trainer.precision={precision}",
                     f"trainer.micro_batch_rows={ctx['micro_batch_rows']}", f"trainer.micro_batch_tokens={ctx['micro_batch_tokens']}",
                     f"trainer.activation_checkpointing={str(s.activation_checkpointing).lower()}",
                     f"trainer.logits_chunk_tokens={s.logits_chunk_tokens}", f"trainer.tf32={str(s.tf32 if tf32 is None else tf32).lower()}")  # fmt: skip
    return build_learner(cfg)


def finite(metrics: dict) -> bool:
    return all(math.isfinite(v) for v in metrics.values()) and metrics.get("bad", 0.0) == 0.0


def micro_batch_shapes(batch: Any, *, max_rows: int, max_tokens: int) -> list[dict]:
    """The learner's micro-batches of `batch` (rlvr.batching's plan): rows, row length (the longest), padded tokens
    and response tokens of each."""
    from rlvr.batching import micro_batches

    lengths = batch.attention_mask.sum(1).tolist()
    responses = [int(r) for r in batch.response_mask.sum(1).tolist()]
    out = []
    for rows in micro_batches(lengths, max_rows=max_rows, max_tokens=max_tokens):
        row = max(lengths[i] for i in rows)
        out.append({"rows": len(rows), "row_tokens": row, "tokens": len(rows) * row, "response_tokens": sum(responses[i] for i in rows)})
    return out


def model_flops(shape: Any, batch: Any) -> dict:
    """FLOPs of one update's useful work (forward + backward = 3 x forward; no recompute): the decoder's matmuls at
    every real token, the LM head at response tokens, causal attention's two products per row."""
    lengths = batch.attention_mask.sum(1).double()  # [N]
    tokens, response = float(lengths.sum()), float(batch.response_mask.sum())
    dense = 6.0 * shape.num_layers * shape.linear_params * tokens
    head = 6.0 * shape.vocab_size * shape.hidden_size * response
    attention = 6.0 * shape.num_layers * shape.q_dim * float((lengths**2).sum())  # 2 products x 2 L^2 d / 2 (causal) x 3
    return {"dense": dense, "head": head, "attention": attention, "total": dense + head + attention,
            "six_nd": 6.0 * shape.num_params * tokens}  # fmt: skip


# --------------------------------------------------------------------------------------------------------- sections


def section_update(ctx: dict, args: argparse.Namespace) -> dict:
    """bf16 update throughput, MFU, and the peak over the timed updates (for the plan check)."""
    batch, advantages, shape = ctx["batch"], ctx["advantages"], ctx["shape"]
    learner, build_s = timed(lambda: make_learner(ctx, precision="bf16"))
    ctx["learner"] = learner
    mask, options = batch.response_mask, ctx["loss"]
    history, warmup_s = [], []
    for _ in range(args.warmup):  # pi_old = pi_theta; the first update pays AdamW's state, cuBLAS handles, kernel choice
        m, sec = timed(lambda: learner.update(batch, advantages, mask, None, None, options=options))
        history.append(m)
        warmup_s.append(sec)
    old_logprobs, logprobs_s = timed(lambda: learner.logprobs(batch))  # [N, T]
    ctx["old_logprobs"] = old_logprobs
    resident = allocated()
    reset_peak()
    overall = 0
    segments: list[int] = []  # the peak of the current micro-batch (forward, backward; the last one's: and the step)
    per_micro_batch: list[int] = []  # the largest over the timed updates, by micro-batch

    def mark(*_: Any) -> None:  # at each micro-batch's forward: close the last segment (host-side allocator stats, no sync)
        if cuda():
            segments.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    hook = learner.model.register_forward_pre_hook(mark)
    step_s = []
    try:
        for _ in range(args.steps):
            segments.clear()
            m, sec = timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, options=options))
            mark()
            history.append(m)
            step_s.append(sec)
            overall = max([overall, *segments])
            seg = segments[1:]  # segments[0]: from the last update's end to this one's first forward
            per_micro_batch = [max(a, b) for a, b in zip(per_micro_batch, seg)] if per_micro_batch else seg
    finally:
        hook.remove()
    update_s = statistics.median(step_s)
    real = int(batch.attention_mask.sum())
    flops = model_flops(shape, batch)
    peak_flops = args.peak_tflops * 1e12
    r = {
        "build_s": build_s,
        "warmup_s": warmup_s,
        "update_s": step_s,
        "update_s_median": update_s,
        "logprobs_s": logprobs_s,
        "tokens_per_s": real / update_s,
        "response_tokens_per_s": int(mask.sum()) / update_s,
        "logprobs_tokens_per_s": real / logprobs_s,
        "model_tflop_per_update": flops["total"] / 1e12,
        "tflops": flops["total"] / update_s / 1e12,
        "mfu": flops["total"] / update_s / peak_flops,
        "mfu_6nd": flops["six_nd"] / update_s / peak_flops,
        "flops_split": {k: v / flops["total"] for k, v in flops.items() if k not in ("total", "six_nd")},
        "resident_bytes": resident,
        "peak_bytes": overall if cuda() else None,
        "peak_bytes_per_micro_batch": per_micro_batch if cuda() else None,
        "finite": all(finite(m) for m in history),
        "pg_loss": [m["pg_loss"] for m in history],
        "grad_norm": [m["grad_norm"] for m in history],
    }
    say("| update | value |\n|---|---|")
    for label, value in [
        ("learner build s", f"{build_s:.1f}"),
        ("warm-up update s", ", ".join(f"{x:.2f}" for x in warmup_s)),
        (f"update s (median of {args.steps})", f"{update_s:.3f} ({', '.join(f'{x:.3f}' for x in step_s)})"),
        ("update tokens/s (real tokens)", f"{r['tokens_per_s']:,.0f}"),
        ("update response tokens/s", f"{r['response_tokens_per_s']:,.0f}"),
        ("logprobs pass s (tokens/s)", f"{logprobs_s:.3f} ({r['logprobs_tokens_per_s']:,.0f})"),
        ("model TFLOP per update (dense / head / attention)", f"{r['model_tflop_per_update']:.1f} ("
         + " / ".join(f"{100 * x:.0f}%" for x in r["flops_split"].values()) + ")"),
        (f"achieved TFLOP/s; MFU vs {args.peak_tflops:g}", f"{r['tflops']:.0f}; {100 * r['mfu']:.1f}%"),
        ("MFU by 6 x params x tokens", f"{100 * r['mfu_6nd']:.1f}%"),
        ("allocated between updates GiB; peak over timed updates GiB", f"{gib(resident)}; {gib(r['peak_bytes'])}"),
        ("pg_loss; grad_norm (per update)", f"{', '.join(f'{v:.4g}' for v in r['pg_loss'])}; {', '.join(f'{v:.3g}' for v in r['grad_norm'])}"),
    ]:  # fmt: skip
        say(f"| {label} | {value} |")
    ctx["checks"].append(("update: loss, grad norm and metrics finite, no skipped step", r["finite"]))
    return r


def section_head(ctx: dict, args: argparse.Namespace) -> dict:
    """The chunked LM head, forward + backward, at several chunk sizes."""
    from rlvr.lm_head import token_logprobs
    from rlvr.settings import CPU_LOGITS_CHUNK_BYTES

    shape, s = ctx["shape"], ctx["settings"]
    h, v = shape.hidden_size, shape.vocab_size
    device = torch.device("cuda" if cuda() else "cpu")
    m = args.head_tokens if cuda() else CPU_HEAD["tokens"]
    repeats = args.head_repeats if cuda() else 1
    old_rule = max(1, CPU_LOGITS_CHUNK_BYTES // (4 * v))
    chunks = sorted({old_rule, s.logits_chunk_tokens, *GPU_HEAD_CHUNKS} if cuda() else set(CPU_HEAD["chunks"]))
    g = torch.Generator(device=device).manual_seed(0)
    weight = (0.02 * torch.randn(v, h, generator=g, device=device)).requires_grad_()  # fp32 master weight [V, H]
    hidden = torch.randn(m, h, generator=g, device=device).requires_grad_()  # fp32 final-norm output [M, H]
    targets = torch.randint(0, v, (m,), generator=g, device=device)  # [M]
    upstream = torch.randn(m, generator=g, device=device)  # [M] d loss / d logp

    def step(chunk: int) -> torch.Tensor:
        weight.grad = hidden.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logp, _ = token_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=chunk)
        (logp * upstream).sum().backward()
        return logp.detach()

    rows, results, reference = [], {}, None
    for chunk in chunks:
        step(chunk)  # warm-up (kernel choice, allocator)
        weight.grad = hidden.grad = None
        free()
        before = allocated()
        times = []
        for _ in range(repeats):
            logp, sec = timed(lambda: step(chunk))  # noqa: B023
            times.append(sec)
        top = peak()
        sec = statistics.median(times)
        flop = 4 * 2.0 * m * h * v
        out = (logp.float(), weight.grad.float(), hidden.grad.float())
        if reference is None:
            reference = out
        diff = max(float((a - b).norm() / b.norm().clamp(min=1e-30)) for a, b in zip(out, reference))
        label = "old CPU rule (64 MiB fp32)" if chunk == old_rule and cuda() else ("resolved" if chunk == s.logits_chunk_tokens else "")
        results[str(chunk)] = {"s": sec, "tflops": flop / sec / 1e12, "peak_bytes": None if top is None else top - before,
                               "rel_diff_vs_first": diff, "label": label}  # fmt: skip
        rows.append(f"| {chunk} {label} | {sec * 1e3:.1f} | {flop / sec / 1e12:.0f} | {gib(None if top is None else top - before)} | {diff:.2e} |")
    weight.grad = hidden.grad = None
    say(f"| head: {m} tokens x hidden {h} x vocab {v}, bf16 autocast, fwd+bwd: chunk tokens | ms (median of {repeats}) "
        "| TFLOP/s | peak over before GiB | rel. diff vs smallest chunk |\n|---|---|---|---|---|")  # fmt: skip
    for row in rows:
        say(row)
    r = {"tokens": m, "old_rule_chunk": old_rule, "resolved_chunk": s.logits_chunk_tokens, "chunks": results}
    agree = all(x["rel_diff_vs_first"] <= args.head_tol for x in results.values())
    ctx["checks"].append((f"head: logprobs and gradients agree across chunk sizes (rel. diff <= {args.head_tol})", agree))
    if cuda() and str(old_rule) in results and str(s.logits_chunk_tokens) in results and old_rule != s.logits_chunk_tokens:
        speedup = results[str(old_rule)]["s"] / results[str(s.logits_chunk_tokens)]["s"]
        r["speedup_resolved_vs_old"] = speedup
        ctx["checks"].append((f"head: the resolved chunk ({s.logits_chunk_tokens}) is faster than the old {old_rule} ({speedup:.2f}x)", speedup > 1.0))
    return r


def section_lifecycle(ctx: dict, args: argparse.Namespace) -> dict:
    """Updates beside the engine's awake share (a placeholder allocation), then after releasing it."""
    learner, batch, advantages, cfg, s = ctx["learner"], ctx["batch"], ctx["advantages"], ctx["cfg"], ctx["settings"]
    awake = ctx["awake_settings"]  # what resolve gives with rollout.sleep=false: a budget beside the awake engine
    mask, options, old_logprobs = batch.response_mask, ctx["loss"], ctx["old_logprobs"]
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda() else 0
    share = int(cfg.rollout.gpu_memory_utilization * total)  # 0 on CPU (--allow-cpu runs the code path, nothing held)

    def attempt(tokens: int, checkpointing: bool) -> dict:
        learner.micro_batch_tokens = tokens  # read at each update's micro-batch plan
        if checkpointing != s.activation_checkpointing:  # the learner was built with `s`'s; HF's switch on the same module
            if checkpointing:
                learner.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                learner.model.gradient_checkpointing_disable()
        free()
        try:
            metrics, sec = timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, options=options))
            out = {"fits": True, "s": sec, "finite": finite(metrics)}
        except RuntimeError as e:  # an OOM is the point of the test: report it, and leave the learner clean
            if not isinstance(e, torch.OutOfMemoryError) and "out of memory" not in str(e):
                raise
            out = {"fits": False, "error": str(e).splitlines()[0][:200]}
        finally:
            learner.optimizer.zero_grad(set_to_none=True)
            learner.micro_batch_tokens = s.micro_batch_tokens
            if checkpointing != s.activation_checkpointing:
                if s.activation_checkpointing:
                    learner.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                else:
                    learner.model.gradient_checkpointing_disable()
        out.update(micro_batch_tokens=tokens, activation_checkpointing=checkpointing, peak_bytes=peak())
        return out

    phases = {}
    placeholder = torch.empty(share, dtype=torch.uint8, device="cuda" if cuda() else "cpu")  # the engine awake: weights, KV cache
    phases["awake_sleep_budget"] = attempt(ctx["micro_batch_tokens"], s.activation_checkpointing)
    phases["awake_awake_budget"] = attempt(awake.micro_batch_tokens, awake.activation_checkpointing)
    del placeholder  # the engine sleeps: its weights to host memory, its KV cache dropped
    learner.release_memory()  # what the trainer calls before the engine wakes: the learner's cached blocks back
    free()
    phases["asleep"] = attempt(ctx["micro_batch_tokens"], s.activation_checkpointing)
    # the plan's arithmetic for the awake budget (its own checkpointing) against that peak less the placeholder
    awake_predicted = predict(ctx, tokens=awake.micro_batch_tokens, checkpointing=awake.activation_checkpointing)[0]
    awake_peak = phases["awake_awake_budget"]["peak_bytes"]
    awake_ratio = (awake_peak - share) / awake_predicted if awake_peak is not None and phases["awake_awake_budget"]["fits"] else None
    say(f"| lifecycle: engine share {gib(share)} GiB ({cfg.rollout.gpu_memory_utilization} of {gib(total)} GiB) | micro_batch_tokens "
        "| activation checkpointing | fits | peak allocated GiB (with the share) |\n|---|---|---|---|---|")  # fmt: skip
    for label, key in (("engine awake, budget resolved for sleep=true", "awake_sleep_budget"),
                       ("engine awake, budget resolved for sleep=false", "awake_awake_budget"),
                       ("engine asleep (share released, empty_cache), budget for sleep=true", "asleep")):  # fmt: skip
        p = phases[key]
        say(f"| {label} | {p['micro_batch_tokens']} | {'on' if p['activation_checkpointing'] else 'off'} | "
            f"{'yes' if p['fits'] else 'no (OOM)'} | {gib(p['peak_bytes'])} |")  # fmt: skip
    if awake_ratio is not None:
        say(f"(budget for sleep=false: peak less the share {gib(awake_peak - share)} GiB, rlvr.memory predicts "
            f"{gib(awake_predicted)} GiB: ratio {awake_ratio:.3f})")  # fmt: skip
    ctx["checks"].append(("lifecycle: the update fits once the engine's share is released",
                          phases["asleep"]["fits"] and phases["asleep"].get("finite", False)))  # fmt: skip
    ctx["checks"].append(("lifecycle: with the engine awake, the budget resolved for sleep=false fits", phases["awake_awake_budget"]["fits"]))
    return {"engine_share_bytes": share, "device_bytes": total, **phases, "awake_budget_predicted_bytes": awake_predicted,
            "awake_budget_plan_ratio": awake_ratio}  # fmt: skip


def predict(ctx: dict, *, tokens: int, checkpointing: bool) -> tuple[int, dict, dict, list[dict]]:
    """rlvr.memory.learner_memory (what `rlvr plan` adds up) for each micro-batch the learner makes of the batch at a
    token budget: (the largest total, its parts, its micro-batch, every micro-batch)."""
    from rlvr.memory import learner_memory

    s, shape = ctx["settings"], ctx["shape"]
    plan = micro_batch_shapes(ctx["batch"], max_rows=ctx["micro_batch_rows"], max_tokens=tokens)
    predictions = []
    for mb in plan:
        parts = learner_memory(shape, world_size=1, precision="bf16", sharded=False, autocast=True, checkpointing=checkpointing, tokens=mb["tokens"],
                               chunk_tokens=s.logits_chunk_tokens, reference=False, seq_len=mb["row_tokens"],
                               response_tokens=mb["response_tokens"])  # fmt: skip
        mb["predicted_bytes"] = sum(parts.values())
        predictions.append((mb["predicted_bytes"], parts, mb))
    predicted, parts, worst = max(predictions, key=lambda p: p[0])
    return predicted, parts, worst, plan


def section_plan(ctx: dict, args: argparse.Namespace) -> dict:
    """rlvr.memory's prediction for the timed updates' micro-batches against their measured peak: the update's (the
    check), and micro-batch by micro-batch (rlvr.memory models one that is not the first of its update: the first
    has no gradients yet)."""
    predicted, parts, worst, plan = predict(ctx, tokens=ctx["micro_batch_tokens"], checkpointing=ctx["settings"].activation_checkpointing)
    update = ctx["results"].get("update", {})
    measured, per_mb = update.get("peak_bytes"), update.get("peak_bytes_per_micro_batch")
    ratio = None if measured is None else measured / predicted
    say("| plan vs measured: micro-batch (rows x row tokens = padded tokens, response tokens) | predicted GiB | measured GiB | ratio |")
    say("|---|---|---|---|")
    rows = []
    for i, mb in enumerate(plan):
        got = per_mb[i] if per_mb and i < len(per_mb) else None
        r = {**mb, "measured_bytes": got, "ratio": None if got is None else got / mb["predicted_bytes"]}
        rows.append(r)
        note = " (first: no gradients yet)" if i == 0 else ""
        shown = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        say(f"| {i}{note}: {mb['rows']} x {mb['row_tokens']} = {mb['tokens']}, {mb['response_tokens']} | {gib(mb['predicted_bytes'])} | "
            f"{gib(got)} | {shown} |")  # fmt: skip
    say(f"| the update: largest prediction ({', '.join(f'{k} {v / GIB:.2f}' for k, v in parts.items())}) vs max_memory_allocated | "
        f"{gib(predicted)} | {gib(measured)} | {'-' if ratio is None else f'{ratio:.3f}'} |")  # fmt: skip
    later = [r for r in rows[1:] if r["measured_bytes"] is not None]
    steady = max(r["measured_bytes"] for r in later) / max(r["predicted_bytes"] for r in later) if later else None
    if ratio is not None:
        ctx["checks"].append((f"plan: measured peak within {100 * args.plan_tol:.0f}% of rlvr.memory's prediction ({ratio:.3f})",
                              abs(ratio - 1) <= args.plan_tol))  # fmt: skip
    return {"micro_batches": rows, "predicted_bytes": predicted, "predicted_parts": parts, "measured_bytes": measured,
            "ratio": ratio, "within_tol": None if ratio is None else abs(ratio - 1) <= args.plan_tol,
            "ratio_after_first": steady}  # fmt: skip


def section_numerics(ctx: dict, args: argparse.Namespace) -> dict:
    """Response logprobs of the first rows under fresh fp32 and bf16 learners (the same weights)."""
    batch = ctx["batch"].select(torch.arange(min(args.numerics_rows, ctx["batch"].num_rows)))
    logp = {}
    for precision in ("fp32", "bf16"):
        torch.set_float32_matmul_precision("highest")  # an earlier learner's tf32=True is process-wide: off for fp32
        learner = make_learner(ctx, precision=precision, tf32=False)
        logp[precision] = learner.logprobs(batch)  # [n, T] fp32, on the CPU
        del learner
        free()
    counted = batch.response_mask.bool()
    diff = (logp["bf16"] - logp["fp32"]).abs()[counted]
    r = {"rows": batch.num_rows, "tokens": int(counted.sum()), "finite": all(bool(torch.isfinite(x[counted]).all()) for x in logp.values()),
         "max_abs": diff.max().item(), "mean_abs": diff.mean().item(), "mean_logp_fp32": logp["fp32"][counted].mean().item()}  # fmt: skip
    say("| numerics: bf16 vs fp32 logprobs | value |\n|---|---|")
    say(f"| response tokens ({r['rows']} rows) | {r['tokens']} |")
    say(f"| max abs diff (tol {args.max_abs_tol}) | {r['max_abs']:.4g} |")
    say(f"| mean abs diff (tol {args.mean_abs_tol}) | {r['mean_abs']:.4g} |")
    say(f"| mean fp32 logprob | {r['mean_logp_fp32']:.3f} |")
    ctx["checks"].append(("numerics: logprobs finite (fp32 and bf16)", r["finite"]))
    ctx["checks"].append(("numerics: bf16-vs-fp32 max abs diff within tol", r["max_abs"] <= args.max_abs_tol))
    ctx["checks"].append(("numerics: bf16-vs-fp32 mean abs diff within tol", r["mean_abs"] <= args.mean_abs_tol))
    return r


# -------------------------------------------------------------------------------------------------- engine sections
# The only sections that import vLLM (rlvr.rollout): where it is not installed (the lent GPU machine) they are
# reported as skipped, and the learner's sections above stand on their own.

ENGINE_GPU = dict(prompts=(48, 96, 160, 256), new_tokens=64, max_prompt_tokens=256, update_rows=0)
# --allow-cpu: CPU_MODEL's shapes but heads of 32 (vLLM's CPU attention has no kernel for head_dim 16), a few short
# prompts, an update of 16 rows (the plan's micro-batch is cut there)
ENGINE_CPU_MODEL = {**CPU_MODEL, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
ENGINE_CPU = dict(prompts=(7, 12), new_tokens=6, max_prompt_tokens=16, update_rows=16)
# --allow-cpu: rlvr plan describes a GPU of this size (the code path; nothing is measured against it)
PLAN_CPU_GIB = 80.0
TRAIN_OVERRIDES = ["recipe=grpo", "algo.group_size=4", "algo.prompts_per_step=16", "algo.prompts_per_minibatch=8",
                   "rollout.max_new_tokens=32", "data.eval_size=32", "reward.workers=0", "trainer.save_every=0",
                   "trainer.eval_every=0", "logger.progress=false"]  # fmt: skip


def host_memory() -> dict:
    """This process's resident host memory now and its peak so far (/proc/self/status: VmRSS, VmHWM), in bytes."""
    out: dict = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_bytes" if key == "VmRSS" else "rss_peak_bytes"] = int(value.split()[0]) * 1024
    return out


def memory_now() -> dict:
    """Where memory stands: the device's used bytes (everything this process holds there: the CUDA context, vLLM's
    pools, torch's cache; cudaMemGetInfo), torch's allocated and peak-allocated bytes, the host's RSS now and at peak."""
    out = host_memory()
    if cuda():
        torch.cuda.synchronize()
        free_bytes, total = torch.cuda.mem_get_info()
        out.update(device_used_bytes=total - free_bytes, allocated_bytes=torch.cuda.memory_allocated(),
                   peak_allocated_bytes=torch.cuda.max_memory_allocated())  # fmt: skip
    return out


def _vllm_memory(worker: Any) -> dict:
    """vLLM's own account of its memory, read inside its worker (collective_rpc): the weights as its model runner
    measured them at load (model_memory_usage), the KV cache's tensors (distinct storages) and blocks."""
    runner, cache = worker.model_runner, worker.cache_config
    storages: dict[int, int] = {}
    stack = list(getattr(runner, "kv_caches", None) or [])
    while stack:
        t = stack.pop()
        if isinstance(t, (list, tuple)):
            stack.extend(t)
        elif isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    weights = getattr(runner, "model_memory_usage", None)
    return {"weights_bytes": None if weights is None else int(weights), "kv_cache_bytes": sum(storages.values()) or None,
            "kv_blocks": getattr(cache, "num_gpu_blocks", None), "block_size": getattr(cache, "block_size", None)}  # fmt: skip


def _vllm_facts(worker: Any) -> dict:
    """Which model runner vLLM chose and whether it captured CUDA graphs (read inside its worker)."""
    runner, compilation = worker.model_runner, worker.vllm_config.compilation_config
    return {"model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
            "enforce_eager": bool(worker.vllm_config.model_config.enforce_eager)}  # fmt: skip


def engine_facts(engine: Any) -> dict:
    try:
        facts = engine.llm.collective_rpc(_vllm_facts)[0]
    except Exception as e:  # a report is not a check: say why it is missing
        facts = {"error": f"{type(e).__name__}: {e}"[:200]}
    return {**facts, "sleep_level": getattr(engine.memory, "level", None)}


def vllm_memory(engine: Any) -> dict:
    try:
        return engine.llm.collective_rpc(_vllm_memory)[0]
    except Exception as e:  # a report is not a check: say why it is missing
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def gap(a: list[list[float]], b: list[list[float]]) -> dict:
    """Mean and max |a - b| over every token of every sequence."""
    x, y = torch.tensor([v for row in a for v in row]), torch.tensor([v for row in b for v in row])
    assert x.shape == y.shape, (x.shape, y.shape)
    d = (x - y).abs()
    return {"tokens": d.numel(), "mean_abs": d.mean().item(), "max_abs": d.max().item(), "finite": bool(torch.isfinite(d).all())}  # fmt: skip


def engine_logprobs(engine: Any, seqs: list[list[int]]) -> list[list[float]]:
    return [engine.prompt_logprobs(ids) for ids in seqs]  # [len(ids) - 1] each


def learner_logprobs(learner: Any, seqs: list[list[int]]) -> list[list[float]]:
    return [learner.sequence_logprobs(ids).tolist() for ids in seqs]  # [len(ids) - 1] each


@torch.no_grad()
def perturb(learner: Any, *, relative: float, absolute: float, seed: int) -> None:
    """Move every trained parameter as a large update would: Gaussian noise of `relative` x the parameter's RMS per
    element, or of `absolute` where that is 0 (or relative is 0: a LoRA adapter, whose B starts at zero)."""
    for i, p in enumerate(learner.trainable):
        g = torch.Generator(device=p.device).manual_seed(seed * 100_003 + i)
        rms = float(p.float().pow(2).mean().sqrt())
        scale = relative * rms if relative and rms > 0 else absolute
        p.add_(scale * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))


def engine_overrides(ctx: dict, *extra: str) -> list[str]:
    e = ctx["engine_spec"]
    return [f"model.path={ctx['engine_model']}", "model.dtype=float32", "trainer.lr=1e-6", "trainer.warmup_steps=0",
            "trainer.lr_schedule=constant", f"rollout.max_new_tokens={e['new_tokens']}",
            f"data.max_prompt_tokens={e['max_prompt_tokens']}", *extra]  # fmt: skip


def planned(ctx: dict, overrides: list[str]) -> dict:
    """rlvr plan's arithmetic (rlvr.plan.plan) for the config: on this GPU (its memory and name), or with --allow-cpu
    on a described PLAN_CPU_GIB GPU."""
    from bench_config import UNUSED_OUTPUT, compose

    from rlvr.config import validate
    from rlvr.plan import plan

    raw = validate(compose([UNUSED_OUTPUT, *overrides]))
    if cuda():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gib_total, name = props.total_memory / GIB, props.name
    else:
        gib_total, name = PLAN_CPU_GIB, f"a described {PLAN_CPU_GIB:g} GiB GPU (--allow-cpu)"
    return plan(raw, ctx["engine_shape"], gpus=1, memory_gib=gib_total, gpu_name=name, builtin=False)


def engine_setup(ctx: dict) -> None:
    """The engine sections' model (Qwen2.5-0.5B's shapes; --allow-cpu: CPU_MODEL's), its prompts (seeded random ids)."""
    from rlvr.memory import ModelShape

    if "engine_model" in ctx:
        return
    spec = ctx["engine_spec"] = ENGINE_GPU if cuda() else ENGINE_CPU
    fields = {**QWEN25_05B, **({} if cuda() else ENGINE_CPU_MODEL)}
    ctx["engine_model"], ctx["engine_model_s"] = timed(lambda: str(build_model(Path(ctx["tmp"]) / "engine-model", fields)))  # fmt: skip
    ctx["engine_shape"] = ModelShape.from_config({**fields, "model_type": "qwen2"})
    g = torch.Generator().manual_seed(1)
    ctx["engine_prompts"] = [tuple(torch.randint(3, fields["vocab_size"], (n,), generator=g).tolist()) for n in spec["prompts"]]  # fmt: skip


@contextlib.contextmanager
def engine_and_learner(ctx: dict, overrides: list[str], *, lora_rank: int = 0) -> Iterator[tuple[Any, Any, Any, dict]]:
    """(engine, learner, cfg, timings) as `rlvr train` builds them (Learner.from_config, then Engine.from_config with
    the resolved rollout settings); the engine is shut down and both dropped on the way out, whatever happened."""
    from bench_config import build_learner, run_config

    from rlvr.rollout import Engine

    cfg = run_config(*overrides)
    spec = ctx["engine_spec"]
    learner, learner_s = timed(lambda: build_learner(cfg))
    engine = None
    try:
        engine, engine_s = timed(lambda: Engine.from_config(ctx["engine_model"], cfg, spec["max_prompt_tokens"] + spec["new_tokens"],
                                                            lora_rank=lora_rank))  # fmt: skip
        yield engine, learner, cfg, {"learner_build_s": learner_s, "engine_start_s": engine_s}
    finally:
        if engine is not None:
            engine.close()
        del engine, learner
        free()


def sync_checks(ctx: dict, args: argparse.Namespace, prefix: str, label: str, moved: dict | None, follows: dict) -> None:  # fmt: skip
    """The named checks of one comparison: the engine's logprobs match the learner's (and moved, after a push)."""
    ok = follows["finite"] and follows["mean_abs"] <= args.sync_mean_tol and follows["max_abs"] <= args.sync_max_tol
    ctx["checks"].append((f"{prefix}: {label}: the engine's logprobs match the learner's (mean |diff| {follows['mean_abs']:.2e} <= "
                          f"{args.sync_mean_tol:g}, max {follows['max_abs']:.2e} <= {args.sync_max_tol:g}; {follows['tokens']} tokens)", ok))  # fmt: skip
    if moved is not None:
        floor = args.moved_factor * max(follows["mean_abs"], 1e-6)
        ctx["checks"].append((f"{prefix}: {label}: the engine's logprobs moved (mean |change| {moved['mean_abs']:.2e} >= "
                              f"{args.moved_factor:g} x the mismatch, {floor:.2e})", moved["mean_abs"] >= floor))  # fmt: skip


def push_rounds(ctx: dict, args: argparse.Namespace, prefix: str, engine: Any, learner: Any, cfg: Any, sync: str | None,
                seqs: list[list[int]], *, before_push: Callable[[int], dict] | None = None) -> list[dict]:  # fmt: skip
    """--pushes times: sleep, (before_push), perturb the learner, push as the run does (rlvr.startup.push_weights:
    full weights, or the adapter's folder), then the engine's logprobs on the same sequences against the learner's, and
    a greedy generation after the push."""
    from rlvr.startup import push_weights

    spec = ctx["engine_spec"]
    e_prev, l_prev = engine_logprobs(engine, seqs), learner_logprobs(learner, seqs)
    rounds = []
    for k in range(1, args.pushes + 1):
        r: dict = {"awake": memory_now(), "vllm_awake": vllm_memory(engine)}
        engine.sleep()  # the learner's phase
        r["asleep"] = memory_now()
        kv = r["vllm_awake"].get("kv_cache_bytes")
        if cuda() and cfg.rollout.sleep:  # sleep drops the KV cache at either level (and the weights at level 2)
            r["freed_bytes"] = r["awake"]["device_used_bytes"] - r["asleep"]["device_used_bytes"]
            ctx["checks"].append((f"{prefix}: push {k}: sleep gave the device back at least 90% of the KV cache (freed "
                                  f"{gib(r['freed_bytes'])} GiB, KV cache {gib(kv)} GiB)", kv is not None and r["freed_bytes"] >= 0.9 * kv))  # fmt: skip
        if before_push is not None:
            r.update(before_push(k))
        relative = args.push_noise if sync is None else 0.0
        perturb(learner, relative=relative, absolute=args.adapter_noise, seed=k)
        l_new = learner_logprobs(learner, seqs)
        learner.release_memory()
        _, r["push_s"] = timed(lambda: push_weights(engine, learner, sync, Path(ctx["tmp"]) / f"{prefix}-run"))
        r["pushed"] = memory_now()
        e_new = engine_logprobs(engine, seqs)
        again, r["generate_s"] = timed(lambda: engine.greedy(ctx["engine_prompts"], max_tokens=spec["new_tokens"], stop=[]))  # fmt: skip
        r["rollout"] = memory_now()
        r["vllm"] = vllm_memory(engine)
        r["engine_moved"], r["learner_moved"], r["engine_vs_learner"] = gap(e_new, e_prev), gap(l_new, l_prev), gap(e_new, l_new)  # fmt: skip
        r["generated_tokens"] = sum(len(c.token_ids) for c in again)
        sync_checks(ctx, args, prefix, f"push {k}", r["engine_moved"], r["engine_vs_learner"])
        ctx["checks"].append((f"{prefix}: push {k}: greedy generation after the push ({r['generated_tokens']} tokens)",
                              all(len(c.token_ids) > 0 for c in again)))  # fmt: skip
        say(f"| push {k} ({sync or 'full weights'}): push s; generate s | {r['push_s']:.2f}; {r['generate_s']:.2f} |")
        say(f"| push {k}: learner moved; engine moved; engine vs learner (mean / max abs) | "
            + "; ".join(f"{r[key]['mean_abs']:.2e} / {r[key]['max_abs']:.2e}" for key in ("learner_moved", "engine_moved", "engine_vs_learner")) + " |")  # fmt: skip
        e_prev, l_prev = e_new, l_new
        rounds.append(r)
    return rounds


def section_engine(ctx: dict, args: argparse.Namespace) -> dict:
    """vLLM beside the learner, full-weight sync: generate, compare, then --pushes rounds of sleep, perturb, push, wake;
    the plan's phases against the measured memory."""
    engine_setup(ctx)
    spec, shape = ctx["engine_spec"], ctx["engine_shape"]
    overrides = engine_overrides(ctx)
    predicted = planned(ctx, overrides)
    r: dict = {"model_write_s": ctx["engine_model_s"], "params": shape.num_params, "plan": predicted}
    say(f"| engine: random Qwen2 | {shape.num_params:,} params ({shape.num_layers} layers, hidden {shape.hidden_size}), "
        f"written in {ctx['engine_model_s']:.1f} s |\n|---|---|")  # fmt: skip
    with engine_and_learner(ctx, overrides) as (engine, learner, cfg, times):
        s = cfg.rollout
        r.update(times, engine_settings={"dtype": s.dtype, "cuda_graphs": s.cuda_graphs, "sleep": s.sleep, "kv_cache_gib": s.kv_cache_gib},
                 precision=cfg.trainer.precision.value, started=memory_now(), vllm=vllm_memory(engine), facts=engine_facts(engine))  # fmt: skip
        say(f"| learner build s; engine start s (dtype {s.dtype}, CUDA graphs {s.cuda_graphs}, sleep {s.sleep}) | "
            f"{times['learner_build_s']:.1f}; {times['engine_start_s']:.1f} |")  # fmt: skip
        say(f"| vLLM: model runner; CUDA graph mode; sleep level | {r['facts'].get('model_runner')}; "
            f"{r['facts'].get('cudagraph_mode')}; {r['facts'].get('sleep_level')} |")  # fmt: skip
        if cuda() and s.cuda_graphs:
            ctx["checks"].append((f"engine: CUDA graphs captured (enforce_eager {r['facts'].get('enforce_eager')}, "
                                  f"{r['facts'].get('cudagraph_mode')})", r["facts"].get("enforce_eager") is False))  # fmt: skip
        rollout, r["generate_s"] = timed(lambda: engine.greedy(ctx["engine_prompts"], max_tokens=spec["new_tokens"], stop=[]))  # fmt: skip
        r["first_rollout"] = memory_now()
        seqs = [list(c.prompt_ids) + list(c.token_ids) for c in rollout]
        r["start"] = gap(engine_logprobs(engine, seqs), learner_logprobs(learner, seqs))
        say(f"| first greedy generate s ({len(seqs)} prompts x {spec['new_tokens']} tokens) | {r['generate_s']:.2f} |")
        say(f"| the checkpoint: engine vs learner logprobs (mean / max abs, {r['start']['tokens']} tokens) | "
            f"{r['start']['mean_abs']:.2e} / {r['start']['max_abs']:.2e} |")  # fmt: skip
        sync_checks(ctx, args, "engine", "the checkpoint", None, r["start"])
        rows = predicted["micro_batch"]["rows"] if not spec["update_rows"] else min(spec["update_rows"], predicted["micro_batch"]["rows"])  # fmt: skip
        batch, advantages = long_tailed_batch(rows, shape.vocab_size, prompt_min=spec["max_prompt_tokens"], prompt_max=spec["max_prompt_tokens"],
                                              response_median=spec["new_tokens"], response_sigma=0.0, response_max=spec["new_tokens"], full_rows=0)  # fmt: skip
        options = loss_options_of(cfg)

        def learner_phase(k: int) -> dict:  # the first round: the plan's micro-batch through update, as the run's phase
            if k != 1:
                return {}
            learner.update(batch, advantages, batch.response_mask, None, None, options=options)  # AdamW's state appears
            reset_peak()
            metrics, sec = timed(lambda: learner.update(batch, advantages, batch.response_mask, None, None, options=options))  # fmt: skip
            out = {"update": {"rows": rows, "row_tokens": spec["max_prompt_tokens"] + spec["new_tokens"], "s": sec, "finite": finite(metrics)},
                   "learner_phase": memory_now()}  # fmt: skip
            ctx["checks"].append(("engine: the learner's update beside the sleeping engine: finite", finite(metrics)))
            return out

        r["pushes"] = push_rounds(ctx, args, "engine", engine, learner, cfg, None, seqs, before_push=learner_phase)
    r["phases"] = phase_table(r, predicted)
    return r


def loss_options_of(cfg: Any) -> Any:
    from bench_config import loss_options

    return loss_options(cfg)


def phase_table(r: dict, predicted: dict) -> dict:
    """rlvr plan's per-phase GiB next to what was measured: the rollout phase after the last push's generate (the
    learner with its AdamW state, the engine awake), the learner phase over the update beside the sleeping engine."""
    last = r["pushes"][-1] if r.get("pushes") else {}
    first = r["pushes"][0] if r.get("pushes") else {}
    measured = {"rollout": last.get("rollout", {}), "learner": first.get("learner_phase", {})}
    vllm = last.get("vllm", {})
    say("| phase | rlvr plan GiB | device used GiB | torch peak allocated GiB | host RSS GiB (peak) |\n|---|---|---|---|---|")  # fmt: skip
    out = {}
    for phase in ("rollout", "learner"):
        m, p = measured[phase], predicted["phases"][phase]
        out[phase] = {"predicted_gib": p["total_gib"], "device_used_bytes": m.get("device_used_bytes"),
                      "peak_allocated_bytes": m.get("peak_allocated_bytes"), "rss_bytes": m.get("rss_bytes"),
                      "rss_peak_bytes": m.get("rss_peak_bytes")}  # fmt: skip
        used = m.get("device_used_bytes") if phase == "rollout" else m.get("peak_allocated_bytes")
        out[phase]["ratio"] = None if used is None else used / GIB / p["total_gib"]
        say(f"| {phase} | {p['total_gib']:.2f} | {gib(m.get('device_used_bytes'))} | {gib(m.get('peak_allocated_bytes'))} | "
            f"{gib(m.get('rss_bytes'))} ({gib(m.get('rss_peak_bytes'))}) |")  # fmt: skip
    rp = predicted["phases"]["rollout"]
    out["engine_weights"] = {"predicted_gib": rp.get("engine_weights"), "vllm_bytes": vllm.get("weights_bytes")}
    out["engine_kv_cache"] = {"predicted_gib": rp.get("engine_kv_cache"), "vllm_bytes": vllm.get("kv_cache_bytes")}
    say(f"| vLLM's own report: weights; KV cache GiB (plan: {rp.get('engine_weights')}; {rp.get('engine_kv_cache')}) | "
        f"{gib(vllm.get('weights_bytes'))}; {gib(vllm.get('kv_cache_bytes'))} |")  # fmt: skip
    return out


def section_adapters(ctx: dict, args: argparse.Namespace) -> dict:
    """vLLM with LoRA (model.lora.sync=adapter): a learner with a rank --lora-rank adapter, --pushes adapter pushes."""
    engine_setup(ctx)
    spec = ctx["engine_spec"]
    overrides = engine_overrides(ctx, f"model.lora.rank={args.lora_rank}", "model.lora.sync=adapter")
    r: dict = {"lora_rank": args.lora_rank}
    with engine_and_learner(ctx, overrides, lora_rank=args.lora_rank) as (engine, learner, cfg, times):
        r.update(times, trained_params=sum(p.numel() for p in learner.trainable), started=memory_now(), vllm=vllm_memory(engine),
                 facts=engine_facts(engine))  # fmt: skip
        say(f"| adapters: rank {args.lora_rank}, {r['trained_params']:,} trained parameters | learner build "
            f"{times['learner_build_s']:.1f} s; engine start {times['engine_start_s']:.1f} s |\n|---|---|")  # fmt: skip
        rollout = engine.greedy(ctx["engine_prompts"], max_tokens=spec["new_tokens"], stop=[])
        seqs = [list(c.prompt_ids) + list(c.token_ids) for c in rollout]
        r["start"] = gap(engine_logprobs(engine, seqs), learner_logprobs(learner, seqs))  # a fresh adapter is the base
        sync_checks(ctx, args, "adapters", "the base (a fresh adapter)", None, r["start"])
        r["pushes"] = push_rounds(ctx, args, "adapters", engine, learner, cfg, "adapter", seqs)
    return r


def train_metrics(folder: Path) -> dict:
    """What a run's metrics.jsonl says about its steps: each step's timing and the finite-ness of its losses."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [row for row in rows if row.get("step", 0) >= 1 and "timing/step_s" in row]
    keys = ("timing/rollout_s", "timing/update_s", "timing/sync_s", "timing/step_s", "perf/tokens_per_s")
    return {"steps": [row["step"] for row in steps], **{k: [row.get(k) for row in steps] for k in keys},
            "finite": all(math.isfinite(v) for row in steps for k, v in row.items() if k.startswith("actor/") and isinstance(v, float)),
            "bad_updates": sum(row.get("actor/bad_updates", 0) for row in steps)}  # fmt: skip


def section_train(ctx: dict, args: argparse.Namespace) -> dict:
    """--train-steps real `rlvr train` steps (a process of its own: `python -m rlvr train`) on the engine sections'
    model, GRPO on the built-in task with small batches; its metrics.jsonl read back."""
    import resource
    import subprocess

    if args.train_steps <= 0:
        say("| train | skipped (--train-steps 0; with --allow-cpu that is the default: a fresh `rlvr train` process costs "
            "~13 s of imports and start-up on 2 cores) |\n|---|---|")  # fmt: skip
        return {"skipped": "--train-steps 0"}
    engine_setup(ctx)
    out = Path(ctx["tmp"]) / "train-run"
    command = [sys.executable, "-m", "rlvr", "train", f"model.path={ctx['engine_model']}", f"trainer.max_steps={args.train_steps}",
               f"trainer.output_dir={out}", *TRAIN_OVERRIDES]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done, sec = timed(lambda: subprocess.run(command, cwd=ctx["tmp"], env=env, capture_output=True, text=True, timeout=args.train_timeout_s))  # fmt: skip
    r: dict = {"command": " ".join(command[1:]), "s": sec, "returncode": done.returncode,
               "children_rss_peak_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}  # fmt: skip
    if done.returncode != 0:
        say(done.stdout[-3000:] + done.stderr[-3000:])
    metrics_file = out / "metrics.jsonl"
    if metrics_file.exists():
        r.update(train_metrics(out))
    say(f"| rlvr train ({args.train_steps} steps) | exit {done.returncode} in {sec:.1f} s; step s "
        f"{', '.join(f'{x:.2f}' for x in r.get('timing/step_s', []))}; peak RSS of children {gib(r['children_rss_peak_bytes'])} GiB |\n|---|---|")  # fmt: skip
    ctx["checks"].append((f"train: `rlvr train` ran {args.train_steps} steps (exit {done.returncode})",
                          done.returncode == 0 and r.get("steps") == list(range(1, args.train_steps + 1))))  # fmt: skip
    ctx["checks"].append(("train: losses finite, no skipped update", r.get("finite", False) and r.get("bad_updates", 1) == 0))  # fmt: skip
    return r


ENGINE_SECTIONS: list[tuple[str, Callable[[dict, argparse.Namespace], dict]]] = [
    ("engine", section_engine),
    ("adapters", section_adapters),
    ("train", section_train),
]


def vllm_installed() -> bool:
    """Put back what the start-up blocked, and say whether vLLM can be imported here."""
    import importlib.util

    if sys.modules.get("vllm", 0) is None:
        if _VLLM is None:
            del sys.modules["vllm"]
        else:
            sys.modules["vllm"] = _VLLM
    return _VLLM is not None or importlib.util.find_spec("vllm") is not None



SECTIONS: list[tuple[str, Callable[[dict, argparse.Namespace], dict], bool]] = [  # (name, function, needs the update's learner)
    ("update", section_update, False),
    ("plan", section_plan, True),
    ("lifecycle", section_lifecycle, True),
    ("head", section_head, False),
    ("numerics", section_numerics, False),
]


# ------------------------------------------------------------------------------------------------------------ main


@contextlib.contextmanager
def section(name: str, ctx: dict, t0: float, budget_s: float) -> Iterator[dict]:
    """Time a section, record its exception (an OOM) as a failed check, and free what it left."""
    out: dict = {}
    start = time.perf_counter()
    say(f"\n## {name} (at {start - t0:.0f} s)")
    try:
        yield out
    except Exception as e:  # an OOM, a kernel error: record it, free, go on with the next section
        traceback.print_exc()
        sys.stderr.flush()
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        ctx["checks"].append((f"{name}: ran to the end ({out['error']})", False))
    finally:
        free()
        out["elapsed_s"] = time.perf_counter() - start
        ctx["results"][name] = out
        say(f"({name}: {out['elapsed_s']:.1f} s; {time.perf_counter() - t0:.0f} s of {budget_s:.0f} s so far)")


def run(args: argparse.Namespace, ctx: dict, t0: float) -> None:
    """Every section, in order, printed as it goes; ctx collects the results and the checks."""
    try:
        import rlvr.learner  # noqa: F401
    except ImportError as e:  # vLLM (blocked above), or omegaconf not carried to the GPU machine
        hint = " (carry omegaconf and antlr4 on PYTHONPATH: the module docstring says how)" if "omegaconf" in str(e) or "antlr4" in str(e) else ""
        ctx["checks"].append((f"rlvr.learner imports, vllm blocked ({e}){hint}", False))
        return
    ctx["checks"].append(("rlvr.learner imports without vllm", True))
    import transformers
    from bench_config import loss_options

    from rlvr.memory import ModelShape
    from rlvr.settings import asked

    transformers.utils.logging.disable_progress_bar()  # no shard-writing / weight-loading bars between the tables
    gc.collect()
    gc.freeze()  # the imports are never garbage: every free() between sections would scan them again (~0.3 s each)

    ctx["info"].update(device=torch.cuda.get_device_name() if cuda() else "CPU (--allow-cpu: tiny model and batch)",
                       torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda)  # fmt: skip
    say(f"device: {ctx['info']['device']}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
    with section("setup", ctx, t0, args.budget_s) as out:
        tmp = ctx["tmp"]
        model_path, build_s = timed(lambda: str(build_model(Path(tmp) / "model", {**QWEN25_15B, **({} if cuda() else CPU_MODEL)})))  # fmt: skip
        ctx["model_path"] = model_path
        batch_spec = ctx["batch_spec"] = GPU_BATCH if cuda() else CPU_BATCH
        cfg, shape, s, how = resolved_settings(model_path, batch_spec)
        expected = ModelShape.from_config({**QWEN25_15B, **({} if cuda() else CPU_MODEL), "model_type": "qwen2"})
        ctx["checks"].append((f"setup: the model has {'Qwen2.5-1.5B' if cuda() else 'CPU_MODEL'}'s shapes ({shape.num_params:,} parameters)",
                              shape == expected))  # fmt: skip
        # with the engine awake; on CPU (no sleep mode, nothing to hold) a smaller budget with checkpointing switched,
        # so that --allow-cpu runs the lifecycle's code path
        ctx["awake_settings"] = (resolved_settings(model_path, batch_spec, sleep=False)[2] if cuda() else
                                 replace(s, micro_batch_tokens=CPU_MICRO_BATCH_TOKENS // 2, activation_checkpointing=not s.activation_checkpointing))  # fmt: skip
        ctx.update(cfg=cfg, shape=shape, settings=s, micro_batch_rows=cfg.trainer.micro_batch_rows, loss=loss_options(cfg))
        ctx["micro_batch_tokens"] = args.micro_batch_tokens or (s.micro_batch_tokens if cuda() else CPU_MICRO_BATCH_TOKENS)
        batch, advantages = long_tailed_batch(vocab_size=shape.vocab_size, **batch_spec)
        ctx.update(batch=batch, advantages=advantages)
        lengths = batch.attention_mask.sum(1)
        response = batch.response_mask.sum(1)
        out.update(model_write_s=build_s, params=shape.num_params, config=how, settings=asdict(s),
                   micro_batch_tokens=ctx["micro_batch_tokens"], awake_settings=asdict(ctx["awake_settings"]),
                   rows=batch.num_rows, real_tokens=int(lengths.sum()), response_tokens=int(response.sum()),
                   padded_tokens=int(batch.input_ids.numel()), response_median=float(response.median()), response_max=int(response.max()))  # fmt: skip
        say("| setup | value |\n|---|---|")
        say(f"| model | random Qwen2, {shape.num_params:,} params ({shape.num_layers} layers, hidden {shape.hidden_size}, "
            f"vocab {shape.vocab_size}), written in {build_s:.1f} s |")
        say(f"| settings (resolve for this device; config composed by {how}) | {', '.join(s.lines(asked(cfg)))} |")
        say(f"| learner | precision bf16 (fp32 master weights) whatever the device resolves; micro_batch_tokens {ctx['micro_batch_tokens']} "
            f"(resolved with rollout.sleep=false: {ctx['awake_settings'].micro_batch_tokens}, activation checkpointing "
            f"{str(ctx['awake_settings'].activation_checkpointing).lower()}); micro_batch_rows {ctx['micro_batch_rows']} |")  # fmt: skip
        say(f"| batch | {batch.num_rows} rows, {out['real_tokens']} real tokens ({out['response_tokens']} response; median response "
            f"{out['response_median']:.0f}, max {out['response_max']}), {out['padded_tokens']} padded to the longest |")
    if "model_path" not in ctx or "batch" not in ctx:
        return
    for name, fn, needs_learner in SECTIONS:
        if needs_learner and "learner" not in ctx:
            continue  # the update section failed: its error is already a failed check
        if time.perf_counter() - t0 > args.budget_s:
            ctx["checks"].append((f"{name}: skipped, past the {args.budget_s:.0f} s budget", False))
            continue
        with section(name, ctx, t0, args.budget_s) as out:
            out.update(fn(ctx, args))
        if name == "lifecycle":
            ctx.pop("learner", None)  # the head and numerics sections need the memory
            ctx.pop("old_logprobs", None)
            free()
    ctx.pop("learner", None)
    free()
    if not vllm_installed():
        ctx["engine_skipped"] = "vllm is not installed"
        say("\n## engine, adapters, train: skipped: vllm is not installed (the learner's sections above stand on their own)")  # fmt: skip
        return
    import rlvr.rollout  # noqa: F401  # (vLLM's imports: once, before the first section's clock starts)
    import rlvr.startup  # noqa: F401

    gc.collect()
    gc.freeze()  # (vLLM's imports, likewise)
    for name, fn in ENGINE_SECTIONS:
        if time.perf_counter() - t0 > args.budget_s:
            ctx["checks"].append((f"{name}: skipped, past the {args.budget_s:.0f} s budget", False))
            continue
        with section(name, ctx, t0, args.budget_s) as out:
            out.update(fn(ctx, args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow-cpu", action="store_true", help="without a GPU, run the same code on a tiny model and batch")
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    ap.add_argument("--steps", type=int, default=3, help="timed updates (the median counts)")
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="override the resolved token budget (0: resolved)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200 SXM datasheet: 989)")
    ap.add_argument("--head-tokens", type=int, default=16384, help="tokens through the LM head in the head section")
    ap.add_argument("--head-repeats", type=int, default=3)
    ap.add_argument("--head-tol", type=float, default=2e-2, help="largest relative difference between chunk sizes")
    ap.add_argument("--plan-tol", type=float, default=0.15, help="largest |measured / predicted - 1| of the peak")
    ap.add_argument("--numerics-rows", type=int, default=8)
    ap.add_argument("--max-abs-tol", type=float, default=0.5, help="bf16-vs-fp32 logprob: largest allowed max abs diff")
    ap.add_argument("--mean-abs-tol", type=float, default=0.05, help="bf16-vs-fp32 logprob: largest allowed mean abs diff")
    ap.add_argument("--pushes", type=int, default=2, help="engine sections: weight (and adapter) pushes, each checked")
    ap.add_argument("--push-noise", type=float, default=0.1, help="full-weight push: noise, relative to each weight's RMS")  # fmt: skip
    ap.add_argument("--adapter-noise", type=float, default=0.01, help="adapter push: noise std on the adapter's weights")  # fmt: skip
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--sync-mean-tol", type=float, default=0.02, help="engine vs learner logprobs: largest mean abs diff")  # fmt: skip
    ap.add_argument("--sync-max-tol", type=float, default=0.3, help="engine vs learner logprobs: largest max abs diff")
    ap.add_argument("--moved-factor", type=float, default=5.0, help="a push must move the engine's logprobs by this x the mismatch")  # fmt: skip
    ap.add_argument("--train-steps", type=int, default=None, help="real `rlvr train` steps (default: 2; 0 with --allow-cpu)")  # fmt: skip
    ap.add_argument("--train-timeout-s", type=float, default=240.0)
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip the sections left after this many seconds")
    args = ap.parse_args()
    if args.train_steps is None:
        args.train_steps = 0 if args.allow_cpu and not cuda() else 2
    t0 = time.perf_counter()
    ctx: dict = {"checks": [], "results": {}, "info": {"torch": torch.__version__}}
    if not cuda() and not args.allow_cpu:
        say("FAIL: no CUDA device (torch.cuda.is_available() is False). This check is for a GPU machine; "
            "run `python scripts/gpu_check.py --allow-cpu` for the tiny CPU smoke test.")  # fmt: skip
        say(json.dumps({"pass": False, "error": "no CUDA device", "elapsed_s": 0.0}))
        sys.exit(2)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        ctx["tmp"] = tmp
        try:
            run(args, ctx, t0)
        except Exception as e:  # outside any section (an import): still end on the JSON line
            traceback.print_exc()
            ctx["checks"].append((f"ran to the end ({type(e).__name__}: {e})", False))
        finally:
            ctx.pop("learner", None)
            gc.unfreeze()  # (run() froze the imports: without this, extensions report them as leaked at exit)
            free()
            with contextlib.suppress(Exception):
                from rlvr import distributed

                distributed.shutdown()
    elapsed = time.perf_counter() - t0
    if cuda():
        ctx["checks"].append((f"finished within 8 minutes ({elapsed:.0f} s)", elapsed <= 480))
    sys.stderr.flush()
    say()
    for name, ok in ctx["checks"]:
        say(f"{'ok  ' if ok else 'FAIL'} {name}")
    failed = [name for name, ok in ctx["checks"] if not ok]
    verdict = "PASS" if not failed else f"FAIL ({len(failed)} of {len(ctx['checks'])} checks)"
    say(f"{verdict}: gpu_check on {'CUDA' if cuda() else 'CPU'} in {elapsed:.0f} s")
    res = ctx["results"]
    update, head, life, plan, num = (res.get(k, {}) for k in ("update", "head", "lifecycle", "plan", "numerics"))
    engine, adapters, train = (res.get(k, {}) for k in ("engine", "adapters", "train"))
    summary = {
        "pass": not failed,
        "failed": failed,
        **ctx["info"],
        "elapsed_s": elapsed,
        "tokens_per_s": update.get("tokens_per_s"),
        "mfu": update.get("mfu"),
        "mfu_6nd": update.get("mfu_6nd"),
        "head_s": {k: v["s"] for k, v in head.get("chunks", {}).items()},
        "head_peak_bytes": {k: v["peak_bytes"] for k, v in head.get("chunks", {}).items()},
        "update_peak_bytes": update.get("peak_bytes"),
        "engine_share_bytes": life.get("engine_share_bytes"),
        "lifecycle_awake_fits": life.get("awake_sleep_budget", {}).get("fits"),
        "lifecycle_awake_peak_bytes": life.get("awake_sleep_budget", {}).get("peak_bytes"),
        "lifecycle_awake_budget_fits": life.get("awake_awake_budget", {}).get("fits"),
        "lifecycle_awake_budget_peak_bytes": life.get("awake_awake_budget", {}).get("peak_bytes"),
        "lifecycle_asleep_peak_bytes": life.get("asleep", {}).get("peak_bytes"),
        "plan_predicted_bytes": plan.get("predicted_bytes"),
        "plan_ratio": plan.get("ratio"),
        "plan_ratio_after_first": plan.get("ratio_after_first"),
        "plan_ratio_awake_budget": life.get("awake_budget_plan_ratio"),
        "numerics_max_abs": num.get("max_abs"),
        "numerics_mean_abs": num.get("mean_abs"),
        "engine_checked": "engine" in res and "error" not in engine,
        "engine_skipped": ctx.get("engine_skipped"),
        "engine_start_s": engine.get("engine_start_s"),
        "engine_start_gap": engine.get("start"),
        "engine_push_gaps": [p["engine_vs_learner"] for p in engine.get("pushes", [])],
        "engine_push_moved": [p["engine_moved"] for p in engine.get("pushes", [])],
        "adapter_push_gaps": [p["engine_vs_learner"] for p in adapters.get("pushes", [])],
        "adapter_push_moved": [p["engine_moved"] for p in adapters.get("pushes", [])],
        "engine_phases": engine.get("phases"),
        "train_step_s": train.get("timing/step_s"),
        "sections": res,
    }
    sys.stdout.flush()
    print(json.dumps(rounded(summary), default=str), flush=True)
    sys.exit(0 if not failed else 1)


if __name__ == "__main__":
    main()
