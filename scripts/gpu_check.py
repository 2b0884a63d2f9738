"""The device check: rlvr's learner on one lent GPU (an H200), on Qwen2.5-1.5B's shapes, in at most 8 minutes.

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

Then one line per check (ok / FAIL), a PASS or FAIL line, and as the very last line one JSON object with every number
(tokens_per_s, mfu, head_s, *_peak_bytes, plan_ratio, numerics_*, device, torch, elapsed_s, and each section's
details under "sections"). Exit status 0 on pass, 1 on a failed check, 2 when there is no CUDA device and no
--allow-cpu. Sections left when --budget-s (420) has passed are skipped (a failed check). vLLM is blocked at start-up:
an `import vllm` on the learner's path fails here as it would on the GPU machine, which has none.
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
sys.modules["vllm"] = None  # type: ignore[assignment]  # as on the GPU machine: any `import vllm` now raises ImportError

import torch  # noqa: E402

TINY_ASSETS = REPO / "rlvr" / "assets" / "tiny-arith"  # its tokenizer files serve the random model (ids beyond it are fine)
# Qwen/Qwen2.5-1.5B's config.json shapes (q/k/v biases are Qwen2's own)
QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                  hidden_act="silu", initializer_range=0.02, use_sliding_window=False,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
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
    """Drop what is unreachable and hand cached blocks back, so the next peak starts from what is live."""
    gc.collect()
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


def build_model(folder: Path, config: dict) -> Path:
    """A randomly initialised Qwen2ForCausalLM of `config`'s shapes, fp32 safetensors, and a tokenizer, in `folder`
    (initialised on the GPU when there is one: 1.5B parameters initialise in seconds there, a minute on a CPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    fields = {**QWEN25_15B, **config}  # --allow-cpu: CPU_MODEL over the 1.5B shapes
    with torch.device("cuda" if cuda() else "cpu"):
        model = Qwen2ForCausalLM(Qwen2Config(**fields))  # fp32, random weights
    model.to("cpu")  # safetensors writes host memory
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_ASSETS / name, folder / name)
    free()
    return folder


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

    ctx["info"].update(device=torch.cuda.get_device_name() if cuda() else "CPU (--allow-cpu: tiny model and batch)",
                       torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda)  # fmt: skip
    say(f"device: {ctx['info']['device']}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
    with section("setup", ctx, t0, args.budget_s) as out:
        tmp = ctx["tmp"]
        model_path, build_s = timed(lambda: str(build_model(Path(tmp) / "model", {} if cuda() else CPU_MODEL)))
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
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip the sections left after this many seconds")
    args = ap.parse_args()
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
        "sections": res,
    }
    sys.stdout.flush()
    print(json.dumps(rounded(summary), default=str), flush=True)
    sys.exit(0 if not failed else 1)


if __name__ == "__main__":
    main()
