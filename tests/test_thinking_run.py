"""Thinking templates through the CLI on the built-in model (issue 49): model.chat_template and
data.chat_template_kwargs reach every render, are recorded with the run and kept by `rlvr eval run=`, the final
model is saved with the run's template, and an answer whose thinking block never closes scores no answer.

The built-in model's 64-token context leaves no room for a ChatML conversation, so these runs use a compact fixture
(tests/fixtures/templates/think_tiny.jinja) that leaves the block at the prompt's end as thinking templates do: closed
with enable_thinking=false (Qwen3), opened otherwise (the R1 distills, QwQ). SmolLM2 runs the Qwen3- and R1-like
fixtures in make test-slow (tests/test_real_model.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_rlvr
from test_resume import rows

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "think_tiny.jinja"
ARGS = ["recipe=grpo", f"model.chat_template={TEMPLATE}", "data.format=chat", "algo.prompts_per_step=16",
        "algo.prompts_per_minibatch=16", "trainer.max_steps=1", "trainer.eval_every=1", "data.eval_size=32",
        "logger.progress=false", "logger.samples_every=1"]  # fmt: skip


def train(out: Path, *extra: str) -> Path:
    result = run_rlvr("train", *ARGS, *extra, f"trainer.output_dir={out}", cwd=out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def samples(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "samples.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def closed(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("think") / "off", "data.chat_template_kwargs={enable_thinking: false}")


@pytest.fixture(scope="module")
def opened(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("think") / "on")


def test_thinking_off_renders_the_closed_block_everywhere_and_is_recorded(closed, tmp_path):
    for kind in ("train", "eval"):
        shown = samples(closed, kind)
        assert shown and all(r["prompt"].endswith("=<think></think>") and "thoughts" not in r for r in shown)
    steps = rows(closed)
    assert steps[1]["reward/unclosed_think_frac"] == 0 and steps[1]["response_length/think_mean"] == 0
    assert steps[1]["response_length/answer_mean"] == steps[1]["response_length/mean"]
    config = (closed / "config.yaml").read_text()
    assert f"chat_template: {TEMPLATE}" in config and "enable_thinking: false" in config
    assert (closed / "model" / "chat_template.jinja").read_text() == TEMPLATE.read_text()  # saved with the model
    # `rlvr eval run=` renders as the run did (its config.yaml) and reproduces the step's evaluation
    result = run_rlvr("eval", f"run={closed}", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["metrics"]["eval/accuracy"] == steps[-1]["eval/accuracy"]
    assert all(r["prompt"].endswith("=<think></think>") for r in map(json.loads, (tmp_path / "samples.jsonl").read_text().splitlines()))


def test_an_answer_whose_block_never_closes_has_no_answer(opened):
    """The prompt opens the block and the built-in model never writes </think>: every answer, cut off or ended, is all
    thoughts and earns the no-answer reward, in training and in the evaluation; the samples show it."""
    steps = rows(opened)
    assert steps[0]["eval/unclosed_think_frac"] == 1.0 and steps[0]["eval/accuracy"] == 0.0
    assert steps[1]["reward/unclosed_think_frac"] == 1.0 and steps[1]["reward/no_answer_frac"] == 1.0
    assert steps[1]["response_length/think_mean"] == steps[1]["response_length/mean"] and steps[1]["response_length/answer_mean"] == 0
    for r in samples(opened, "train"):
        assert r["prompt"].endswith("=<think>") and r["answer_text"] is None and r["outcome"] == "no_answer"
        assert r["thoughts"] == r["completion"].removesuffix("<eos>")  # the model's own text: all of it thoughts
