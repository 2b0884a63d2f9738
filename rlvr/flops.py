"""The learner's arithmetic in FLOPs, counted as the field counts it (Kaplan et al. 2020; Megatron's and verl's MFU): a
weight matrix costs 2 FLOPs per parameter per token in the forward pass and twice that in the backward, so an update is
6 x params x tokens and a logprob pass 2 x; attention adds its two matmuls (Q K^T and the weights times V) over each
token's causal context: 2 x 2 x width FLOPs per (token, earlier token) pair in every layer, forward. Real tokens only
(padding is work, not progress). The trainer logs the step's count and rate (perf/learner_gflop,
perf/learner_gflops_per_s); the benchmarks hold the rate against the machine's measured peak (scripts/peak.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Shape:
    """What a forward pass's FLOPs depend on."""

    matmul_params: int  # the weights of every Linear layer: attention, MLP, the LM head (tied or not); LoRA's A and B
    layers: int
    attention_width: int  # the queries' width: heads x head_dim

    @classmethod
    def of(cls, model: torch.nn.Module) -> Shape:
        config: Any = model.config  # (a PEFT model passes its base's)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # (a DTensor: global)
        return cls(matmul_params=linear, layers=int(config.num_hidden_layers), attention_width=heads * head_dim)

    def forward(self, lengths: Iterable[int]) -> int:
        """FLOPs of one forward pass over sequences of these lengths (causal: token i attends to i + 1 positions)."""
        return sum(2 * self.matmul_params * n + 2 * self.layers * self.attention_width * n * (n + 1) for n in lengths)


def lengths(attention_mask: torch.Tensor) -> list[int]:
    """The real tokens of each row of a batch ([N, L] attention mask)."""
    return [int(n) for n in attention_mask.sum(dim=1).tolist()]


UPDATE_PASSES = 3  # forward + backward (the backward: the gradients of the activations and of the weights, 2 x forward)
