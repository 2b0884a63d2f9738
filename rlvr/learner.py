"""The policy (and, when the KL term is on, a frozen reference) under FSDP2, and its optimizer.

Every rank holds a shard of every parameter (`fully_shard` per decoder layer and at the root; a world of one
trains the plain module). Every rank is handed the same full batch; each computes logprobs for, and trains
on, its own contiguous share of the rows, and the loss normalizers are the batch's global counts, so the
summed gradient over micro-batches and ranks is the full-batch gradient (rlvr.algo.aggregate). After the
updates the full weights are gathered one parameter at a time for the rollout engine. The LM head's chunked logprobs
are rlvr.lm_head's, the micro-batch plan rlvr.batching's.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlvr import algo, distributed, lora
from rlvr.batching import micro_batches, split_to
from rlvr.config import ConfigError
from rlvr.lm_head import has_plain_head, response_logprobs
from rlvr.settings import DeviceSpec
from rlvr.types import RolloutBatch

# devices with torch's fused AdamW kernel (torch.utils._foreach_utils._get_fused_kernels_supported_devices, less the rare ones)
FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda", "xpu", "mps")


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
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


def keep_freed_memory() -> None:
    """Let glibc keep freed tensor memory for reuse instead of returning it to the OS (CPU training).

    By default glibc serves large allocations with mmap and unmaps them on free, so every step's activations are
    faulted in page by page again: on the SmolLM2-135M benchmark half of the update's time was system time. Raising
    the mmap threshold to its maximum (32 MiB) and the trim threshold to 2 GiB keeps them in the heap. Measured with
    this and the reused logits buffers of _TokenLogprobs (6 of its layers, 64 long-tailed rows, 2 cores): 59 s per
    update (30 s of it system time) before, 40 s (4 s) after. A no-op where glibc is absent.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
    libc.mallopt(m_mmap_threshold, 32 * 2**20)
    libc.mallopt(m_trim_threshold, 2 * 2**30)


def lr_factor(update: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer update `update` (0-based): linear warmup, then the schedule."""
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r}; valid choices: constant, cosine")


class Learner:
    """A causal LM trained by the clipped policy-gradient loss of rlvr.algo, sharded by FSDP2 over all ranks (a
    world of one trains the plain module)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        lr: float,
        weight_decay: float,
        warmup_steps: int,
        lr_schedule: str,
        total_updates: int,
        grad_clip: float,
        micro_batch_rows: int,
        with_reference: bool,
        micro_batch_tokens: int = 0,
        temperature: float = 1.0,
        precision: str = "auto",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        shard: bool | None = None,
        logits_chunk_tokens: int = 0,
        tf32: bool = False,
        lora_spec: lora.LoraSpec | None = None,
    ) -> None:
        distributed.init()
        self.model_path = model_path
        self.device = distributed.device()
        self.world_size = distributed.world_size()  # FSDP averages gradients over ranks; the loss is scaled by this
        self.rank = distributed.rank()
        if self.device.type == "cpu":
            keep_freed_memory()
        if cpu_offload and self.device.type != "cuda":
            raise ConfigError("trainer.cpu_offload moves FSDP2 state from the GPU to the CPU; on a CPU-only machine it does nothing useful: set it to false")
        # precision comes resolved (rlvr.settings); auto here, for direct users of the class, takes the same rule
        if precision == "auto":
            precision = "bf16" if dtype == "float32" and DeviceSpec.detect().bf16 else "fp32"
        bf16 = precision == "bf16"
        self.precision = "bf16" if bf16 else dtype
        if tf32:  # the matmuls left in fp32 (none of the model's under bf16) use TF32 tensor cores
            torch.set_float32_matmul_precision("high")
        self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        self.offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=True) if cpu_offload else OffloadPolicy()
        # FSDP2 over a single rank shards nothing but puts DTensor dispatch and parameter copy-in/out on every op
        # (63 vs 42 ms per update of the built-in model, +50%): a world of one trains the plain module, with
        # autocast for bf16, unless CPU offload (an FSDP2 feature) is asked for.
        self.sharded = self.world_size > 1 or cpu_offload if shard is None else shard  # shard=True: FSDP2 even alone
        self.autocast_dtype = torch.bfloat16 if bf16 and not self.sharded else None
        compute_dtype = "bfloat16" if bf16 else dtype
        self.lora = lora_spec
        # LoRA (rlvr.lora): the base frozen in the compute dtype, the adapter's master weights in `dtype`
        self.model = self._build(compute_dtype if lora_spec else dtype, activation_checkpointing, lora_spec, dtype)
        self.model.train()
        # the frozen reference only ever runs forward in the compute dtype: store it so (half the memory under bf16).
        # With LoRA there is no second model: the base with the adapter disabled, or a snapshot of the adapter
        # With LoRA there is no second model: the reference is a snapshot of the starting adapter (a fresh one has B = 0,
        # so the reference is the base model exactly), swapped in for its pass. (Not peft's disable_adapter: it flips
        # requires_grad on the adapter, and FSDP2 fixes its gradient dtypes at the first forward from requires_grad.)
        self.reference = None
        self.reference_adapter: lora.Snapshot | None = None
        if with_reference and lora_spec:
            self.reference_adapter = lora.Snapshot(self.model)
        elif with_reference:
            self.reference = self._build(compute_dtype, False).eval().requires_grad_(False)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]  # all, or the adapter's
        # fused: one kernel over all parameters instead of a Python loop of per-tensor ops (CPU and CUDA since torch 2.4;
        # DTensor shards included): the built-in model's AdamW step takes 0.6 instead of 2.7 ms on 2 CPU cores
        fused = self.device.type in FUSED_OPTIMIZER_DEVICES
        self.optimizer = torch.optim.AdamW(self.trainable, lr=lr, weight_decay=weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, warmup=warmup_steps, total=total_updates, schedule=lr_schedule)
        )
        self.grad_clip = grad_clip
        self.micro_batch_rows = micro_batch_rows
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.logits_chunk_tokens = logits_chunk_tokens  # 0: rlvr.settings' CPU rule
        # GPUs: FSDP2 reduce-scatters each micro-batch's gradients as its backward ends (NCCL overlaps it with the
        # backward), so every rank keeps only its shard of them; syncing only after the last micro-batch would keep
        # unsharded fp32 gradients on every rank (28 GiB at 7B, against 3.5 GiB sharded over 8). CPUs: once, after the
        # last: gloo's reduce-scatters do not overlap, and a 59M model on 2 ranks (4 micro-batches) measured 7.16 s and
        # 1219 MiB of live tensors per update syncing every micro-batch, 5.53 s and 1157 MiB syncing once
        self.sync_every_micro_batch = self.device.type == "cuda"
        self.model.eval()  # (without dropout: the check compares two forwards)
        self.plain_head = has_plain_head(self.model, self.device)  # else response logprobs take the model's own logits
        self.model.train()

    def _build(self, dtype: str, activation_checkpointing: bool, lora_spec: lora.LoraSpec | None = None,
               adapter_dtype: str = "float32") -> PreTrainedModel:  # fmt: skip
        """The model from `model_path` on this rank's device (with lora_spec's adapter, in `adapter_dtype`, over a base
        in `dtype`): fully_shard-ed per decoder layer and at the root when sharded. Sharded, only rank 0 reads the
        checkpoint; every rank builds the model with its parameters on the meta device (no memory), shards it,
        allocates its own shards, and rank 0 broadcasts the weights (and its seeded adapter) into them: one full copy
        on one rank instead of one per rank (227 GiB of fp32 per 8-rank node for a 7B model)."""
        torch_dtype = getattr(torch, dtype)

        def adapted(model: PreTrainedModel) -> PreTrainedModel:
            if activation_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return lora.wrap(model, lora_spec, getattr(torch, adapter_dtype)) if lora_spec else model

        if not self.sharded:
            model = adapted(AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype))
            torch.nn.Module.to(model, self.device)  # (not through transformers' `to`, which mypy mis-types)
            return model
        full = adapted(AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)).state_dict() if self.rank == 0 else {}
        with _parameters_on_meta():
            model = adapted(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_path), dtype=torch_dtype))
        buffers = {name: b.clone() for name, b in model.named_buffers()}  # rotary tables etc., computed, not stored
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        layer_types = set(getattr(model, "_no_split_modules", None) or [])  # HF's name for the decoder block class
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        if not layers:
            raise ValueError(f"{self.model_path}: found no decoder layers to shard (model._no_split_modules={layer_types})")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        fully_shard(model, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        model.to_empty(device="cpu" if isinstance(self.offload, CPUOffloadPolicy) else self.device)  # this rank's shards
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full, options=options)  # rank 0's weights into every rank's shards
        return model

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 compute for the unsharded model (FSDP2's MixedPrecisionPolicy does it for the sharded one)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _my_rows(self, num_rows: int) -> slice:
        """This rank's contiguous share of a batch that every rank holds in full."""
        if num_rows % self.world_size:
            raise ValueError(f"{num_rows} rows cannot be split evenly over {self.world_size} ranks")
        share = num_rows // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def release_memory(self) -> None:
        """Hand the learner's cached, unused GPU blocks back to the device, so that the engine can wake into them
        (rlvr.rollout.Engine.load_weights); nothing on a CPU."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the allocator keeps freed activation blocks otherwise; vLLM's own pool cannot use them

    def refresh_reference(self) -> None:
        """pi_ref <- pi_theta (shard by shard: both models are sharded the same way; with LoRA, the adapter's)."""
        if self.reference_adapter is not None:
            self.reference_adapter.copy_from(self.model)
        if self.reference is not None:
            for model in (self.model, self.reference):
                for module in model.modules():  # FSDP2 leaves the root's parameters gathered after a forward
                    if isinstance(module, FSDPModule):
                        module.reshard()
            with torch.no_grad():
                for ref, param in zip(self.reference.parameters(), self.model.parameters(), strict=True):
                    ref.copy_(param)

    def _micro_batches(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """This rank's rows as micro-batches (index tensors) by trainer.micro_batch_tokens / micro_batch_rows; as many
        on every rank (FSDP2's collectives run once per forward and backward)."""
        lengths = batch.attention_mask.sum(1).tolist()  # [n] prompt + response tokens per row
        plan = micro_batches(lengths, max_rows=self.micro_batch_rows, max_tokens=self.micro_batch_tokens)
        if self.world_size > 1:
            plan = split_to(plan, lengths, max(distributed.all_gather_objects(len(plan))))
        return [torch.tensor(rows, device=self.device) for rows in plan]

    def _response_logprobs(self, model: PreTrainedModel, batch: RolloutBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._autocast():
            return response_logprobs(model, batch, with_entropy=with_entropy, temperature=self.temperature,
                                     plain_head=self.plain_head, chunk_tokens=self.logits_chunk_tokens)  # fmt: skip

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """Response logprobs [N, T] under the policy (or the reference): each rank computes its rows, then all share.
        No dropout (LoRA's): these are the policy's probabilities, not a training forward's."""
        in_place = reference and self.reference is None  # LoRA: the policy's model, as the reference
        model = self.model if not reference or in_place else self.reference
        assert model is not None, "no reference model: kl_coef is 0"
        mine = batch.select(self._my_rows(batch.num_rows)).to(self.device)
        dtype = torch.promote_types(self.trainable[0].dtype, torch.float32)  # bf16 compute still returns fp32
        local = torch.zeros(mine.response_mask.shape, dtype=dtype, device=self.device)  # [N / world, T]
        if in_place:
            assert self.reference_adapter is not None, "no reference: kl_coef is 0"
        self.model.eval()
        try:
            with self.reference_adapter.swapped_in(self.model) if in_place else contextlib.nullcontext():  # type: ignore[union-attr]
                for rows in self._micro_batches(mine):
                    local[rows] = self._response_logprobs(model, mine.select(rows), False)[0].to(local.dtype)
        finally:
            self.model.train()
        if self.world_size == 1:
            return local.cpu()
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, local)
        return torch.cat(gathered).cpu()  # [N, T]

    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        *,
        loss_kwargs: dict,
    ) -> dict[str, float]:
        """One optimizer update on a mini-batch (advantages [n], mask [n, T], logprobs [n, T]), the same on every rank.

        Each rank trains on its share of the rows. old_logprobs None means pi_old = pi_theta (one update per
        rollout): the ratio is exactly 1. The normalizers are the mini-batch's global counts, so the summed
        gradient over micro-batches and ranks is the mini-batch gradient whatever the micro-batch layout and world size.
        A non-finite gradient norm skips the optimizer step (`bad` = 1 in the metrics); the lr schedule still advances.
        """
        num_tokens = mask.sum()  # [] the same on every rank: each holds the whole mini-batch
        num_sequences = batch.num_rows
        num_units = algo.metric_units(mask, loss_kwargs["ratio"]).sum()  # [] what the clip statistics average over
        rows = self._my_rows(batch.num_rows)
        batch, advantages, mask = batch.select(rows).to(self.device), advantages[rows].to(self.device), mask[rows].to(self.device)
        old_logprobs = None if old_logprobs is None else old_logprobs[rows].to(self.device)
        ref_logprobs = None if ref_logprobs is None else ref_logprobs[rows].to(self.device)
        num_tokens, num_units = num_tokens.to(self.device), num_units.to(self.device)
        # The metrics stay on the device until the update is done: one host synchronization reads them all (and one more
        # decides whether the gradient norm is finite), instead of one per metric per micro-batch.
        sums: dict[str, torch.Tensor] = {}  # metrics reduced by "sum", "tokens" or "units" (algo.METRIC_REDUCTIONS)
        extremes: dict[str, torch.Tensor] = {}  # "max" metrics, and "min" ones negated
        entropy_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        plan = self._micro_batches(batch)
        for j, micro in enumerate(plan):  # micro: row indices [m]
            if isinstance(self.model, FSDPModule) and not self.sync_every_micro_batch:
                self.model.set_requires_gradient_sync(j == len(plan) - 1)  # reduce-scatter once, after the last
            part = batch.select(micro)
            logp, entropy = self._response_logprobs(self.model, part, True)  # [m, T]
            loss, metrics = algo.policy_loss_terms(
                logp,
                logp.detach() if old_logprobs is None else old_logprobs[micro],
                advantages[micro],
                mask[micro],
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro],
                engine_logprobs=part.engine_logprobs,
                num_sequences=num_sequences,
                num_tokens=num_tokens,
                loss_scale=self.world_size,
                **loss_kwargs,
            )
            loss.backward()
            # metrics are means over this micro-batch's tokens or units: weight each by its share of the mini-batch's
            share = {
                "tokens": mask[micro].sum().double() / num_tokens.clamp(min=1),
                "units": algo.metric_units(mask[micro], loss_kwargs["ratio"]).sum().double() / num_units.clamp(min=1),
            }
            for k, v in metrics.items():
                how = algo.METRIC_REDUCTIONS.get(k, "units")
                if how in ("sum", "tokens", "units"):
                    term = v if how == "sum" else v * share[how]
                    sums[k] = sums[k] + term if k in sums else term
                else:
                    v = v if how == "max" else -v
                    extremes[k] = torch.maximum(extremes[k], v) if k in extremes else v
            assert entropy is not None
            entropy_sum += (entropy * mask[micro]).sum()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.grad_clip)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        bad = not torch.isfinite(grad_norm).item()  # the same on every rank: the norm is global
        if not bad:
            self.optimizer.step()
        with warnings.catch_warnings():  # after a skipped step torch warns that the schedule moved without an optimizer step
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()  # the schedule counts update slots, skipped or not
        self.optimizer.zero_grad(set_to_none=True)
        # every rank's sums cover its rows, weighted by global counts: the global value is their sum
        keys, names = sorted(sums), sorted(extremes)
        totals = distributed.all_reduce_sum(torch.stack([sums[k] for k in keys] + [entropy_sum]))
        peaks = distributed.all_reduce_max(torch.stack([extremes[k] for k in names])) if names else totals[:0]
        entropy = totals[-1:] / num_tokens.double().clamp(min=1)  # [1] per counted token
        values = torch.cat([totals[:-1], peaks, entropy, grad_norm.double().reshape(1).to(totals.device)]).tolist()  # the one read
        out = dict(zip(keys, values[: len(keys)]))
        out.update({k: v if algo.METRIC_REDUCTIONS[k] == "max" else -v for k, v in zip(names, values[len(keys) : -2])})
        out["entropy"], out["grad_norm"] = values[-2], values[-1]
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["bad"] = float(bad)
        return out

    def _full(self, param: torch.Tensor) -> torch.Tensor:
        """A parameter's whole tensor: all-gathered from its shards (a collective), or itself."""
        if isinstance(param, DTensor):
            shard = cast(DTensor, param.detach().to(self.device))  # offloaded shards come to the device first
            return shard.full_tensor()  # all-gather this parameter's shards
        return param.detach()  # the root's parameters stay gathered after a forward (FSDP2's heuristic for the root)

    @torch.no_grad()
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in checkpoint names (tied weights once), gathered one parameter at a time; with LoRA, the base's
        with the adapter merged in (rlvr.lora.merged_weights).

        A collective: every rank must consume the whole iterator, in order. Peak extra memory is the
        largest single parameter (the gather is bounded by it, not by the model).
        """
        if self.lora:
            yield from lora.merged_weights(self.model, self._full)
            return
        for name, param in self.model.named_parameters():
            yield name, self._full(param)

    def save(self, folder: Path) -> None:
        """A Hugging Face folder (safetensors + config + tokenizer) that transformers and vLLM load; with LoRA the
        merged model, and the adapter in its `adapter` folder (rlvr.lora). Rank 0 writes it.

        A collective (the full weights are gathered on every rank).
        """
        state = {}
        for name, tensor in self.named_weights():  # every rank takes part in each gather; rank 0 alone keeps a copy
            if self.rank == 0:
                state[name] = tensor.cpu()
        adapter = self.save_adapter(folder / lora.ADAPTER_FOLDER) if self.lora else None
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            base = self.model.get_base_model() if adapter is not None else self.model  # type: ignore[operator]
            base.save_pretrained(folder, state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(folder)

    @torch.no_grad()
    def save_adapter(self, folder: Path) -> Path:
        """The adapter as a peft folder (rank 0 writes it; a collective): what the engine loads in adapter sync."""
        weights = lora.adapter_weights(self.model, self._full)
        if self.rank == 0:
            lora.save_adapter(self.model, weights, folder)
        return folder

    def _sharded_state(self) -> dict:
        # LoRA: the adapter and its optimizer state; the frozen base is model.path's, and is not written again
        options = StateDictOptions(ignore_frozen_params=self.lora is not None)
        model, optim = get_state_dict(self.model, self.optimizer, options=options)
        state = {"model": model, "optim": optim}
        if self.reference is not None:  # pi_ref: the initial weights, or pi_theta at the last refresh
            state["reference"] = get_model_state_dict(self.reference)
        if self.reference_adapter is not None:  # LoRA's pi_ref: the adapter at the start or at the last refresh
            state["reference_adapter"] = self.reference_adapter.tensors
        return state

    def save_state(self, folder: Path) -> None:
        """Sharded policy, optimizer (and reference) state with torch.distributed.checkpoint; a collective.

        Each rank writes its own shards (fsynced) into `folder`; the lr schedule is the trainer's to save.
        A world of one skips DCP's collectives (no_dist): after a save that ran them over the one-rank gloo
        group, every later CPU update of this process ran 2.2x slower (31 -> 71 ms on the built-in model;
        cause not found, measured in isolation, reproducible).
        """
        with warnings.catch_warnings():  # no_dist warns that it assumes a single process: that is the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(self._sharded_state(), checkpoint_id=str(folder), no_dist=self.world_size == 1)

    def load_state(self, folder: Path) -> None:
        """Restore what save_state wrote (any world size: DCP reshards on load); a collective."""
        state = self._sharded_state()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(folder), no_dist=self.world_size == 1)
        options = StateDictOptions(strict=self.lora is None)  # LoRA: the frozen base is not in the checkpoint
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
        if self.reference is not None:  # (LoRA's snapshot was loaded in place)
            set_model_state_dict(self.reference, state["reference"])
