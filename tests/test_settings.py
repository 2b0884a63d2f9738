"""rlvr.settings: every `auto` resolves from a description of the device and the model, deterministically, with the
figures below computed by hand; explicit values win; a resume keeps what the run started with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlvr import memory, settings
from rlvr.config import ConfigError, validate
from rlvr.memory import GIB, ModelShape
from rlvr.settings import DeviceSpec, Settings, resolve
from tests.conftest import compose_config

# Qwen2.5-1.5B's shape (its config.json): 28 layers, hidden 1536, MLP 8960, 12 heads of 128, 2 KV heads, tied
QWEN_1_5B = ModelShape(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                       num_kv_heads=2, head_dim=128, tied_embeddings=True, qkv_bias=True)  # fmt: skip
H100 = DeviceSpec.gpu(80, "NVIDIA H100 80GB HBM3")
CPU_AVX2 = DeviceSpec("cpu", "AMD EPYC 7B13", 24.0, False, 2)
CPU_BF16 = DeviceSpec("cpu", "AMD EPYC 9R14", 24.0, True, 2)


def cfg(*overrides: str):
    return validate(compose_config("model.path=/models/qwen", *overrides))


def test_cuda_resolves_to_bf16_compute_a_bf16_engine_cuda_graphs_sleep_and_tf32() -> None:
    s = resolve(cfg(), H100, QWEN_1_5B, world_size=1, builtin=False)
    assert (s.precision, s.engine_dtype, s.cuda_graphs, s.sleep, s.tf32) == ("bf16", "bfloat16", True, True, True)
    # logits chunk: 80 GiB / 128 = 640 MiB over 4 x 151936 bytes per token = 1104 tokens -> 1024 (a power of two)
    assert s.logits_chunk_tokens == 1024
    # KV cache: 0.5 of 80 GiB, less the bf16 weights (1,543,714,304 parameters x 2 bytes) and what the engine holds
    # besides (rlvr.memory.engine_memory at 1024 sequences and 16,384 batched tokens, vLLM's defaults on an H100)
    assert QWEN_1_5B.num_params == 1_543_714_304 and s.max_num_seqs == 1024  # DAPO's 1536 rows, capped
    engine = memory.engine_memory(QWEN_1_5B, dtype="bfloat16", kv_cache_bytes=0, max_num_seqs=1024, max_num_batched_tokens=16384)
    assert s.kv_cache_gib == round(40 - (1_543_714_304 * 2 + memory.engine_overhead(engine)) / GIB, 2)
    assert s.torch_threads == 8  # 16 cores, one rank: at most 8 on a GPU machine
    old_gpu = resolve(cfg(), dataclasses.replace(H100, bf16=False), QWEN_1_5B, world_size=1, builtin=False)
    assert (old_gpu.precision, old_gpu.engine_dtype) == ("fp32", "float16")  # a V100: no bf16


def test_cpus_resolve_by_their_bf16_support_and_keep_the_cpu_figures() -> None:
    plain = resolve(cfg(), CPU_AVX2, QWEN_1_5B, world_size=1, builtin=False)
    assert dataclasses.asdict(plain) == dict(
        precision="fp32", engine_dtype="float32", cuda_graphs=False, sleep=False, max_num_seqs=256, kv_cache_gib=0.0, tf32=False,
        logits_chunk_tokens=64 * 2**20 // (4 * 151936),  # 110: the CPU's measured 64 MiB of logits
        activation_checkpointing=False, micro_batch_tokens=2048, torch_threads=2,
    )  # fmt: skip
    assert resolve(cfg(), CPU_BF16, QWEN_1_5B, world_size=1, builtin=False).precision == "bf16"
    two_ranks = dataclasses.replace(CPU_AVX2, local_ranks=2)  # two ranks share the machine's 2 cores
    assert resolve(cfg(), two_ranks, QWEN_1_5B, world_size=2, builtin=False).torch_threads == 1


def test_the_builtin_model_is_fp32_everywhere_by_its_identity() -> None:
    builtin = validate(compose_config())  # model=tiny_arith: no preset pins a precision any more
    shape = ModelShape(99, 128, 512, 4, 4, 4, 32, True, False)
    for device in (H100, CPU_BF16):
        s = resolve(builtin, device, shape, world_size=1, builtin=True)
        assert (s.precision, s.engine_dtype) == ("fp32", "float32"), device
    # the same config pointed at another model gets that model's settings on the same devices
    assert resolve(cfg(), CPU_BF16, shape, world_size=1, builtin=False).precision == "bf16"


def test_explicit_values_win_and_impossible_ones_are_config_errors() -> None:
    s = resolve(cfg("trainer.precision=fp32", "rollout.cuda_graphs=false", "trainer.micro_batch_tokens=4096",
                    "trainer.logits_chunk_tokens=256", "rollout.dtype=float32", "trainer.torch_threads=3"),
                H100, QWEN_1_5B, world_size=1, builtin=False)  # fmt: skip
    assert (s.precision, s.cuda_graphs, s.micro_batch_tokens, s.logits_chunk_tokens, s.engine_dtype, s.torch_threads) == (
        "fp32", False, 4096, 256, "float32", 3)  # fmt: skip
    with pytest.raises(ConfigError, match=r"rollout\.sleep=true: vLLM has no sleep mode on CPU"):
        resolve(cfg("rollout.sleep=true"), CPU_AVX2, QWEN_1_5B, world_size=1, builtin=False)
    with pytest.raises(ConfigError, match=r"model\.dtype=bfloat16 would make the master weights .* trainer\.precision=bf16"):
        resolve(cfg("model.dtype=bfloat16"), H100, QWEN_1_5B, world_size=1, builtin=False)
    with pytest.raises(ConfigError, match=r"rollout\.gpu_memory_utilization=0\.02 .* leaves no room for a KV cache"):
        resolve(cfg("rollout.gpu_memory_utilization=0.02"), H100, QWEN_1_5B, world_size=1, builtin=False)
    for bad, key in [("trainer.micro_batch_tokens=-1", "trainer.micro_batch_tokens"), ("rollout.sleep=maybe", "rollout.sleep"),
                     ("trainer.torch_threads=0", "trainer.torch_threads"), ("rollout.dtype=fp8", "rollout.dtype")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            cfg(bad)


def test_token_budget_and_activation_checkpointing_follow_the_memory_left() -> None:
    """One 80 GiB GPU, the engine asleep: room = 90% of 80 GiB - what the learner holds besides activations at its peak
    (rlvr.memory.learner_memory: fp32 weights, gradients, AdamW's two moments, autocast's bf16 weight copies, the LM
    head's chunks); the budget is a power of two of half the room over the activation bytes per token, with
    checkpointing only when the budget would fall under 16k tokens."""
    from rlvr.memory import activation_bytes_per_token, learner_memory

    s = resolve(cfg(), H100, QWEN_1_5B, world_size=1, builtin=False)
    parts = learner_memory(QWEN_1_5B, world_size=1, precision="bf16", sharded=False, autocast=True, checkpointing=False, tokens=1024, chunk_tokens=1024,
                           reference=False)  # fmt: skip
    assert parts["weights"] + parts["gradients"] + parts["optimizer"] == 16 * QWEN_1_5B.num_params // 1
    # what the sleeping engine keeps (its CUDA graphs, the sampler's scratch) is not the learner's
    engine = memory.engine_memory(QWEN_1_5B, dtype="bfloat16", kv_cache_bytes=0, max_num_seqs=1024, max_num_batched_tokens=16384)
    room = int(0.9 * 80 * GIB) - sum(v for k, v in parts.items() if k != "activations") - sum(memory.engine_asleep(engine).values())
    plain = activation_bytes_per_token(QWEN_1_5B, compute_bytes=2, checkpointing=False, autocast=True)
    checkpointed = activation_bytes_per_token(QWEN_1_5B, compute_bytes=2, checkpointing=True, autocast=True)
    assert room // 2 // plain < 16384 and room // 2 // plain < 32 * 520  # too few tokens without checkpointing, for
    # 16k tokens or the rank's 32 rows of a mini-batch (4 prompts x 8 samples of 512 + 8 tokens) ...
    assert s.activation_checkpointing
    expected = min(65536, 1 << ((room // 2 // checkpointed).bit_length() - 1))
    assert s.micro_batch_tokens == expected and expected >= 16384  # ... and enough with it
    tiny = ModelShape(32000, 256, 1024, 4, 4, 4, 64, True, False)  # a 20M model: room to spare, no checkpointing
    small = resolve(cfg(), H100, tiny, world_size=1, builtin=False)
    assert not small.activation_checkpointing and small.micro_batch_tokens == 65536
    # the planned micro-batch decides: 2 rows of 520 tokens a rank fit without checkpointing, though 16k tokens would not
    few = resolve(cfg("algo.prompts_per_minibatch=1", "algo.group_size=2"), H100, QWEN_1_5B, world_size=1, builtin=False)
    assert room // 2 // plain >= 2 * 520 and not few.activation_checkpointing
    awake = resolve(cfg("rollout.sleep=false"), H100, QWEN_1_5B, world_size=1, builtin=False)  # the engine keeps 40 GiB
    assert awake.micro_batch_tokens < s.micro_batch_tokens


def test_resolution_is_deterministic_and_a_resume_keeps_what_the_run_started_with(tmp_path: Path) -> None:
    c = cfg()
    first = resolve(c, H100, QWEN_1_5B, world_size=1, builtin=False)
    assert all(resolve(c, H100, QWEN_1_5B, world_size=1, builtin=False) == first for _ in range(3))
    settings.record(tmp_path, H100, first)
    assert settings.recorded(tmp_path) == (H100, first)
    elsewhere = resolve(c, DeviceSpec.gpu(141, "NVIDIA H200"), QWEN_1_5B, world_size=1, builtin=False)
    assert elsewhere != first  # a bigger GPU: a bigger token budget and KV cache
    assert settings.keep_recorded(c, elsewhere, first) == first  # every key was auto: the run's own values
    pinned = cfg("trainer.micro_batch_tokens=1024")  # set on the resume's command line: that value wins
    kept = settings.keep_recorded(pinned, resolve(pinned, H100, QWEN_1_5B, world_size=1, builtin=False), first)
    assert kept == dataclasses.replace(first, micro_batch_tokens=1024)


def test_applied_settings_replace_every_auto_and_the_lines_say_which_were_auto() -> None:
    c = cfg("trainer.torch_threads=2")
    s = resolve(c, CPU_AVX2, QWEN_1_5B, world_size=1, builtin=False)
    applied = settings.apply(c, s)
    assert "auto" not in {str(v) for v in settings.asked(applied).values()}
    assert settings.asked(applied)["rollout.dtype"] == "float32" and applied.trainer.precision.value == "fp32"
    lines = s.lines(settings.asked(c))
    assert "trainer.torch_threads=2" in lines and "trainer.precision=fp32 (auto)" in lines
    assert len(lines) == len(Settings.KEYS) == len(dataclasses.fields(Settings))


def test_this_machine_is_described_by_its_capabilities() -> None:
    flags = Path("/proc/cpuinfo").read_text()
    device = DeviceSpec.detect()
    assert device.kind == "cpu" and device.cores >= 1 and device.memory_gib > 1
    assert device.bf16 == ("avx512_bf16" in flags or "amx_bf16" in flags)


def test_record_applied_merges_into_settings_json(tmp_path: Path) -> None:
    settings.record(tmp_path, H100, resolve(cfg(), H100, QWEN_1_5B, world_size=1, builtin=False))
    settings.record_applied(tmp_path, {"float32_matmul_precision": "high"})
    settings.record_applied(tmp_path, {"sleep_level": 2})
    data = json.loads((tmp_path / settings.SETTINGS_FILE).read_text())
    assert data["applied"] == {"float32_matmul_precision": "high", "sleep_level": 2} and settings.recorded(tmp_path) is not None


def test_a_resume_resolves_afresh_what_its_settings_json_predates(tmp_path: Path) -> None:
    c = cfg()
    now = resolve(c, H100, QWEN_1_5B, world_size=1, builtin=False)
    settings.record(tmp_path, H100, now)
    path = tmp_path / settings.SETTINGS_FILE
    data = json.loads(path.read_text())
    del data["settings"]["max_num_seqs"]  # a run started before rollout.max_num_seqs existed
    path.write_text(json.dumps(data))
    _, before = settings.recorded(tmp_path)  # type: ignore[misc]
    assert before.max_num_seqs is None and settings.keep_recorded(c, now, before) == now


@pytest.mark.parametrize(
    ("device", "overrides", "learner", "engine", "pushed", "startup"),
    [
        (H100, [], "bfloat16", "bfloat16", "master weights rounded to bfloat16, in bfloat16", False),
        (CPU_BF16, [], "bfloat16", "float32", "master weights rounded to bfloat16, in float32", True),
        (CPU_BF16, ["rollout.dtype=bfloat16"], "bfloat16", "bfloat16", "master weights rounded to bfloat16, in bfloat16", False),
        (CPU_AVX2, [], "float32", "float32", "master weights, in float32", False),
        (H100, ["trainer.precision=fp32"], "float32", "bfloat16", "master weights, in bfloat16", False),  # the engine's cast
        (CPU_BF16, ["model.lora.rank=8"], "bfloat16", "float32", "base + merged adapter, in float32", True),
    ],
)
def test_the_push_rule_follows_the_learner_compute_dtype(tmp_path, device, overrides, learner, engine, pushed, startup) -> None:
    """What a push sends is what the learner computes with (rlvr.settings.push_rule), in the engine's dtype; start-up
    pushes once where the engine's own load would not hold that (a bf16 learner, an engine that is not bf16).
    settings.json records it."""
    c = cfg(*overrides)
    s = resolve(c, device, QWEN_1_5B, world_size=1, builtin=False)
    rule = settings.push_rule(s, lora_rank=c.model.lora.rank)
    assert rule == {"learner_compute": learner, "engine": engine, "pushed": pushed, "startup_push": startup}
    settings.record(tmp_path, device, s, lora_rank=c.model.lora.rank)
    assert json.loads((tmp_path / settings.SETTINGS_FILE).read_text())["push"] == rule
    assert f"the engine in {engine} (rollout.dtype)" in settings.push_note(s, lora_rank=c.model.lora.rank)
