"""The policy (and, when the KL term is on, a frozen reference) and its optimizer: logprobs, the update, the weights
out (to the engine, to a folder) and the sharded state in and out. Built from a run's config by Learner.from_config.
(~470 lines, one job, the Learner class: its rooms, the head kernel (lm_head), the micro-batch plan (batching), the
sharding (sharding) and the adapter (lora), are modules of their own; what is left is its update and what crosses it.)

Every rank holds a shard of every parameter when the run is sharded (rlvr.sharding builds it: `fully_shard` per
decoder layer and at the root; rlvr.settings.sharded decides; a world of one trains the plain module). Every rank is
handed the same full batch; each computes logprobs for, and trains on, its own contiguous share of the rows, and the
loss normalizers are the batch's global counts, so the summed gradient over micro-batches and ranks is the full-batch
gradient (rlvr.algo.aggregate). After the updates the full weights are gathered one FSDP unit (decoder layer) at a
time, in the receiver's dtype, for the rollout engine and the exported folder. The LM head's chunked logprobs are
rlvr.lm_head's, the micro-batch plan rlvr.batching's, the adapter rlvr.lora's. (~420 lines: the class is one job, the
update's contract; the CPU allocator setting and the lr schedule beside it are the optimizer's.)"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import math
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel

from rlvr import algo, chat, distributed, flops, lora, settings, sharding
from rlvr.batching import micro_batches, split_to
from rlvr.config import AUTO, ConfigError
from rlvr.lm_head import has_plain_head, response_logprobs
from rlvr.types import Completion, RolloutBatch

# devices with torch's fused AdamW kernel (torch.utils._foreach_utils._get_fused_kernels_supported_devices, less the rare ones)
FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda", "xpu", "mps")
EXPORT_SHARD_BYTES = 2 * 2**30  # the exported folder's safetensors files: at most this much each (7B in bf16: 8 files)


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


def compile_layers(model: torch.nn.Module, *, sharded: bool, checkpointing: bool) -> None:
    """trainer.compile: torch.compile each decoder layer in place (inductor, dynamic shapes: rows and lengths change every
    micro-batch). The layers share one compiled graph; the first forward and backward compile it (SmolLM2-135M: ~15 s on
    2 CPU cores), then its fused kernels replace the layers' small elementwise ops (docs/measured/speed.md). The
    embedding, the final norm and rlvr's LM head stay eager."""
    if sharded or checkpointing:  # (rlvr.settings.resolve refuses these, and LoRA, at start-up)
        raise ConfigError(settings.COMPILE_UNMEASURED)
    layers = sharding.decoder_layers(model)
    if not layers:
        raise ConfigError(f"trainer.compile: found no decoder layers to compile in {type(model).__name__} "
                          f"(_no_split_modules={getattr(model, '_no_split_modules', None)}); set trainer.compile=false")  # fmt: skip
    for layer in layers:
        layer.compile(dynamic=True)


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


def loss_options(cfg: Any) -> algo.LossOptions:
    """The run's loss options: the recipe's algo.* and the rollout's max length (Dr.GRPO's normalizer)."""
    a = cfg.algo
    return algo.LossOptions(
        ratio=a.ratio.value,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        clip_ratio_c=a.clip_ratio_c,
        aggregation=a.aggregation.value,
        max_len=cfg.rollout.max_new_tokens,
        objective=a.objective.value,
        sapo_tau_pos=a.sapo_tau_pos,
        sapo_tau_neg=a.sapo_tau_neg,
        kl_coef=a.kl_coef,
        kl_estimator=a.kl_estimator.value,
        rollout_correction=a.rollout_correction.value,
        rollout_correction_cap=a.rollout_correction_cap,
    )


class Learner:
    """A causal LM trained by the clipped policy-gradient loss of rlvr.algo, sharded by FSDP2 over all ranks (a
    world of one trains the plain module)."""

    @classmethod
    def from_config(cls, cfg: Any, model_path: str, *, shard: bool | None = None) -> Learner:
        """The run's learner: `cfg` a validated Config whose device settings rlvr.settings has resolved (for_run),
        `model_path` the resolved model.path. `shard`: True trains under FSDP2 even alone (tests: the same step as the
        plain module); None leaves it to rlvr.settings.sharded."""
        t = cfg.trainer
        unresolved = [k for k in ("precision", "micro_batch_tokens", "logits_chunk_tokens", "tf32", "activation_checkpointing")
                      if getattr(t, k) == AUTO]  # fmt: skip
        if unresolved:
            raise ValueError(f"Learner.from_config: trainer.{', trainer.'.join(unresolved)} still auto; resolve the "
                             "config first (rlvr.settings.for_run), as rlvr train does")  # fmt: skip
        return cls(cfg, model_path, shard=shard)

    def __init__(self, cfg: Any, model_path: str, *, shard: bool | None = None) -> None:
        """Use from_config."""
        a, t = cfg.algo, cfg.trainer
        distributed.init()
        self.model_path = model_path
        self.chat_template = chat.read_template(getattr(cfg.model, "chat_template", None))  # saved with the model
        self.device = distributed.device()
        self.world_size = distributed.world_size()  # FSDP averages gradients over ranks; the loss is scaled by this
        self.rank = distributed.rank()
        if self.device.type == "cpu":
            keep_freed_memory()
        if t.cpu_offload and self.device.type != "cuda":
            raise ConfigError("trainer.cpu_offload moves FSDP2 state from the GPU to the CPU; on a CPU-only machine it does nothing useful: set it to false")
        dtype = cfg.model.dtype
        bf16 = t.precision == "bf16"  # resolved by rlvr.settings
        self.precision = "bf16" if bf16 else dtype
        if t.tf32:  # the matmuls left in fp32 (none of the model's under bf16) use TF32 tensor cores
            torch.set_float32_matmul_precision("high")
        self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        self.offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=True) if t.cpu_offload else OffloadPolicy()
        self.sharded = settings.sharded(self.world_size, t.cpu_offload) if shard is None else shard
        self.autocast_dtype = torch.bfloat16 if settings.autocast(str(t.precision.value), self.sharded) else None
        compute_dtype = "bfloat16" if bf16 else dtype
        lora_spec = lora.LoraSpec.from_config(cfg)
        self.lora = lora_spec
        activation_checkpointing = bool(t.activation_checkpointing)
        # LoRA (rlvr.lora): the base frozen in the compute dtype, the adapter's master weights in `dtype`
        self.model = self._build(compute_dtype if lora_spec else dtype, activation_checkpointing, lora_spec, dtype)
        self.model.train()
        if t.compile:
            compile_layers(self.model, sharded=self.sharded, checkpointing=activation_checkpointing)
        # the frozen reference only ever runs forward in the compute dtype: store it so (half the memory under bf16).
        # With LoRA there is no second model: the reference is a snapshot of the starting adapter (a fresh one has B = 0,
        # so the reference is the base model exactly), swapped in for its pass. (Not peft's disable_adapter: it flips
        # requires_grad on the adapter, and FSDP2 fixes its gradient dtypes at the first forward from requires_grad.)
        self.reference = None
        self.reference_adapter: lora.Snapshot | None = None
        with_reference = a.kl_coef > 0
        if with_reference and lora_spec:
            self.reference_adapter = lora.Snapshot(self.model)
        elif with_reference:
            self.reference = self._build(compute_dtype, False).eval().requires_grad_(False)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]  # all, or the adapter's
        self.shape = flops.Shape.of(self.model)
        self.flops = 0  # the arithmetic of every update and logprob pass so far, all ranks' (rlvr.flops)
        # fused: one kernel over all parameters instead of a Python loop of per-tensor ops (CPU and CUDA since torch 2.4;
        # DTensor shards included): the built-in model's AdamW step takes 0.6 instead of 2.7 ms on 2 CPU cores
        fused = self.device.type in FUSED_OPTIMIZER_DEVICES
        self.optimizer = torch.optim.AdamW(self.trainable, lr=t.lr, weight_decay=t.weight_decay, fused=fused)
        total_updates = t.max_steps * a.prompts_per_step // a.prompts_per_minibatch * a.epochs  # optimizer updates in the run
        schedule = partial(lr_factor, warmup=t.warmup_steps, total=total_updates, schedule=t.lr_schedule.value)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.grad_clip = t.grad_clip
        self.micro_batch_rows = t.micro_batch_rows
        self.micro_batch_tokens = int(t.micro_batch_tokens)
        self.temperature = cfg.rollout.temperature  # the learner's logprobs are those of the distribution the engine samples
        self.logits_chunk_tokens = int(t.logits_chunk_tokens)
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
        in `dtype`), sharded or not (rlvr.sharding.build)."""

        def adapted(model: PreTrainedModel) -> PreTrainedModel:
            if activation_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return lora.wrap(model, lora_spec, getattr(torch, adapter_dtype)) if lora_spec else model

        return sharding.build(self.model_path, getattr(torch, dtype), adapted, device=self.device, sharded=self.sharded,
                              rank=self.rank, world_size=self.world_size, mp_policy=self.mp_policy, offload=self.offload)  # fmt: skip

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 compute for the unsharded model (FSDP2's MixedPrecisionPolicy does it for the sharded one)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _casts_kept(self) -> contextlib.AbstractContextManager:
        """Around a pass's micro-batches (an update's, a logprob pass's): each fp32 weight is cast to bf16 once for them
        all instead of once per micro-batch. Autocast keeps its casts of leaf weights until the outermost autocast
        region exits; this one computes nothing in bf16 itself (the loss stays in fp32) and ends before the optimizer
        moves the weights. The same bf16 weights either way, so the same numbers. SmolLM2-135M's realistic batch (9
        micro-batches, AMX), with the head's fp32 gradient: the logprob pass 0.93x, the update 0.97x (speed.md)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, enabled=False)

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
            sharding.reshard(self.model)
            sharding.reshard(self.reference)
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

    def _response_logprobs(self, model: PreTrainedModel, batch: RolloutBatch, with_entropy: bool,
                           temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        with self._autocast():
            return response_logprobs(model, batch, with_entropy=with_entropy, temperature=self.temperature if temperature is None else temperature,
                                     plain_head=self.plain_head, chunk_tokens=self.logits_chunk_tokens)  # fmt: skip

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, *, reference: bool = False, temperature: float | None = None) -> torch.Tensor:
        """Response logprobs [N, T] under the policy (or the reference) at the sampling temperature (or `temperature`):
        each rank computes its rows, then all share. No dropout (LoRA's): these are the policy's probabilities, not a
        training forward's."""
        self.flops += self.shape.forward(flops.lengths(batch.attention_mask))
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
            with self.reference_adapter.swapped_in(self.model) if in_place else contextlib.nullcontext(), self._casts_kept():  # type: ignore[union-attr]
                for rows in self._micro_batches(mine):
                    local[rows] = self._response_logprobs(model, mine.select(rows), False, temperature)[0].to(local.dtype)
        finally:
            self.model.train()
        if self.reference is not None and model is self.reference:  # FSDP2 keeps the root's gathered embedding and
            sharding.reshard(self.reference)  # head after a forward: the policy's next one needs its own, not these
        if self.world_size == 1:
            return local.cpu()
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, local)
        return torch.cat(gathered).cpu()  # [N, T]

    def sequence_logprobs(self, ids: list[int]) -> torch.Tensor:
        """The logprob of each of ids[1:] given the tokens before it under the policy at temperature 1, as
        rlvr.rollout.Engine.prompt_logprobs gives them: [len(ids) - 1] (rlvr.sync_check). A collective: every rank
        passes the same ids (one row per rank)."""
        row = Completion(prompt_ids=ids[:1], token_ids=ids[1:], text="", finish_reason="length", engine_logprobs=[])
        n = self.world_size
        batch = RolloutBatch.from_completions([row] * n, [0.0] * n, [False] * n, pad_id=0)
        logprobs = self.logprobs(batch, temperature=1.0)[0]
        if self.sharded:  # FSDP2 keeps the root's embedding and head gathered after a forward: not beside the awake engine
            sharding.reshard(self.model)
        return logprobs

    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        *,
        options: algo.LossOptions,
    ) -> dict[str, float]:
        """One optimizer update on a mini-batch (advantages [n], mask [n, T], logprobs [n, T]), the same on every rank.

        Each rank trains on its share of the rows. old_logprobs None means pi_old = pi_theta (one update per
        rollout): the ratio is exactly 1. The normalizers are the mini-batch's global counts, so the summed
        gradient over micro-batches and ranks is the mini-batch gradient whatever the micro-batch layout and world size.
        A non-finite gradient norm skips the optimizer step (`bad` = 1 in the metrics); the lr schedule still advances.
        """
        self.flops += flops.UPDATE_PASSES * self.shape.forward(flops.lengths(batch.attention_mask))
        num_tokens = mask.sum()  # [] the same on every rank: each holds the whole mini-batch
        num_sequences = batch.num_rows
        num_units = algo.metric_units(mask, options.ratio).sum()  # [] what the clip statistics average over
        rows = self._my_rows(batch.num_rows)
        batch, advantages, mask = batch.select(rows).to(self.device), advantages[rows].to(self.device), mask[rows].to(self.device)
        old_logprobs = None if old_logprobs is None else old_logprobs[rows].to(self.device)
        ref_logprobs = None if ref_logprobs is None else ref_logprobs[rows].to(self.device)
        num_tokens, num_units = num_tokens.to(self.device), num_units.to(self.device)
        # The metrics stay on the device until the update is done: one host synchronization reads them all (and one more
        # decides whether the gradient norm is finite), instead of one per metric per micro-batch.
        parts: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []  # each micro-batch's metrics, shares
        entropy_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        plan = self._micro_batches(batch)
        with self._casts_kept():  # each weight cast to bf16 once for every micro-batch
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
                    **options.kwargs(),
                )
                loss.backward()
                # metrics are means over this micro-batch's tokens or units: weight each by its share of the mini-batch's
                share = {
                    "tokens": mask[micro].sum().double() / num_tokens.clamp(min=1),
                    "units": algo.metric_units(mask[micro], options.ratio).sum().double() / num_units.clamp(min=1),
                }
                parts.append((metrics, share))
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
        sums, extremes = algo.combine_metrics(parts)  # "max" metrics, and "min" ones negated
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
        return sharding.full_tensor(param, self.device)

    @torch.no_grad()
    def named_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in checkpoint names (tied weights once), every tensor in `dtype`: the receiver's (the engine's
        rollout.dtype, the exported folder's), so that what it gets is what it would have made of the master weights
        by casting them itself; None: the master weights' own dtype. With LoRA, the base's with the adapter merged in
        (rlvr.lora.merged_weights) from the masters, then cast.

        Gathered one FSDP unit (decoder layer) at a time, each in `dtype` where that is narrower than the masters
        (rlvr.sharding.gathered_units): half the bytes of float32 under a bf16 engine, a few collectives per layer
        instead of one per parameter. A collective: every rank must consume the whole iterator, in order. Peak
        extra memory is about two decoder layers' worth (the root's embedding and head where those are larger).
        """
        units = sharding.gathered_units(self.model, self.device, None if self.lora else dtype)
        named = lora.merged_weights(self.model, units) if self.lora else (kv for unit in units for kv in unit.items())
        for name, tensor in named:
            yield name, tensor if dtype is None else tensor.to(dtype)

    @torch.no_grad()
    def pushed_weights(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """What a push sends the engine (`dtype`: its rollout.dtype): the weights this learner's forward computes with
        (rlvr.settings.push_rounding), in checkpoint names. Under bf16 compute the master weights rounded to bf16, as
        autocast's casts and FSDP2's bf16 gathers round them, then widened to a wider engine's dtype: an fp32 engine
        holding the unrounded masters computes another policy, and an update that barely moves the masters flips every
        weight on a bf16 rounding midpoint by a whole unit in the learner alone (8% of the packaged SmolLM2's weights
        sit on one). Gathered in bf16 (the rounding is the gather's cast). Otherwise named_weights(dtype); with LoRA
        too (its base is stored in the compute dtype already, and the learner adds the adapter's product unrounded)."""
        rounding = settings.push_rounding(self.precision, lora=self.lora is not None)
        if rounding is None:
            yield from self.named_weights(dtype)
            return
        wire = getattr(torch, rounding)
        out = wire if dtype is None else dtype  # (a float16 engine gets float16: bf16 values, cast once more)
        for unit in sharding.gathered_units(self.model, self.device, wire):
            for name, tensor in unit.items():
                yield name, tensor.to(wire).to(out)  # (a gathered shard is in `wire` already; the plain module's are not)

    def export_dtype(self) -> torch.dtype:
        """The dtype of the exported folder: the model's published one (its config.json), so that a bf16 model comes
        back bf16 and not twice its size; the master weights' where the config names none, or where the run asked for
        float64 masters (model.dtype=float64: exact arithmetic end to end, as the tests' references)."""
        masters = self.trainable[0].dtype  # all parameters', or (LoRA) the adapter's: what the merged weights come in
        published = AutoConfig.from_pretrained(self.model_path).dtype
        if isinstance(published, str):
            published = getattr(torch, published, None)
        return masters if masters == torch.float64 or not isinstance(published, torch.dtype) else published

    def checkpoint_bytes(self, *, state: bool = True) -> int:
        """About what one checkpoint of this learner takes on disk (rlvr.run_state holds it against the free space): the
        trained weights and their two AdamW moments and the reference (`state`), the exported model, and a few MiB."""
        trained = sum(p.numel() * p.element_size() for p in self.trainable)  # (a DTensor counts its whole tensor)
        reference = 0 if self.reference is None else sum(p.numel() * p.element_size() for p in self.reference.parameters())
        export = sum(p.numel() for p in self.model.parameters()) * torch.empty((), dtype=self.export_dtype()).element_size()
        return int(1.05 * ((3 * trained + reference if state else 0) + export)) + (4 << 20)

    def save(self, folder: Path, *, max_shard_bytes: int = EXPORT_SHARD_BYTES) -> None:
        """A Hugging Face folder (safetensors in export_dtype, config, generation config, tokenizer) that transformers
        and vLLM load; with LoRA the merged model, and the adapter in its `adapter` folder (rlvr.lora). Rank 0 writes
        the weights as they are gathered, in files of at most `max_shard_bytes` (rlvr.sharding.write_safetensors).

        A collective (the full weights are gathered on every rank).
        """
        dtype = self.export_dtype()
        named = self.named_weights(dtype)
        failed: Exception | None = None
        if self.rank == 0:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                sharding.write_safetensors(named, folder, max_shard_bytes=max_shard_bytes)
            except OSError as e:  # (a full disk): the other ranks are in the gathers, waiting for this one
                failed = e
        for _ in named:  # every rank takes part in each gather; rank 0 alone writes (the rest, after a failed write)
            pass
        if distributed.any_true(failed is not None):  # every rank stops, none waits in a collective
            raise failed or OSError(f"saving {folder} failed on rank 0")
        adapter = self.save_adapter(folder / lora.ADAPTER_FOLDER) if self.lora else None
        if self.rank == 0:
            base = self.model.get_base_model() if adapter is not None else self.model  # type: ignore[operator]
            config = copy.deepcopy(base.config)  # (the learner's own records the masters' dtype)
            config.dtype = str(dtype).removeprefix("torch.")
            config.architectures = [type(base).__name__.removeprefix("FSDP")]  # FSDP2 renames the class it wraps
            config.save_pretrained(folder)
            if base.can_generate():
                base.generation_config.save_pretrained(folder)
            chat.use_template(AutoTokenizer.from_pretrained(self.model_path), self.chat_template).save_pretrained(folder)

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
        """Sharded policy, optimizer (and reference) state into `folder` (rlvr.sharding.save_state); a collective. The
        lr schedule is the trainer's to save."""
        sharding.save_state(self._sharded_state(), folder, world_size=self.world_size)

    def load_state(self, folder: Path) -> None:
        """Restore what save_state wrote (any world size: DCP reshards on load); a collective."""
        state = self._sharded_state()
        sharding.load_state(state, folder, world_size=self.world_size)
        options = StateDictOptions(strict=self.lora is None)  # LoRA: the frozen base is not in the checkpoint
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
        if self.reference is not None:  # (LoRA's snapshot was loaded in place)
            set_model_state_dict(self.reference, state["reference"])
