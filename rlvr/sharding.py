"""The learner's sharding and loading: a model built under FSDP2 without a full copy per rank, its full weights
gathered back one parameter at a time, and its sharded state written and read with torch.distributed.checkpoint.

A sharded model is built on the meta device on every rank (no memory), `fully_shard`-ed per decoder layer and at the
root, given its own shards, and filled by a broadcast from rank 0, the only rank that reads the checkpoint: one full
copy on one rank instead of one per rank (227 GiB of fp32 per 8-rank node for a 7B model). rlvr.settings.sharded
decides whether a run shards at all; rlvr.learner uses what is here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory) and their buffers as usual (rotary
    tables are computed at construction and are in no checkpoint), as accelerate's init_empty_weights(include_buffers=
    False) does."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":  # (a meta one is being shared: tied embeddings stay tied)
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def build(
    model_path: str,
    dtype: torch.dtype,
    adapted: Callable[[PreTrainedModel], PreTrainedModel],
    *,
    device: torch.device,
    sharded: bool,
    rank: int,
    world_size: int,
    mp_policy: MixedPrecisionPolicy,
    offload: OffloadPolicy,
) -> PreTrainedModel:
    """The model from `model_path` in `dtype`, passed through `adapted` (activation checkpointing, a LoRA adapter), on
    `device`: the plain module, or (sharded) fully_shard-ed per decoder layer and at the root with rank 0's weights
    broadcast into every rank's shards (module docstring)."""
    if not sharded:
        model = adapted(AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype))
        torch.nn.Module.to(model, device)  # (not through transformers' `to`, which mypy mis-types)
        return model
    full = adapted(AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)).state_dict() if rank == 0 else {}
    with parameters_on_meta():
        model = adapted(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=dtype))
    buffers = {name: b.clone() for name, b in model.named_buffers()}  # rotary tables etc., computed, not stored
    mesh = init_device_mesh(device.type, (world_size,))
    layer_types = set(getattr(model, "_no_split_modules", None) or [])  # HF's name for the decoder block class
    layers = [m for m in model.modules() if type(m).__name__ in layer_types]
    if not layers:
        raise ValueError(f"{model_path}: found no decoder layers to shard (model._no_split_modules={layer_types})")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    model.to_empty(device="cpu" if isinstance(offload, CPUOffloadPolicy) else device)  # this rank's shards
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)  # rank 0's weights into every rank's shards
    return model


def full_tensor(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A parameter's whole tensor: all-gathered from its shards (a collective), or itself."""
    if isinstance(param, DTensor):
        shard = cast(DTensor, param.detach().to(device))  # offloaded shards come to the device first
        return shard.full_tensor()  # all-gather this parameter's shards
    return param.detach()  # the root's parameters stay gathered after a forward (FSDP2's heuristic for the root)


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 module back to its shards (FSDP2 leaves the root's parameters gathered after a forward)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def save_state(state: dict, folder: Path, *, world_size: int) -> None:
    """`state` (sharded tensors) into `folder` with torch.distributed.checkpoint; each rank writes its own shards
    (fsynced); a collective. A world of one skips DCP's collectives (no_dist): after a save that ran them over the
    one-rank gloo group, every later CPU update of this process ran 2.2x slower (31 -> 71 ms on the built-in model;
    cause not found, measured in isolation, reproducible)."""
    with warnings.catch_warnings():  # no_dist warns that it assumes a single process: that is the intent
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=world_size == 1)


def load_state(state: dict, folder: Path, *, world_size: int) -> None:
    """What save_state wrote, into `state`'s tensors in place (any world size: DCP reshards on load); a collective."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(folder), no_dist=world_size == 1)
