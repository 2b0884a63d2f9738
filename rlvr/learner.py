"""The policy (and, when the KL term is on, a frozen reference) and its optimizer.

Computes response logprobs, takes one optimizer update per mini-batch (split into micro-batches
whose losses sum to the mini-batch loss, see rlvr.algo.aggregate), yields the full weights for
the rollout engine, and saves a Hugging Face folder.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlvr import algo
from rlvr.types import RolloutBatch


def response_logprobs(
    model: PreTrainedModel, batch: RolloutBatch, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the response tokens under `model`: [N, T] (and the entropy [N, T] if asked)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [N, L, V]
    index = batch.response_index[:, :, None].expand(-1, -1, logits.shape[-1])  # [N, T, V]
    resp_logits = logits.gather(1, index)  # [N, T, V]
    resp_logits = resp_logits.to(torch.promote_types(resp_logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
    logp = torch.log_softmax(resp_logits, dim=-1).gather(-1, batch.response_ids[:, :, None])[:, :, 0]  # [N, T]
    entropy = algo.entropy_from_logits(resp_logits.detach()) if with_entropy else None  # [N, T]
    return logp, entropy


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
    """A causal LM trained by the clipped policy-gradient loss of rlvr.algo."""

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
    ) -> None:
        self.model_path = model_path
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.train()
        self.reference = self._frozen_copy() if with_reference else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, warmup=warmup_steps, total=total_updates, schedule=lr_schedule)
        )
        self.grad_clip = grad_clip
        self.micro_batch_rows = micro_batch_rows
        self.world_size = 1  # FSDP averages gradients over ranks; the loss is scaled by this

    def _frozen_copy(self) -> PreTrainedModel:
        ref = copy.deepcopy(self.model).eval()
        ref.requires_grad_(False)
        return ref

    def refresh_reference(self) -> None:
        """pi_ref <- pi_theta."""
        if self.reference is not None:
            self.reference.load_state_dict(self.model.state_dict())

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """Response logprobs [N, T] under the policy (or the reference), in micro-batches."""
        model = self.reference if reference else self.model
        assert model is not None, "no reference model: kl_coef is 0"
        parts = [
            response_logprobs(model, batch.select(slice(i, i + self.micro_batch_rows)))[0]
            for i in range(0, batch.num_rows, self.micro_batch_rows)
        ]
        return torch.cat(parts)  # [N, T]

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
        """One optimizer update on a mini-batch (advantages [n], mask [n, T], logprobs [n, T]).

        old_logprobs None means pi_old = pi_theta (one update per rollout): the ratio is exactly 1.
        The normalizers of the loss are this mini-batch's global counts, so the summed micro-batch
        gradients equal the mini-batch gradient whatever micro_batch_rows is.
        """
        num_tokens = mask.sum()  # [] all-reduced over ranks under FSDP
        num_sequences = batch.num_rows * self.world_size
        sums: dict[str, float] = {}
        entropy_sum = 0.0
        for i in range(0, batch.num_rows, self.micro_batch_rows):
            rows = slice(i, i + self.micro_batch_rows)
            logp, entropy = response_logprobs(self.model, batch.select(rows), with_entropy=True)  # [m, T]
            loss, metrics = algo.policy_loss(
                logp,
                logp.detach() if old_logprobs is None else old_logprobs[rows],
                advantages[rows],
                mask[rows],
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows],
                num_sequences=num_sequences,
                num_tokens=num_tokens,
                loss_scale=self.world_size,
                **loss_kwargs,
            )
            loss.backward()
            weight = mask[rows].sum().item() / max(num_tokens.item(), 1.0)  # token share of this micro-batch
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + (v if k == "pg_loss" else v * weight)
            assert entropy is not None
            entropy_sum += (entropy * mask[rows]).sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums["entropy"] = entropy_sum / max(num_tokens.item(), 1.0)
        sums["grad_norm"] = grad_norm.item()
        sums["lr"] = float(self.scheduler.get_last_lr()[0])
        return sums

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in checkpoint names (tied weights once), for the rollout engine."""
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def save(self, folder: Path) -> None:
        """A Hugging Face folder (safetensors + config + tokenizer) that transformers and vLLM load."""
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder, safe_serialization=True)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(folder)
