"""Check the learner on a lent GPU (one H200): bf16 update throughput and peak memory with activation
checkpointing off and on, and bf16-vs-fp32 numerics, on a randomly initialised SmolLM2-135M-architecture Llama.

    python scripts/gpu_check.py                 # on the GPU machine, from the repo root; about 1-2 minutes on an H200
    python scripts/gpu_check.py --allow-cpu     # no GPU: the same code on a tiny model and batch (a smoke test)

World size one (rlvr.distributed.init makes a world of one: no torchrun), the learner both as one GPU runs it
(the plain module, bf16 by autocast) and forced onto FSDP2 as torchrun runs it (MixedPrecisionPolicy). What it does:

 1. numerics: the response logprobs of one batch under Learner(precision=fp32) and Learner(precision=bf16)
    (same weights, fp32 master weights; bf16 is FSDP2's MixedPrecisionPolicy): max and mean abs difference
    over the response tokens, both finite, within --max-abs-tol (0.5) and --mean-abs-tol (0.05);
 2. throughput and memory: Learner(precision=bf16) with activation checkpointing off, then on: --warmup
    updates, one logprobs call (the old logprobs), --steps timed updates; update tokens/s (response tokens of
    the batch / median update seconds), peak torch.cuda.max_memory_allocated; every update's loss, grad norm
    and metrics finite and no skipped step; on CUDA, checkpointing on must lower the peak.

It needs only torch, transformers and rlvr's learner modules (rlvr.learner, .algo, .distributed, .types): vLLM
is blocked at start-up, so an `import vllm` anywhere on that path fails here as it would on the GPU machine.
The last line is PASS or FAIL (exit status 0 or 1; 2 when there is no CUDA device and no --allow-cpu).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path[:0] = [str(REPO), str(SCRIPTS)]  # rlvr from this checkout (not installed there), and bench_learner
sys.modules["vllm"] = None  # type: ignore[assignment]  # as on the GPU machine: any `import vllm` now raises ImportError

import torch  # noqa: E402

# --allow-cpu: the same architecture family, shrunk so that a 2-core CPU runs the whole check in seconds
CPU_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=1024)
CPU_BATCH = dict(rows=8, prompt_len=16, response_len=32, micro_batch_rows=4)


def cuda_mib(device: torch.device, peak: bool = False) -> float | None:
    """Memory allocated now (or at peak) on a CUDA device, MiB; None on the CPU (no allocator statistics)."""
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device)) / 2**20


def fmt_mib(value: float | None) -> str:
    """A table cell for a memory figure."""
    return "-" if value is None else f"{value:.0f}"


def make_learner(model_path: str, *, precision: str, activation_checkpointing: bool, micro_batch_rows: int, shard: bool):
    """A Learner on `model_path` with fp32 master weights (the learner imported only here, after vLLM is blocked).

    shard=False is what one GPU runs (the plain module, bf16 by autocast); shard=True forces FSDP2 as under torchrun
    (bf16 by MixedPrecisionPolicy), so both bf16 paths are checked on a single GPU."""
    from rlvr.learner import Learner

    return Learner(model_path, dtype="float32", lr=1e-6, weight_decay=0.0, warmup_steps=0, lr_schedule="constant",
                   total_updates=10**6, grad_clip=1.0, micro_batch_rows=micro_batch_rows, with_reference=False,
                   precision=precision, activation_checkpointing=activation_checkpointing, shard=shard)  # fmt: skip


def default_device() -> torch.device:
    """The device the learner will pick (rlvr.distributed.device, before the process group exists)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def free(device: torch.device) -> None:
    """Drop unreachable learners and hand their cached blocks back, so the next peak starts from zero."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def numerics(model_path: str, batch, micro_batch_rows: int, shard: bool) -> dict:
    """Response logprobs under precision fp32 and bf16: max/mean abs difference over the response tokens."""
    logp = {}
    for precision in ("fp32", "bf16"):
        learner = make_learner(model_path, precision=precision, activation_checkpointing=False, micro_batch_rows=micro_batch_rows,
                               shard=shard)  # fmt: skip
        logp[precision] = learner.logprobs(batch)  # [N, T] fp32, on the CPU
        del learner
        free(default_device())
    counted = batch.response_mask.bool()  # [N, T]
    diff = (logp["bf16"] - logp["fp32"]).abs()[counted]  # [tokens]
    return {
        "finite": all(bool(torch.isfinite(lp[counted]).all()) for lp in logp.values()),
        "max_abs": diff.max().item(),
        "mean_abs": diff.mean().item(),
        "mean_logp_fp32": logp["fp32"][counted].mean().item(),
    }


def throughput(model_path: str, batch, *, activation_checkpointing: bool, micro_batch_rows: int, warmup: int, steps: int,
               shard: bool) -> dict:  # fmt: skip
    """Updates of Learner(precision=bf16): median seconds, tokens/s, peak memory, and whether every metric stayed finite.

    The caller frees the learner (`free`) once this returns.
    """
    from bench_learner import LOSS_KWARGS, timed

    before_build = cuda_mib(default_device())  # what earlier learners left behind (should be about 0)
    learner, build_s = timed(lambda: make_learner(model_path, precision="bf16", activation_checkpointing=activation_checkpointing,
                                                  micro_batch_rows=micro_batch_rows, shard=shard), default_device())  # fmt: skip
    device = learner.device
    after_build = cuda_mib(device)
    advantages = torch.randn(batch.num_rows, generator=torch.Generator().manual_seed(1))  # [N]
    mask = batch.response_mask  # [N, T]
    kwargs = {**LOSS_KWARGS, "max_len": mask.shape[1]}
    history = [learner.update(batch, advantages, mask, None, None, loss_kwargs=kwargs) for _ in range(warmup)]
    old_logprobs, logprobs_s = timed(lambda: learner.logprobs(batch), device)  # [N, T]
    step_s = []
    for _ in range(steps):
        metrics, seconds = timed(lambda: learner.update(batch, advantages, mask, old_logprobs, None, loss_kwargs=kwargs), device)
        history.append(metrics)
        step_s.append(seconds)
    peak = cuda_mib(device, peak=True)
    update_s = statistics.median(step_s)
    return {
        "build_s": build_s,
        "logprobs_s": logprobs_s,
        "update_s": update_s,
        "tokens_per_s": int(mask.sum()) / update_s,
        "before_build_mib": before_build,
        "after_build_mib": after_build,
        "peak_mib": peak,
        "finite": all(math.isfinite(v) for m in history for v in m.values()) and all(m["bad"] == 0.0 for m in history),
        "pg_loss": [m["pg_loss"] for m in history],
        "grad_norm": [m["grad_norm"] for m in history],
    }


def run(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """Every check, printed as it goes; (name, passed) for each."""
    from bench_learner import build_random_llama, synthetic_batch

    cuda = torch.cuda.is_available()
    checks: list[tuple[str, bool]] = []
    try:
        import rlvr.learner  # noqa: F401
    except ImportError as e:  # vLLM (blocked above) or another dependency rlvr.learner must not need
        print(f"importing rlvr.learner failed: {e}")
        return [("rlvr.learner imports without vllm", False)]
    checks.append(("rlvr.learner imports without vllm", True))
    import transformers

    device_name = torch.cuda.get_device_name() if cuda else "CPU (--allow-cpu: tiny model and batch)"
    print(f"device: {device_name}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"tf32 matmul {torch.backends.cuda.matmul.allow_tf32}")  # fmt: skip
    shape = dict(rows=args.rows, prompt_len=args.prompt_len, response_len=args.response_len, micro_batch_rows=args.micro_batch_rows)
    if not cuda:
        shape = CPU_BATCH
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        t0 = time.perf_counter()
        model_path = str(build_random_llama(Path(tmp) / "model", **({} if cuda else CPU_MODEL)))
        vocab_size = int(transformers.AutoConfig.from_pretrained(model_path).vocab_size)
        batch = synthetic_batch(shape["rows"], shape["prompt_len"], shape["response_len"], vocab_size)
        print(f"model: random Llama {'SmolLM2-135M architecture' if cuda else CPU_MODEL} written in {time.perf_counter() - t0:.1f} s; "
              f"batch {shape['rows']} x ({shape['prompt_len']} + {shape['response_len']}) tokens, micro_batch_rows {shape['micro_batch_rows']}")  # fmt: skip

        for shard in (False, True):
            name = "FSDP2" if shard else "plain"
            num = numerics(model_path, batch, shape["micro_batch_rows"], shard)
            print(f"{name}: bf16 vs fp32 logprobs over {int(batch.response_mask.sum())} response tokens: max abs diff "
                  f"{num['max_abs']:.4g} (tol {args.max_abs_tol}), mean abs diff {num['mean_abs']:.4g} (tol {args.mean_abs_tol}); "
                  f"mean fp32 logprob {num['mean_logp_fp32']:.3f}")  # fmt: skip
            checks.append((f"{name}: logprobs finite (fp32 and bf16)", num["finite"]))
            checks.append((f"{name}: bf16-vs-fp32 max abs diff within tol", num["max_abs"] <= args.max_abs_tol))
            checks.append((f"{name}: bf16-vs-fp32 mean abs diff within tol", num["mean_abs"] <= args.mean_abs_tol))

        print("\n| learner | precision | activation checkpointing | update s (median) | update tokens/s | logprobs s | allocated before build MiB | allocated after build MiB | peak allocated MiB | pg_loss (per update) | grad_norm (per update) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        peaks: dict[tuple[bool, bool], float | None] = {}  # (shard, checkpointing) -> peak MiB over what was there before
        for shard, ac in ((False, False), (False, True), (True, False), (True, True)):
            r = throughput(model_path, batch, activation_checkpointing=ac, micro_batch_rows=shape["micro_batch_rows"],
                           warmup=args.warmup, steps=args.steps, shard=shard)  # fmt: skip
            free(default_device())
            peaks[shard, ac] = None if r["peak_mib"] is None else r["peak_mib"] - r["before_build_mib"]
            name = "FSDP2" if shard else "plain"
            print(f"| {name} | bf16 | {'on' if ac else 'off'} | {r['update_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['logprobs_s']:.3f} | "
                  f"{fmt_mib(r['before_build_mib'])} | {fmt_mib(r['after_build_mib'])} | {fmt_mib(r['peak_mib'])} | {', '.join(f'{v:.4g}' for v in r['pg_loss'])} | "
                  f"{', '.join(f'{v:.3g}' for v in r['grad_norm'])} |", flush=True)  # fmt: skip
            checks.append((f"{name}: loss, grad norm and metrics finite, no skipped step (activation checkpointing {'on' if ac else 'off'})", r["finite"]))
        for shard in (False, True):
            on, off = peaks[shard, True], peaks[shard, False]
            if on is not None and off is not None:  # CPU has no allocator peak to compare
                checks.append((f"{'FSDP2' if shard else 'plain'}: activation checkpointing lowers peak allocated memory", on < off))
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow-cpu", action="store_true", help="without a GPU, run the same code on a tiny model and batch")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--response-len", type=int, default=1024)
    ap.add_argument("--micro-batch-rows", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-abs-tol", type=float, default=0.5, help="bf16-vs-fp32 logprob: largest allowed max abs diff")
    ap.add_argument("--mean-abs-tol", type=float, default=0.05, help="bf16-vs-fp32 logprob: largest allowed mean abs diff")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("FAIL: no CUDA device (torch.cuda.is_available() is False). This check is for a GPU machine; "
              "run `python scripts/gpu_check.py --allow-cpu` for the tiny CPU smoke test.")  # fmt: skip
        sys.exit(2)
    t0 = time.perf_counter()
    try:
        checks = run(args)
    except Exception as e:  # an OOM, a kernel error: still end on a clear FAIL line
        traceback.print_exc()
        checks = [(f"ran to the end ({type(e).__name__}: {e})", False)]
    print()
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    failed = [name for name, ok in checks if not ok]
    verdict = "PASS" if not failed else f"FAIL ({len(failed)} of {len(checks)} checks)"
    print(f"{verdict}: gpu_check on {'CUDA' if torch.cuda.is_available() else 'CPU'} in {time.perf_counter() - t0:.0f} s")
    sys.exit(0 if not failed else 1)


if __name__ == "__main__":
    main()
