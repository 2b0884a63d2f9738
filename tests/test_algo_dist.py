"""The aggregation invariant across ranks, with a real gloo process group: each rank takes whole groups, passes the
global counts and loss_scale=world_size, and its gradient is averaged over ranks like DDP/FSDP does. The averaged
gradient (and loss) must equal the single-process full-batch ones, for every aggregation and ratio mode, and for every
objective (clip, cispo, sapo, gmpo) under every aggregation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr.algo import AGGREGATIONS, RATIOS, policy_loss

N, T, G = 8, 5, 2
LENGTHS = [5, 3, 1, 4, 2, 5, 3, 0]  # uneven, so per-rank token counts differ; one overlong-filtered row
CASES = (
    [(agg, ratio, 0.0, "clip") for agg, ratio in itertools.product(AGGREGATIONS, RATIOS)]
    + [("token_mean", "token", 0.1, "clip")]
    + [(agg, "token", 0.0, objective) for objective, agg in itertools.product(("cispo", "sapo", "gmpo"), AGGREGATIONS)]
)


def _batch() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)  # the same batch on every rank
    logp = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3  # [N, T]
    noise = torch.randn(N, T, generator=gen, dtype=torch.float64)  # [N, T]
    old = logp + 0.3 * (noise + torch.randn(N, 1, generator=gen, dtype=torch.float64))  # [N, T]
    ref = logp + 0.3 * torch.randn(N, T, generator=gen, dtype=torch.float64)  # [N, T]
    adv = torch.randn(N, generator=gen, dtype=torch.float64)  # [N]
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).to(torch.float64)  # [N, T]
    return logp, old, ref, adv, mask


def _grad_and_loss(case: tuple[str, str, float, str], rows: slice, **counts: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient w.r.t. the shared [N, T] logprob 'parameter' of the loss over `rows` (zero outside them)."""
    aggregation, ratio, kl_coef, objective = case
    logp, old, ref, adv, mask = _batch()
    w = logp.clone().requires_grad_(True)  # [N, T]
    loss, _ = policy_loss(
        w[rows], old[rows], adv[rows], mask[rows], ratio=ratio, clip_low=0.2, clip_high=0.28,
        aggregation=aggregation, max_len=T, objective=objective, ref_logprobs=ref[rows], kl_coef=kl_coef, **counts,
    )  # fmt: skip
    loss.backward()
    assert w.grad is not None
    return w.grad, loss.detach()


def _worker(rank: int, world_size: int, tmp: str) -> None:
    torch.set_num_threads(1)  # two CPU ranks on a small machine
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world_size)
    try:
        per_rank = N // world_size
        assert per_rank % G == 0, "each rank must hold whole groups"
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        num_tokens = _batch()[4][rows].sum()  # []
        dist.all_reduce(num_tokens)  # SUM: the global token count
        out = {}
        for case in CASES:
            grad, loss = _grad_and_loss(case, rows, num_sequences=N, num_tokens=num_tokens, loss_scale=world_size)
            dist.all_reduce(grad)  # DDP/FSDP: sum then divide by world size
            dist.all_reduce(loss)
            out["/".join(map(str, case))] = (grad / world_size, loss / world_size)
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [1, 2])
def test_ranks_reproduce_full_batch_gradient(world_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = Path(__file__).resolve().parent
    for path in (here.parent, here):  # spawned children re-import this module by name, under either import mode
        monkeypatch.syspath_prepend(str(path))
    mp.start_processes(_worker, args=(world_size, str(tmp_path)), nprocs=world_size, join=True, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
    for case in CASES:
        full_grad, full_loss = _grad_and_loss(case, slice(None))
        assert full_grad.abs().sum() > 0
        for result in results:
            grad, loss = result["/".join(map(str, case))]
            torch.testing.assert_close(grad, full_grad, rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(loss, full_loss, rtol=1e-6, atol=1e-12)
