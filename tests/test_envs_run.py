"""Episodes through the CLI on the built-in tiny model (rollout.env=env_examples:add_chain: a new addition problem
every turn, tests/env_examples.py): the loop with DAPO's refill on episode rewards, its updates on the engine's exact
ids, checkpoints and exact resume, samples turn by turn, `rlvr eval run=` and the report; an environment that cannot
be used stops the run at start-up."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_resume import copy_run, rows, stable
from warm_cli import warm

HERE = Path(__file__).resolve().parent
ARGS = ["recipe=dapo", "algo.filter_metric=reward", "rollout.env=env_examples:add_chain", "reward.verifier=none",
        "rollout.env_options={turns: 2}", "rollout.max_new_tokens=20",
        "algo.prompts_per_step=8", "trainer.eval_every=3", "data.eval_size=16", "logger.progress=false",
        "logger.samples_every=1"]  # fmt: skip


def env_cli(*args: str, cwd: Path):
    return warm().run([str(HERE / "env_run.py"), *args], cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("envs") / "straight"
    result = env_cli("train", *ARGS, "trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_last=3",
                     f"trainer.output_dir={out}", cwd=out.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_an_environment_run_trains_on_the_engines_tokens(straight):
    steps = rows(straight)[1:]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 1.5 < r["env/turns_per_episode"] <= 2 and r["env/errors"] == 0 and r["env/step_s"] >= 0
        # reward.verifier=none: the reward is the return (0-2: one point per right sum)
        assert r["reward/mean"] == pytest.approx(r["env/return_mean"]) and 0 < r["env/return_mean"] <= 2
        # the learner's logprobs of the model's tokens are the engine's (fp32 both, observations masked)
        assert r["rollout/logprob_mismatch_max"] < 1e-4 and r["actor/updates"] >= 1
    assert "eval/env_success_frac" in steps[-1] and steps[-1]["eval/env_turns_per_episode"] > 1
    samples = [json.loads(line) for line in (straight / "samples.jsonl").read_text().splitlines()]
    train = [s for s in samples if s["kind"] == "train"]
    for s in train:
        turns = s["turns"]
        assert [t["by"] for t in turns] == ["model", "env"] * (len(turns) // 2) + ["model"] * (len(turns) % 2)
        assert "".join(t["text"] for t in turns) == s["completion"]  # the answer as the model saw it, turn by turn
        assert s["reward"] == pytest.approx(s["episode"]["return"]) == pytest.approx(sum(s["episode"]["rewards"]))
        assert all(t["text"].endswith("=") and len(t["text"]) == 6 for t in turns if t["by"] == "env")  # "ab+cd="
    assert any(s["episode"]["turns"] == 2 and s["episode"]["end"] == "terminated" for s in train) and "tool_calls" not in train[0]


def test_an_environment_run_resumes_exactly(straight, tmp_path):
    resumed = copy_run(straight, tmp_path / "resumed")
    shutil.rmtree(resumed / "checkpoints" / "step_00000003")
    shutil.rmtree(resumed / "model")
    result = env_cli("train", *ARGS, "trainer.max_steps=3", f"trainer.output_dir={resumed}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    def same(row: dict) -> dict:  # env/step_s is the environments' wall time: a clock, as timing/*
        return {k: v for k, v in stable(row).items() if k != "env/step_s"}

    assert [same(r) for r in rows(resumed)] == [same(r) for r in rows(straight)]


def test_rlvr_eval_runs_the_episodes_of_a_run(straight, tmp_path):
    result = env_cli("eval", f"run={straight}", "eval.n=2", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    last = rows(straight)[-1]
    for key in ("eval/accuracy", "eval/env_success_frac", "eval/env_return_mean", "eval/env_turns_per_episode"):
        assert report[key] == last[key], key
    assert "eval/pass@2" in report and "eval/sampled_env_return_mean" in report
    answers = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all(a["correct"] == a["episode"]["success"] for a in answers)


def test_the_report_plots_turns_and_success(straight, tmp_path):
    from rlvr.report import write_report

    files = write_report([straight], tmp_path, "rlvr report")
    assert {tmp_path / "plots" / "env_turns.png", tmp_path / "plots" / "env_success.png"} <= set(files)


def test_an_environment_without_step_stops_the_run_before_any_model_loads(tmp_path):
    result = env_cli("train", *ARGS, "rollout.env=env_examples:no_step", "rollout.env_options=null", f"trainer.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "rollout.env='env_examples:no_step' made a NoStep, which has no step method" in result.stderr


def test_math_retry_through_the_cli_and_rlvr_eval(tmp_path):
    """The built-in math_retry on the built-in task: a wrong sum is shown the problem again ({prompt}), up to 3 tries."""
    out = tmp_path / "retry"
    args = ["recipe=grpo", "rollout.env=rlvr.envs.math_retry:make", "rollout.env_options={message: '{prompt}', attempts: 3}",
            "reward.verifier=none", "rollout.max_new_tokens=20", "algo.prompts_per_step=8", "trainer.max_steps=1",
            "trainer.eval_every=1", "data.eval_size=16", "logger.progress=false", f"trainer.output_dir={out}"]  # fmt: skip
    result = env_cli("train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    last = rows(out)[-1]
    assert last["rollout/logprob_mismatch_max"] < 1e-4 and 1 <= last["env/turns_per_episode"] <= 3
    assert last["reward/correct_frac"] == last["env/success_frac"] > 0  # success: right within the attempts
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    retried = [s for s in samples if s["episode"]["turns"] > 1]
    assert retried and all(t["text"] == s["prompt"] for s in retried for t in s["turns"] if t["by"] == "env")
    for s in samples:  # reward 0.5^(k-1) for a right answer at attempt k, 0 for none
        k, success = s["episode"]["turns"], s["episode"]["success"]
        assert s["reward"] == (0.5 ** (k - 1) if success else 0.0)
    evaluated = env_cli("eval", f"run={out}", "eval.n=0", f"output_dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["metrics"]
    assert report["eval/accuracy"] == last["eval/accuracy"] == report["eval/env_success_frac"]
