"""Where the learner's update spends its time (issue 52): torch.profiler over real updates, its op times put into
kinds, the rest of the wall time being Python and dispatch between ops.

    python scripts/profile_update.py [--model tiny|135m] [--rows 32] [--prompt-len 7] [--response-len 4] [--warmup 10]
        [--updates 20] [--threads N] [--json] [--smoke]
    python scripts/profile_update.py --realistic [--rows 64] [--warmup 0] [--updates 2] [--json]

The learner is built as `rlvr train` builds it (scripts/bench_config.py: DAPO, fp32 master weights, lr 1e-6 constant,
every `auto` resolved for this machine); the batch is synthetic (bench_learner.synthetic_batch: every row prompt_len +
response_len random ids). Defaults: the built-in model's update in the main job (4 prompts x 8 answers, ~7 prompt and
4 answer tokens each); `--model 135m`: a random Llama of SmolLM2-135M's shape. `--realistic`: SmolLM2-135M's shape on
bench_learner.py --realistic's batch (64 rows, prompts of 40-120 tokens, long-tailed responses up to 512, seed 0; the
settings rlvr train resolves for it, old logprobs from one learner.logprobs pass; defaults --warmup 0 --updates 2).
After --warmup untimed updates, --updates updates are timed (the median) without the profiler, then one is profiled
(all of them without --realistic). The table: per update, the self CPU time of the
calling thread's ops by kind (matmul: aten::mm/addmm/bmm; attention: scaled_dot_product_*; the optimizer: AdamW's
fused kernel and the gradient norm; the other ops: elementwise, reductions, copies, allocation), and the wall time
not inside any op (Python, autograd's bookkeeping, dispatch); then the 12 costliest ops. The achieved rate counts
rlvr/flops.py's FLOPs over the median update, against this machine's matmul peak measured in the same run
(scripts/peak.py). --smoke: 4 rows, 1 warm-up, 2 updates (tests/test_scripts.py). With --json the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench_config import build_learner, loss_options, run_config  # noqa: E402
from bench_learner import (  # noqa: E402
    RESPONSE_MAX,
    SMOKE_RESPONSE_MAX,
    SMOLLM2_135M,
    build_random_llama,
    learner_overrides,
    realistic_batch,
    synthetic_batch,
)
from peak import measure as measure_peak  # noqa: E402
from peak import share as peak_share  # noqa: E402

KINDS = (  # (kind, does an op of this name belong to it); the first that matches
    ("matmul", lambda name: name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("attention", lambda name: "scaled_dot_product" in name),
    ("optimizer and gradient norm", lambda name: "adam" in name.lower() or name == "aten::linalg_vector_norm"),
    ("other ops (elementwise, reductions, copies, allocation)", lambda name: name.startswith("aten::")),
)


def kind_of(name: str) -> str | None:
    return next((kind for kind, belongs in KINDS if belongs(name)), None)


def profile(learner, batch, advantages, old, options, updates: int) -> tuple[dict[str, float], list[tuple[str, float, int]], float]:  # type: ignore[no-untyped-def]
    """Per update: ms of each kind and of the time outside ops, the costliest ops (name, ms, calls), and the profiled
    wall time per update (ms)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(updates):
            learner.update(batch, advantages, batch.response_mask, old, None, options=options)
        wall_ms = (time.perf_counter() - start) * 1e3 / updates
    kinds = {kind: 0.0 for kind, _ in KINDS}
    ops = []
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / updates
        kind = kind_of(event.key)
        if kind is not None:
            kinds[kind] += ms
            ops.append((event.key, ms, event.count // updates))
    kinds["outside ops (Python, autograd, dispatch)"] = max(0.0, wall_ms - sum(kinds.values()))
    return kinds, sorted(ops, key=lambda op: -op[1])[:12], wall_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["tiny", "135m"], default="tiny")
    ap.add_argument("--realistic", action="store_true")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=7)
    ap.add_argument("--response-len", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--updates", type=int, default=None)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    realistic_defaults, defaults = (64, 0, 2), (32, 10, 20)
    for name, value in zip(("rows", "warmup", "updates"), realistic_defaults if args.realistic else defaults, strict=True):
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    if args.smoke:
        args.rows, args.warmup, args.updates = (8 if args.realistic else 4), 1, 2
    if args.realistic:
        args.model = "135m"
    torch.set_num_threads(args.threads)
    peak = measure_peak(args.threads, size=256 if args.smoke else 2048, seconds=0.1 if args.smoke else 1.0)
    with tempfile.TemporaryDirectory(prefix="profile-update-") as tmp:
        layers = {"num_hidden_layers": 2} if args.smoke and args.realistic else {}
        path = "builtin:tiny-arith" if args.model == "tiny" else str(build_random_llama(Path(tmp) / "smollm2-135m", **layers))
        if args.realistic:
            response_max = SMOKE_RESPONSE_MAX if args.smoke else RESPONSE_MAX
            batch, advantages = realistic_batch(args.rows, int(SMOLLM2_135M["vocab_size"]), response_max=response_max, seed=0)
            overrides = learner_overrides(path, max_len=int(batch.response_ids.shape[1]))
        else:
            overrides = [f"model.path={path}", "model.dtype=float32", "trainer.lr=1e-6", "trainer.warmup_steps=0",
                         "trainer.lr_schedule=constant", f"rollout.max_new_tokens={args.response_len}"]  # fmt: skip
        cfg = run_config(*overrides)
        learner = build_learner(cfg)
        options = loss_options(cfg)
        if not args.realistic:
            batch = synthetic_batch(args.rows, args.prompt_len, args.response_len, learner.model.config.vocab_size)
            advantages = torch.randn(args.rows, generator=torch.Generator().manual_seed(1))  # [N]
        old = learner.logprobs(batch) if args.realistic else None  # [N, T] (pi_old = pi_theta otherwise)
        for _ in range(args.warmup):
            learner.update(batch, advantages, batch.response_mask, old, None, options=options)
        times, before = [], learner.flops
        for _ in range(args.updates):
            start = time.perf_counter()
            learner.update(batch, advantages, batch.response_mask, old, None, options=options)
            times.append(time.perf_counter() - start)
        update_s = statistics.median(times)
        gflop = (learner.flops - before) / args.updates / 1e9
        kinds, ops, profiled_ms = profile(learner, batch, advantages, old, options, 1 if args.realistic else args.updates)
    precision = str(cfg.trainer.precision.value)
    rate = gflop / update_s
    share = peak_share(rate, peak, "bfloat16" if precision == "bf16" else "float32")
    shape = (f"{args.rows} realistic rows ({int(batch.attention_mask.sum())} tokens)" if args.realistic
             else f"{args.rows} rows x ({args.prompt_len}+{args.response_len}) tokens")  # fmt: skip
    print(f"{args.model}: {shape}, {precision}, {args.threads} "
          f"threads; update median {update_s * 1e3:.1f} ms over {args.updates} ({profiled_ms:.1f} ms profiled); "
          f"{gflop:.3f} GFLOP an update: {rate:.1f} GFLOP/s, {share:.0%} of this machine's {precision} matmul peak "
          f"({peak['float32']:.1f} fp32, {peak['bfloat16']:.1f} bf16 GFLOP/s, measured here)\n")  # fmt: skip
    print("| where (per update, profiled) | ms | share |\n|---|---|---|")
    for kind, ms in kinds.items():
        print(f"| {kind} | {ms:.2f} | {ms / profiled_ms:.0%} |")
    print("\n| op (self CPU time, calling thread) | ms per update | calls per update |\n|---|---|---|")
    for name, ms, calls in ops:
        print(f"| {name} | {ms:.2f} | {calls} |")
    if args.json:
        print(json.dumps({"model": args.model, "realistic": args.realistic, "rows": args.rows, "prompt_len": args.prompt_len,
                          "response_len": args.response_len, "threads": args.threads, "precision": precision,
                          "update_ms": update_s * 1e3, "profiled_ms": profiled_ms, "gflop": gflop,
                          "gflops_per_s": rate, "peak_share": share, "peak": peak, "kinds_ms": kinds,
                          "ops": [{"name": n, "ms": ms, "calls": c} for n, ms, c in ops], "smoke": args.smoke}))  # fmt: skip


if __name__ == "__main__":
    main()
