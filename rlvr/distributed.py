"""The process group: torchrun's when launched by it, else a one-process group, and the few collectives the loop uses.

Every run has a process group, so the engine has one launch mode (vLLM's `external_launcher`, which joins
the torch.distributed world instead of starting its own) and the loop one set of collectives.
Under torchrun, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT come from the launcher; a plain `rlvr train` makes
a world of one over an in-memory store.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

_set_by_us: list[str] = []


def init() -> None:
    """Join (or create) the default process group; idempotent."""
    if dist.is_initialized():
        return
    launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))  # torchrun's env
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"  # gloo for the small CPU objects (gathered completions), nccl for tensors
    else:
        backend = "gloo"
    if launched:
        dist.init_process_group(backend)
        return
    # A world of one needs no rendezvous: an in-memory store, no port. vLLM's external_launcher reads RANK and
    # LOCAL_RANK from the environment; set them for this process only and take them back in shutdown().
    for key in ("RANK", "LOCAL_RANK"):
        if key not in os.environ:
            os.environ[key] = "0"
            _set_by_us.append(key)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def shutdown() -> None:
    """Leave the process group (after the engine is gone: vLLM's shutdown may already have destroyed it)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    while _set_by_us:
        os.environ.pop(_set_by_us.pop(), None)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def local_world_size() -> int:
    """Ranks on this machine (torchrun's LOCAL_WORLD_SIZE): they share its CPU cores."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    """This rank's compute device."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def engine_index(tensor_parallel_size: int) -> tuple[int, int]:
    """(this rank's engine, the number of engines): each engine is tensor_parallel_size consecutive ranks."""
    return rank() // tensor_parallel_size, world_size() // tensor_parallel_size


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (picklable Python objects: completions, rewards, metrics)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Elementwise sum over ranks (a new tensor on this rank's device)."""
    out = values.detach().clone().to(device())
    if world_size() > 1:
        dist.all_reduce(out)
    return out


def all_reduce_max(values: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum over ranks (a new tensor on this rank's device)."""
    out = values.detach().clone().to(device())
    if world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def any_true(flag: bool) -> bool:
    """True on every rank if it is True on any (e.g. a signal that reached one rank first)."""
    return bool(all_reduce_sum(torch.tensor([float(flag)])).item() > 0)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (used around checkpoint writes: shards first, then rank 0's rename)."""
    if world_size() > 1:
        dist.barrier()
