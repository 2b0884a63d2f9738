"""This machine's own matmul peak, measured where the benchmarks run, so that their learner figures read as a share of
what the hardware does (issue 52) and hold across machines whose CPUs differ.

    python scripts/peak.py [--threads N] [--size 2048] [--seconds 1.0] [--device cpu]

Square matmuls of --size (2048: large enough for the BLAS to reach its peak, small enough to take ~0.1 s in fp32 on 2
cores; smaller where one call would take over a third of --seconds) in float32 and bfloat16, on --threads threads (the
run's; default: the cores this process may use), repeated for about --seconds after one untimed call; the median
call's rate, 2 x size^3 FLOPs over its seconds. Prints one JSON object: {"threads", "device", "float32", "bfloat16"}
in GFLOP/s and the sizes used. The benchmarks import `measure`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

DTYPES = ("float32", "bfloat16")


def matmul_gflops(dtype: torch.dtype, *, size: int = 2048, seconds: float = 1.0, device: str = "cpu") -> tuple[float, int]:
    """The median rate (GFLOP/s) of square matmuls in `dtype` on the current thread count, and their size: `size`, or
    smaller where one call would take over a third of `seconds` (bf16 without hardware support runs at well under
    1 GFLOP/s on a CPU: one 2048 matmul would take a minute)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    g = torch.Generator().manual_seed(0)
    n = min(256, size)
    while True:
        a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        a @ b  # the first call pays for packing buffers and kernel choice
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        if n >= size or 8 * (time.perf_counter() - start) > seconds / 3:  # (twice the size: 8 times the work)
            break
        n *= 2
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9, n


def measure(threads: int, *, size: int = 2048, seconds: float = 1.0, device: str = "cpu") -> dict:
    """Both dtypes' peaks on `threads` threads (the caller's thread count is restored)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = {name: matmul_gflops(getattr(torch, name), size=size, seconds=seconds, device=device) for name in DTYPES}
    finally:
        torch.set_num_threads(before)
    return {"threads": threads, "device": device, **{k: v[0] for k, v in rates.items()},
            "sizes": {k: v[1] for k, v in rates.items()}}  # fmt: skip


def share(achieved_gflops: float, peak: dict, dtype: str) -> float:
    """achieved / the peak of the dtype the learner computes in (float32 or bfloat16)."""
    return achieved_gflops / peak["bfloat16" if dtype == "bfloat16" else "float32"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    print(json.dumps(measure(args.threads, size=args.size, seconds=args.seconds, device=args.device)))


if __name__ == "__main__":
    main()
