"""rlvr.memory against hand-computed figures for Qwen2.5-0.5B and Qwen2.5-7B (their published config.json files in
tests/fixtures), and the parameter count against transformers' own models of those configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.memory import (
    GIB,
    ModelShape,
    activation_bytes_per_token,
    cuda_graph_sizes,
    engine_asleep,
    engine_idle,
    engine_memory,
    engine_overhead,
    host_memory,
    kv_bytes_per_token,
    learner_memory,
    learner_resident,
    lora_bytes_per_token,
    round_tokens,
    sleep_level,
    vllm_batch_defaults,
)

FIXTURES = Path(__file__).parent / "fixtures"


def shape(name: str) -> ModelShape:
    return ModelShape.from_config(json.loads((FIXTURES / f"{name}.json").read_text()))


def test_qwen2_5_0_5b_parameters_by_hand():
    s = shape("qwen2.5-0.5b")
    # hidden 896, 14 heads of 64, 2 KV heads (kv width 128), MLP 4864, 24 layers, vocabulary 151,936, tied head
    attention = 896 * 896 + 896 + 2 * (896 * 128 + 128) + 896 * 896  # q (+bias), k and v (+bias), o (no bias)
    mlp = 3 * 896 * 4864
    layer = attention + mlp + 2 * 896  # + two RMSNorms
    assert layer == 14_912_384 == s.layer_params
    assert 24 * layer + 151_936 * 896 + 896 == 494_032_768 == s.num_params  # + embedding (tied) + final norm


def test_qwen2_5_7b_parameters_by_hand():
    s = shape("qwen2.5-7b")
    # hidden 3584, 28 heads of 128, 4 KV heads (kv width 512), MLP 18944, 28 layers, vocabulary 152,064, untied head
    attention = 3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584
    layer = attention + 3 * 3584 * 18944 + 2 * 3584
    assert layer == 233_057_792 == s.layer_params
    assert 28 * layer + 2 * 152_064 * 3584 + 3584 == 7_615_616_512 == s.num_params


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-7b"])
def test_parameter_count_matches_transformers(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((FIXTURES / f"{name}.json").read_text())
    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert sum(p.numel() for p in model.parameters()) == shape(name).num_params


def test_kv_cache_per_token_by_hand():
    # K and V, every layer, kv heads x head dim, 2 bytes in bf16
    assert kv_bytes_per_token(shape("qwen2.5-0.5b"), dtype="bfloat16") == 2 * 24 * 2 * 64 * 2 == 12_288
    assert kv_bytes_per_token(shape("qwen2.5-7b"), dtype="bfloat16") == 2 * 28 * 4 * 128 * 2 == 57_344
    assert kv_bytes_per_token(shape("qwen2.5-7b"), dtype="bfloat16", tensor_parallel_size=2) == 57_344 // 2
    assert round_tokens(rows=512, prompt_tokens=512, max_new_tokens=1024) == 786_432


def test_activations_per_token_by_hand():
    s = shape("qwen2.5-0.5b")
    h, q, i, heads, layers = 896, 896, 4864, 14, 24  # 2 KV heads: transformers' repeat_kv copies K and V to all 14
    # fp32 (every saved tensor 4 bytes): per norm its input and normalized output (4h + 4h) and 1/rms (4); the one
    # q/k/v input and the one gate/up input (4h each); o's input (4q), down's input (4i); SDPA's q, k, v (4q each, K and V
    # repeated) and logsumexp (4 per head); gate's, silu's and up's outputs (4i each)
    fp32_layer = 2 * (8 * h + 4) + 2 * 4 * h + 4 * q + 4 * i + 3 * 4 * q + 4 * heads + 3 * 4 * i
    shared = 8 * h + 2 * 4 * 64  # the final norm; rotary cos and sin
    assert activation_bytes_per_token(s, compute_bytes=4, checkpointing=False) == layers * fp32_layer + shared
    # bf16 weights (FSDP2): norms keep an fp32 copy of their input and a bf16 output; everything else in 2 bytes
    bf16_layer = 2 * (4 * h + 2 * h + 4) + 2 * 2 * h + 2 * q + 2 * i + 3 * 2 * q + 4 * heads + 3 * 2 * i
    assert activation_bytes_per_token(s, compute_bytes=2, checkpointing=False, seq_len=1024) == (
        layers * bf16_layer + (4 + 2) * h + 2 * 4 * 64  # no attention mask: the learner passes none (rlvr.lm_head)
    )
    assert activation_bytes_per_token(s, compute_bytes=2, checkpointing=False, seq_len=32768) == activation_bytes_per_token(
        s, compute_bytes=2, checkpointing=False, seq_len=1024)  # nothing per token grows with the row's length
    # autocast over fp32 weights: the residual stream stays fp32 and q, k, v, gate, up each cast their own input
    auto_layer = 2 * (8 * h + 4) + 5 * 2 * h + 2 * q + 2 * i + 3 * 2 * q + 4 * heads + 3 * 2 * i
    assert (
        activation_bytes_per_token(s, compute_bytes=2, checkpointing=False, autocast=True)
        == layers * auto_layer + 8 * h + 512
    )
    # checkpointing: each layer's (bf16) input, and one layer's tensors while it is recomputed
    assert (
        activation_bytes_per_token(s, compute_bytes=2, checkpointing=True) == layers * 2 * h + bf16_layer + 6 * h + 512
    )


def test_learner_memory_of_7b_on_8_gpus_by_hand():
    s, n = shape("qwen2.5-7b"), 7_615_616_512
    m = learner_memory(
        s, world_size=8, precision="bf16", sharded=True, autocast=False, checkpointing=True, tokens=4096, chunk_tokens=1024, reference=True
    )
    assert m["weights"] == m["gradients"] == 4 * n // 8 and m["optimizer"] == 8 * n // 8  # fp32, sharded 8 ways
    assert m["reference"] == 2 * n // 8  # bf16, sharded
    # FSDP2 gathers in bf16: the root (embedding, head, final norm) and two layers
    assert m["compute_weights"] == 2 * (2 * 152_064 * 3584 + 3584 + 2 * 233_057_792)
    # the head's backward: its fp32 weight gradient, a bf16 product and its fp32 copy (10 bytes a head weight), the fp32
    # chunk and its bf16 copy, the bf16 gradient of its input
    vh = 152_064 * 3584
    assert m["logits"] == 4 * vh + 6 * vh + 4 * 1024 * 152_064 + 2 * 1024 * 152_064 + 2 * 4096 * 3584
    per_token = activation_bytes_per_token(s, compute_bytes=2, checkpointing=True)
    assert m["activations"] == 4096 * per_token + 4096 * (2 * 3584 + 8)
    assert learner_resident(m) == (4 + 8 + 2) * n // 8
    assert (
        25 < sum(m.values()) / GIB < 27
    )  # 16 bytes x 7.6B / 8 = 14.2 GiB of state, the reference, gathers and the head


def test_learner_memory_alone_and_offloaded():
    s, n = shape("qwen2.5-0.5b"), 494_032_768
    alone = learner_memory(
        s, world_size=1, precision="bf16", sharded=False, autocast=True, checkpointing=False, tokens=8192, chunk_tokens=1024, reference=False
    )
    assert alone["weights"] + alone["gradients"] + alone["optimizer"] == 16 * n
    # autocast: bf16 casts of every matmul weight (24 layers' q, k, v, o, gate, up, down) and of the tied head
    linear = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert alone["compute_weights"] == 2 * (24 * linear + 151_936 * 896)
    offloaded = learner_memory(
        s,
        world_size=1,
        precision="bf16",
        sharded=True,
        autocast=False,
        checkpointing=False,
        tokens=8192,
        chunk_tokens=1024,
        reference=True,
        cpu_offload=True,
    )
    assert offloaded["weights"] == offloaded["gradients"] == offloaded["optimizer"] == offloaded["reference"] == 0
    assert offloaded["compute_weights"] == 2 * (
        151_936 * 896 + 896 + 2 * 14_912_384
    )  # FSDP2's gathers, from host memory


def test_engine_memory():
    e = engine_memory(shape("qwen2.5-7b"), dtype="bfloat16", kv_cache_bytes=10 * GIB, tensor_parallel_size=2)
    assert e["weights"] == 2 * 7_615_616_512 // 2 and e["kv_cache"] == 10 * GIB
    # tensor parallelism splits the MLP's activations (18944 / 2) but not the residual stream; 8192 batched tokens
    assert e["activations"] == 8192 * 2 * (2 * 3584 + 3 * 18944 // 2)


def test_vllm_batch_defaults_and_cuda_graph_sizes():
    """vllm/engine/arg_utils.py get_batch_defaults (LLM class) and vllm/config/vllm.py _set_cudagraph_sizes."""
    assert vllm_batch_defaults(cuda=True, memory_gib=80, name="NVIDIA H100 80GB HBM3") == (16384, 1024)
    assert vllm_batch_defaults(cuda=True, memory_gib=80, name="NVIDIA A100-SXM4-80GB") == (8192, 256)
    assert vllm_batch_defaults(cuda=True, memory_gib=48, name="NVIDIA L40S") == (8192, 256)
    assert vllm_batch_defaults(cuda=False, memory_gib=24, name="cpu", tensor_parallel_size=2) == (8192, 512)
    piecewise, full = cuda_graph_sizes(256, 16384)  # up to min(2 x 256, 512) = 512
    assert piecewise == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] and len(piecewise) == 3 + 31 + 17
    assert full == piecewise[:35] and full[-1] == 256
    assert cuda_graph_sizes(20, 16384) == ([1, 2, 4, 8, 16, 20, 24, 32, 40], [1, 2, 4, 8, 16, 20])  # + max_num_seqs
    assert cuda_graph_sizes(256, 300)[0][-2:] == [288, 300]  # capped by, and capturing, max_num_batched_tokens


def test_engine_asleep_idle_and_host_memory():
    s = shape("qwen2.5-0.5b")
    e = engine_memory(s, dtype="bfloat16", kv_cache_bytes=GIB, max_num_seqs=64, max_num_batched_tokens=16384, lora_rank=16)
    assert engine_asleep(e) == {"cuda_graphs": e["cuda_graphs"], "sampler_scratch": e["sampler_scratch"]}
    assert engine_asleep(e, offload_cudagraphs=True)["cuda_graphs"] == 0
    assert set(engine_idle(e)) == set(e) - {"activations", "sampler"}  # freed blocks the learner's allocator reuses
    assert engine_overhead(e) == sum(e.values()) - e["weights"] - e["kv_cache"]
    assert e["lora"] == 2 * 8_798_208  # rank 16 on q/k/v/o/gate/up/down of 24 layers, bf16
    assert sleep_level(sleep=True, adapter_sync=True) == 1 and sleep_level(sleep=True, adapter_sync=False) == 2
    assert sleep_level(sleep=False, adapter_sync=True) == 0
    one = host_memory(s, e, world_size=8, ranks_per_node=8, level=1, cpu_offload=True, lora_rank=16, adapter_sync=True)
    unit = 151_936 * 896 + 896  # the tied embedding and the final norm outweigh a layer (14,912,384)
    assert one == {"sleep_copies": 8 * (e["weights"] + e["lora"]),
                   "learner_offload": 8 * ((4 * 494_032_768 + 16 * 8_798_208) // 8),
                   "lora_cache": 8 * 2 * 8_798_208, "export": 2 * GIB + 2 * unit}  # fmt: skip
    two = host_memory(s, e, world_size=8, ranks_per_node=8, level=2, cpu_offload=False)
    assert two == {"sleep_copies": 0, "learner_offload": 0, "lora_cache": 0, "export": 2 * GIB + 2 * unit}


def test_a_lora_adapters_activations_are_one_layers_under_checkpointing():
    s = shape("qwen2.5-7b")  # per adapted projection its [16] intermediate, and autocast's cast of 5 inputs of A
    per_layer = 7 * 16 * 2 + 5 * 2 * 3584
    assert lora_bytes_per_token(s, 16, compute_bytes=2, autocast=True, checkpointing=False) == 28 * per_layer
    assert lora_bytes_per_token(s, 16, compute_bytes=2, autocast=True, checkpointing=True) == per_layer
    assert lora_bytes_per_token(s, 0, compute_bytes=2, autocast=True, checkpointing=False) == 0
