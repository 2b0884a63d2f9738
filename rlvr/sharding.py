"""The learner's sharding and loading: a model built under FSDP2 without a full copy per rank, its full weights
gathered back one FSDP unit at a time (and written as a Hugging Face safetensors folder), and its sharded state written
and read with torch.distributed.checkpoint.

A sharded model is built on the meta device on every rank (no memory), `fully_shard`-ed per decoder layer and at the
root, given its own shards, and filled by a broadcast from rank 0, the only rank that reads the checkpoint: one full
copy on one rank instead of one per rank (227 GiB of fp32 per 8-rank node for a 7B model). rlvr.settings.sharded
decides whether a run shards at all; rlvr.learner uses what is here.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard
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
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{model_path}: found no decoder layers to shard (model._no_split_modules={getattr(model, '_no_split_modules', None)})")
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


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder blocks: the modules of the class transformers names in _no_split_modules."""
    layer_types = set(getattr(model, "_no_split_modules", None) or [])  # HF's name for the decoder block class
    return [m for m in model.modules() if type(m).__name__ in layer_types]


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


def gathered_units(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None = None
                   ) -> Iterator[dict[str, torch.Tensor]]:  # fmt: skip
    """The model's whole tensors, {name: tensor} in model.named_parameters() names (tied weights once), one
    FSDP unit at a time: each decoder layer, and the root's own parameters (embedding, final norm, head) first.

    A unit's shards travel in one all-gather per dtype, in `dtype` where that is narrower than a parameter's own (the
    same values as casting the whole tensor after: a cast is elementwise), instead of one all-gather per parameter in
    the master dtype. A collective: every rank must consume the iterator, in order. Peak extra memory is about two of
    the largest unit (the gather's buffer, reused from unit to unit, and the tensors copied out of it), not the model.
    The plain module (a world of one) is one unit of its own parameters, uncast and uncopied."""
    reshard(model)  # gathered root parameters are plain tensors; their shards are what every rank holds alike
    fsdp = [name + "." for name, m in model.named_modules() if isinstance(m, FSDPModule) and name]
    units: dict[str, list[tuple[str, torch.Tensor]]] = {}  # owning FSDP module's prefix ("": the root) -> parameters
    for name, param in model.named_parameters():
        owner = max((prefix for prefix in fsdp if name.startswith(prefix)), key=len, default="")
        units.setdefault(owner, []).append((name, param))
    # one buffer per wire dtype for every unit: on CPUs each fresh allocation past glibc's 32 MiB mmap threshold is
    # faulted in page by page again (a 258M-parameter model's fp32 push on 2 ranks took 4.0 s so, 1.65 s per parameter)
    buffers: dict[torch.dtype, torch.Tensor] = {}
    for params in units.values():
        by_dtype: dict[torch.dtype, list[tuple[str, DTensor]]] = {}
        for name, p in params:
            if isinstance(p, DTensor):
                wire = p.dtype if dtype is None or dtype.itemsize >= p.dtype.itemsize else dtype
                by_dtype.setdefault(wire, []).append((name, p))
        whole = {name: t for wire, group in by_dtype.items() for bucket in _buckets(group, wire)
                 for name, t in _all_gather(bucket, device, wire, buffers)}  # fmt: skip
        yield {name: whole[name] if name in whole else p.detach() for name, p in params}


GLOO_BUCKET_BYTES = 4 * 2**20  # gloo (CPU) all-gathers at most this much of one rank's shards at once


def _buckets(params: list[tuple[str, DTensor]], dtype: torch.dtype) -> Iterator[list[tuple[str, DTensor]]]:
    """A unit's parameters, in groups for one all-gather each: all of them (NCCL), or, on gloo, consecutive ones of
    at most GLOO_BUCKET_BYTES of shards (a parameter larger than that alone): gloo's all-gather of one 45 MB buffer took
    0.11-0.15 s on 2 CPU ranks, the same bytes in 7 per-parameter ones 0.05 s."""
    mesh = params[0][1].device_mesh
    if torch.distributed.get_backend(mesh.get_group()) != "gloo":
        yield params
        return
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, p in params:
        nbytes = p.numel() // mesh.size() * dtype.itemsize
        if bucket and size + nbytes > GLOO_BUCKET_BYTES:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, p))
        size += nbytes
    yield bucket


def _all_gather(params: list[tuple[str, DTensor]], device: torch.device, dtype: torch.dtype,
                buffers: dict[torch.dtype, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:  # fmt: skip
    """Whole tensors (copies) of FSDP2 parameters, in one all-gather of their local shards packed into a flat buffer
    in `dtype` (buffers[dtype], grown as needed). FSDP2 cuts dim 0 into world-size chunks of ceil(rows / world) rows
    (torch.chunk; the last ranks' shorter, or empty): each rank's share of the buffer leaves room for that many rows of
    each parameter (unset past its own rows, cut off after), so the gathered [world, numel] holds every chunk at the
    same place."""
    mesh = params[0][1].device_mesh
    if mesh.ndim != 1 or any(p.placements != (Shard(0),) for _, p in params):
        raise ValueError("gathered_units: expected FSDP2 parameters sharded on dim 0 over a 1-D mesh")
    world = mesh.size()
    rows = [-(-p.shape[0] // world) for _, p in params]  # each rank's chunk, padded
    sizes = [r * math.prod(p.shape[1:]) for r, (_, p) in zip(rows, params)]
    numel = sum(sizes)
    if dtype not in buffers or buffers[dtype].numel() < (world + 1) * numel:
        buffers[dtype] = torch.empty((world + 1) * numel, dtype=dtype, device=device)
    local, gathered = buffers[dtype][:numel], buffers[dtype][numel : (world + 1) * numel]  # [numel], [world * numel]
    for (_, p), piece in zip(params, local.split(sizes)):
        shard = p.to_local().detach().reshape(-1)  # offloaded shards come to the device and into `dtype` in the copy
        piece[: shard.numel()].copy_(shard)
    torch.distributed.all_gather_single(gathered, local, group=mesh.get_group())
    per_rank = gathered.view(world, numel)
    start = 0
    for (name, p), r, size in zip(params, rows, sizes):
        whole = torch.empty(world * r, *p.shape[1:], dtype=dtype, device=device)
        whole.view(world, size).copy_(per_rank[:, start : start + size])  # (out of the buffer the next unit reuses)
        yield name, whole[: p.shape[0]]
        start += size


def write_safetensors(named: Iterable[tuple[str, torch.Tensor]], folder: Path, *, max_shard_bytes: int) -> None:
    """`named` tensors into `folder` as transformers lays out a checkpoint, written as they arrive: one
    model.safetensors, or model-0000i-of-0000n.safetensors files of at most `max_shard_bytes` each (a tensor larger
    than that has a file of its own) and model.safetensors.index.json. The host holds one file's tensors at a time.
    Weight files of an earlier save in `folder` are removed (transformers would load a stale model.safetensors first)."""
    for old in [*folder.glob("model*.safetensors"), folder / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    files: list[list[str]] = []  # the names in each file written, in order
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = total = 0

    def flush() -> None:
        save_file(shard, folder / f"part-{len(files)}.safetensors.tmp", metadata={"format": "pt"})
        files.append(list(shard))
        shard.clear()

    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + nbytes > max_shard_bytes:
            flush()
            shard_bytes = 0
        shard[name] = tensor.detach().cpu().contiguous()
        shard_bytes, total = shard_bytes + nbytes, total + nbytes
    flush()
    if len(files) == 1:
        (folder / "part-0.safetensors.tmp").rename(folder / "model.safetensors")
        return
    weight_map = {}
    for i, names in enumerate(files):
        file = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"  # the count is known once the last file is written
        (folder / f"part-{i}.safetensors.tmp").rename(folder / file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


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
