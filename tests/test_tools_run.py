"""A run whose answers are several turns, through the CLI, on the built-in tiny model: the loop with DAPO's refill,
its updates, checkpoints and exact resume, the samples and `rlvr eval run=` all on multi-turn answers.

The tiny model writes digits, never code, so these runs call the digit test tool (tests/digit_tool_run.py: `rlvr` with
multiturn.sampler patched to give it) in place of python; the python tool's own path is tests/test_tools.py (its
sandbox) and the SmolLM2 run in tests/test_real_model.py (make test-slow).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_resume import copy_run, rows, stable
from warm_cli import warm

HERE = Path(__file__).resolve().parent
ARGS = ["recipe=dapo", "rollout.tools=[python]", 'rollout.tool.instruction=""', "rollout.max_turns=2",
        "rollout.max_new_tokens=12", "algo.prompts_per_step=16", "trainer.eval_every=3", "data.eval_size=32",
        "logger.progress=false", "logger.samples_every=1"]  # fmt: skip


def digit_cli(*args: str, cwd: Path):
    return warm().run([str(HERE / "digit_tool_run.py"), *args], cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tools") / "straight"
    result = digit_cli("train", *ARGS, "trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_last=3",
                       f"trainer.output_dir={out}", cwd=out.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_tool_run_trains_on_the_engines_tokens(straight):
    steps = rows(straight)[1:]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 0.3 < r["tools/calls_per_answer"] <= 2 and r["tools/failed_call_frac"] == 0
        assert r["tools/output_tokens_per_answer"] == pytest.approx(2 * r["tools/calls_per_answer"])  # "<k>+" each
        # the learner's logprobs of the model's tokens are the engine's (fp32 both, on multi-turn answers)
        assert r["rollout/logprob_mismatch_max"] < 1e-4 and r["actor/updates"] >= 2
        assert r["response_length/max"] <= 12 and "timing/tools_s" in r
    assert steps[-1]["eval/tool_calls_per_answer"] > 0
    samples = [json.loads(line) for line in (straight / "samples.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["kind"] == "train" and s["tool_calls"]]
    assert called and all(s["tool_tokens"] == 2 * len(s["tool_calls"]) for s in called)
    assert all(call == {"tool": "digit", "code": "1", "output": f"{k}+", "status": "ok", "seconds": 0.0}
               for s in called for k, call in enumerate(s["tool_calls"]))  # fmt: skip
    assert "0+" in called[0]["completion"]  # the answer as the model saw it: its turns and the outputs between them


def test_a_tool_run_resumes_exactly(straight, tmp_path):
    resumed = copy_run(straight, tmp_path / "resumed")
    shutil.rmtree(resumed / "checkpoints" / "step_00000003")
    shutil.rmtree(resumed / "model")
    result = digit_cli("train", *ARGS, "trainer.max_steps=3", f"trainer.output_dir={resumed}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [stable(r) for r in rows(resumed)] == [stable(r) for r in rows(straight)]


def test_rlvr_eval_scores_a_tool_run_with_its_tools(straight, tmp_path):
    result = digit_cli("eval", f"run={straight}", "eval.n=0", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    last = rows(straight)[-1]
    for key in ("eval/accuracy", "eval/tool_calls_per_answer", "eval/no_answer_frac"):
        assert report["metrics"][key] == last[key], key
    answers = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert any(a["tool_calls"] for a in answers)


def test_the_report_plots_tool_calls_per_answer(straight, tmp_path):
    from rlvr.report import write_report

    files = write_report([straight], tmp_path, "rlvr report")
    assert tmp_path / "plots" / "tool_calls.png" in files
    assert 'id="fig-tool_calls"' in (tmp_path / "report.html").read_text()
