"""rlvr.flops: the learner's arithmetic counted by hand from the architecture, and the learner's counter that the trainer
logs (perf/learner_gflop) equal to it after real updates and logprob passes."""

from __future__ import annotations

import torch
from learners import make_learner
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr import flops
from rlvr.algo import LossOptions
from rlvr.types import Completion, RolloutBatch


def llama(**overrides: object) -> LlamaForCausalLM:
    config = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=50, tie_word_embeddings=True, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**{**config, **overrides}))


def test_the_matmul_weights_are_counted_from_the_architecture() -> None:
    h, i, v, layers, head_dim = 64, 96, 50, 3, 16  # 4 query heads of 16, 2 key/value heads (GQA)
    per_layer = h * h + 2 * (h * 2 * head_dim) + h * h + 3 * h * i  # q, k and v (2 heads each), o; gate, up, down
    shape = flops.Shape.of(llama())
    assert shape == flops.Shape(matmul_params=layers * per_layer + v * h, layers=3, attention_width=64)  # + the LM head
    assert shape.matmul_params == sum(p.numel() for p in llama().parameters()) - (2 * layers + 1) * h  # all but the norms
    untied = flops.Shape.of(llama(tie_word_embeddings=False))
    assert untied.matmul_params == shape.matmul_params  # the head is one matmul, tied or not; the embedding is a lookup
    assert flops.Shape.of(llama(head_dim=32)).attention_width == 128  # heads x head_dim, where head_dim is set


def test_a_forward_pass_is_two_flops_per_weight_per_token_plus_causal_attention() -> None:
    shape = flops.Shape(matmul_params=1000, layers=2, attention_width=8)
    # n tokens: 2 x 1000 x n; attention: token t (1-based) attends to t positions, 2 matmuls x 2 FLOPs x width each
    for n in (1, 5, 17):
        attention = sum(2 * 2 * 8 * t for t in range(1, n + 1)) * 2  # both layers
        assert shape.forward([n]) == 2 * 1000 * n + attention
    assert shape.forward([5, 17, 1]) == shape.forward([5]) + shape.forward([17]) + shape.forward([1])
    assert shape.forward([]) == 0
    assert flops.lengths(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])) == [3, 4, 1]  # padding not counted


def test_the_learner_counts_its_updates_and_logprob_passes() -> None:
    learner = make_learner("model.dtype=float64")
    completions = [Completion(prompt_ids=[5, 6, 7][: 1 + k % 3], token_ids=[8, 9, 10, 11][: 1 + k % 4], text="",
                              finish_reason="stop", engine_logprobs=[0.0] * (1 + k % 4)) for k in range(8)]  # fmt: skip
    batch = RolloutBatch.from_completions(completions, [float(k % 2) for k in range(8)], [k % 2 == 1 for k in range(8)], pad_id=0)
    lengths = [(1 + k % 3) + (1 + k % 4) for k in range(8)]
    assert flops.lengths(batch.attention_mask) == lengths
    one_pass = learner.shape.forward(lengths)
    assert learner.flops == 0 and learner.shape == flops.Shape.of(learner.model)
    learner.logprobs(batch)
    assert learner.flops == one_pass
    learner.update(batch, torch.linspace(-1, 1, 8), batch.response_mask, None, None, options=LossOptions("token", 0.2, 0.2, "token_mean"))
    assert learner.flops == one_pass + 3 * one_pass  # forward, and a backward of twice its work
