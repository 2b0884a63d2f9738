"""The policy (and, when the KL term is on, a frozen reference) under FSDP2, and its optimizer.

Every rank holds a shard of every parameter (`fully_shard` per decoder layer and at the root; a world of one
trains the plain module). Every rank is handed the same full batch; each computes logprobs for, and trains
on, its own contiguous share of the rows, and the loss normalizers are the batch's global counts, so the
summed gradient over micro-batches and ranks is the full-batch gradient (rlvr.algo.aggregate). After the
updates the full weights are gathered one parameter at a time for the rollout engine.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlvr import algo, distributed
from rlvr.config import ConfigError
from rlvr.types import RolloutBatch


def response_logprobs(
    model: PreTrainedModel, batch: RolloutBatch, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the response tokens under `model`: [N, T] (and the entropy [N, T] if asked).

    Only what the responses need is computed: the rows are cut to this batch's longest row (no compute on the padding
    that a longer row elsewhere in the step added), and the LM head runs only from the earliest response position on
    (`logits_to_keep`), not over every prompt position. Columns past this batch's longest response are 0.
    """
    width = int(batch.attention_mask.sum(1).max())  # the longest row here (rows are right-padded)
    t = int(batch.response_mask.sum(1).max().clamp(min=1))  # the longest response here
    first = int(batch.response_index[:, 0].min())  # the earliest position whose logits predict a response token
    keep = width - first  # the last `keep` positions hold every predicting logit
    logits = model(
        input_ids=batch.input_ids[:, :width], attention_mask=batch.attention_mask[:, :width], logits_to_keep=keep
    ).logits  # [N, keep, V]
    index = (batch.response_index[:, :t] - first).clamp(0, keep - 1)  # [N, t] (padding columns clamped)
    resp_logits = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[-1]))  # [N, t, V]
    resp_logits = resp_logits.to(torch.promote_types(resp_logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
    logp = torch.log_softmax(resp_logits, dim=-1).gather(-1, batch.response_ids[:, :t, None])[:, :, 0]  # [N, t]
    entropy = algo.entropy_from_logits(resp_logits.detach()) if with_entropy else None  # [N, t]
    pad = batch.response_mask.shape[1] - t
    return torch.nn.functional.pad(logp, (0, pad)), None if entropy is None else torch.nn.functional.pad(entropy, (0, pad))


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
        precision: str = "auto",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        shard: bool | None = None,
    ) -> None:
        distributed.init()
        self.model_path = model_path
        self.device = distributed.device()
        self.world_size = distributed.world_size()  # FSDP averages gradients over ranks; the loss is scaled by this
        self.rank = distributed.rank()
        if cpu_offload and self.device.type != "cuda":
            raise ConfigError("trainer.cpu_offload moves FSDP2 state from the GPU to the CPU; on a CPU-only machine it does nothing useful: set it to false")
        bf16 = precision == "bf16" or (precision == "auto" and self.device.type == "cuda")
        self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        self.offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=True) if cpu_offload else OffloadPolicy()
        # FSDP2 over a single rank shards nothing but puts DTensor dispatch and parameter copy-in/out on every op
        # (63 vs 42 ms per update of the built-in model, +50%): a world of one trains the plain module, with
        # autocast for bf16, unless CPU offload (an FSDP2 feature) is asked for.
        self.sharded = self.world_size > 1 or cpu_offload if shard is None else shard  # shard=True: FSDP2 even alone
        self.autocast_dtype = torch.bfloat16 if bf16 and not self.sharded else None
        self.model = self._build(dtype, activation_checkpointing)
        self.model.train()
        self.reference = self._build(dtype, False).eval().requires_grad_(False) if with_reference else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, warmup=warmup_steps, total=total_updates, schedule=lr_schedule)
        )
        self.grad_clip = grad_clip
        self.micro_batch_rows = micro_batch_rows

    def _build(self, dtype: str, activation_checkpointing: bool) -> PreTrainedModel:
        """The model from `model_path` on this rank's device: fully_shard-ed per decoder layer and at the root
        when sharded. Every rank reads the full checkpoint into CPU memory first, then keeps only its shard."""
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype))
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not self.sharded:
            torch.nn.Module.to(model, self.device)  # (not through transformers' `to`, which mypy mis-types)
            return model
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        layer_types = set(getattr(model, "_no_split_modules", None) or [])  # HF's name for the decoder block class
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        if not layers:
            raise ValueError(f"{self.model_path}: found no decoder layers to shard (model._no_split_modules={layer_types})")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        fully_shard(model, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        if not isinstance(self.offload, CPUOffloadPolicy):
            torch.nn.Module.to(model, self.device)  # the shards (not through transformers' `to`, which mypy mis-types)
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

    def refresh_reference(self) -> None:
        """pi_ref <- pi_theta (shard by shard: both models are sharded the same way)."""
        if self.reference is not None:
            for model in (self.model, self.reference):
                for module in model.modules():  # FSDP2 leaves the root's parameters gathered after a forward
                    if isinstance(module, FSDPModule):
                        module.reshard()
            with torch.no_grad():
                for ref, param in zip(self.reference.parameters(), self.model.parameters(), strict=True):
                    ref.copy_(param)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """Response logprobs [N, T] under the policy (or the reference): each rank computes its rows, then all share."""
        model = self.reference if reference else self.model
        assert model is not None, "no reference model: kl_coef is 0"
        mine = batch.select(self._my_rows(batch.num_rows)).to(self.device)
        with self._autocast():
            parts = [
                response_logprobs(model, mine.select(slice(i, i + self.micro_batch_rows)))[0]
                for i in range(0, mine.num_rows, self.micro_batch_rows)
            ]
        local = torch.cat(parts)  # [N / world, T]
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
        gradient over micro-batches and ranks is the mini-batch gradient whatever micro_batch_rows and the world size.
        A non-finite gradient norm skips the optimizer step (`bad` = 1 in the metrics); the lr schedule still advances.
        """
        num_tokens = mask.sum()  # [] the same on every rank: each holds the whole mini-batch
        num_sequences = batch.num_rows
        num_units = int(algo.metric_units(mask, loss_kwargs["ratio"]).sum())  # what the clip statistics average over
        rows = self._my_rows(batch.num_rows)
        batch, advantages, mask = batch.select(rows).to(self.device), advantages[rows].to(self.device), mask[rows].to(self.device)
        old_logprobs = None if old_logprobs is None else old_logprobs[rows].to(self.device)
        ref_logprobs = None if ref_logprobs is None else ref_logprobs[rows].to(self.device)
        sums: dict[str, float] = {}
        entropy_sum = 0.0
        starts = range(0, batch.num_rows, self.micro_batch_rows)
        for i in starts:
            micro = slice(i, i + self.micro_batch_rows)
            if isinstance(self.model, FSDPModule):
                self.model.set_requires_gradient_sync(i == starts[-1])  # reduce-scatter once, after the last micro-batch
            with self._autocast():
                logp, entropy = response_logprobs(self.model, batch.select(micro), with_entropy=True)  # [m, T]
            loss, metrics = algo.policy_loss(
                logp,
                logp.detach() if old_logprobs is None else old_logprobs[micro],
                advantages[micro],
                mask[micro],
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro],
                num_sequences=num_sequences,
                num_tokens=num_tokens.to(self.device),
                loss_scale=self.world_size,
                **loss_kwargs,
            )
            loss.backward()
            # metrics are means over this micro-batch's units: weight each by its share of the mini-batch's units
            token_share = mask[micro].sum().item() / max(num_tokens.item(), 1.0)
            unit_share = algo.metric_units(mask[micro], loss_kwargs["ratio"]).sum().item() / max(num_units, 1)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + (v if k == "pg_loss" else v * (token_share if k == "kl" else unit_share))
            assert entropy is not None
            entropy_sum += (entropy * mask[micro]).sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
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
        keys = sorted(sums)
        totals = distributed.all_reduce_sum(torch.tensor([sums[k] for k in keys] + [entropy_sum], dtype=torch.float64))
        out = dict(zip(keys, totals[:-1].tolist()))
        out["entropy"] = totals[-1].item() / max(num_tokens.item(), 1.0)
        out["grad_norm"] = grad_norm.item()
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["bad"] = float(bad)
        return out

    @torch.no_grad()
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in checkpoint names (tied weights once), gathered one parameter at a time.

        A collective: every rank must consume the whole iterator, in order. Peak extra memory is the
        largest single parameter (the gather is bounded by it, not by the model).
        """
        for name, param in self.model.named_parameters():
            if isinstance(param, DTensor):
                shard = cast(DTensor, param.detach().to(self.device))  # offloaded shards come to the device first
                yield name, shard.full_tensor()  # all-gather this parameter's shards
            else:  # the root's parameters stay gathered after a forward (FSDP2's heuristic for the root)
                yield name, param.detach()

    def save(self, folder: Path) -> None:
        """A Hugging Face folder (safetensors + config + tokenizer) that transformers and vLLM load; rank 0 writes it.

        A collective (the full weights are gathered on every rank).
        """
        state = {name: tensor.cpu() for name, tensor in self.named_weights()}
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(folder, state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(folder)

    def _sharded_state(self) -> dict:
        model, optim = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optim": optim}
        if self.reference is not None:  # pi_ref: the initial weights, or pi_theta at the last refresh
            state["reference"] = get_model_state_dict(self.reference)
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
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.reference is not None:
            set_model_state_dict(self.reference, state["reference"])
