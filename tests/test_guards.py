"""Failure handling through the CLI: bad inputs stop start-up before any model loads (naming the file, row or key),
non-finite losses skip updates and then stop the run without touching the last good checkpoint, long prompts are
dropped with a count."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from warm_cli import warm

from rlvr import checkpoint

HERE = Path(__file__).resolve().parent
FAST = ["trainer.eval_every=0", "data.eval_size=16", "logger.progress=false"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def good_rows(n: int) -> list[dict]:
    return [{"prompt": f"{a:02d}+{a + 1:02d}=", "answer": f"{2 * a + 1:03d}"} for a in range(n)]


@pytest.mark.parametrize("case", ["missing_field", "empty", "unreadable", "unwritable_output", "long_prompt_error"])
def test_bad_input_stops_start_up_before_any_model_loads(case, rlvr_cli, tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", good_rows(40))
    out = tmp_path / "out"
    args = ["data=file", "reward.verifier=arithmetic", f"data.path={data}", f"trainer.output_dir={out}", "data.eval_size=8"]
    expected: list[str]
    if case == "missing_field":
        rows = good_rows(40)
        del rows[6]["answer"]
        write_jsonl(data, rows)
        expected = ["train.jsonl line 7", "'answer'", "data.answer_key"]
    elif case == "empty":
        data.write_text("")
        expected = ["data.path", "train.jsonl has no rows"]
    elif case == "unreadable":
        args[2] = f"data.path={tmp_path}"  # a folder, not a file
        expected = ["data.path", "cannot read"]
    elif case == "unwritable_output":
        (tmp_path / "a_file").write_text("")
        args[3] = f"trainer.output_dir={tmp_path / 'a_file' / 'out'}"
        expected = ["trainer.output_dir", "is not writable", "Not a directory"]
    else:
        rows = good_rows(40)
        rows[3]["prompt"] = "1" * 30 + "+1="
        write_jsonl(data, rows)
        args += ["data.max_prompt_tokens=12", "data.long_prompts=error"]
        expected = ["train.jsonl:4", "data.max_prompt_tokens=12"]
    result = rlvr_cli("train", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    for text in expected:
        assert text in result.stderr, (text, result.stderr[-2000:])
    assert result.stdout == "" and result.stderr.startswith("rlvr train: config error: ")  # the error alone
    if case != "unwritable_output":  # the run's log: neither the learner's model nor the engine was started
        log = (out / "rlvr.log").read_text()
        assert "[rlvr] rlvr train: config error: " in log and "Loading" not in log


def test_dataset_file_run_drops_long_prompts_with_a_count(rlvr_cli, tmp_path):
    rows = good_rows(60)
    rows[5]["prompt"] = rows[9]["prompt"] = "1" * 30 + "+1="
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "out"
    result = rlvr_cli("train", "data=file", "reward.verifier=arithmetic", f"data.path={data}", "data.max_prompt_tokens=12",
                      "rollout.max_new_tokens=8", "recipe=grpo", "algo.prompts_per_step=8", "trainer.max_steps=1",
                      f"trainer.output_dir={out}", *FAST, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dropped 2 training and 0 evaluation prompts over the prompt budget of 12 tokens" in result.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["data/dropped_train_prompts"] == 2 and metrics[0]["data/dropped_eval_prompts"] == 0
    # the run trained on what was left: 60 rows, the last 16 held out, 2 dropped
    assert checkpoint.load_state(checkpoint.latest(out) / "trainer_state.pt")["train_examples"] == 60 - 16 - 2


@pytest.mark.slow  # ~11 s: make test-slow (CI runs it too)
def test_non_finite_steps_are_skipped_then_stop_the_run_keeping_the_good_checkpoint(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "RLVR_POISON_FROM_STEP": "3", "PYTHONUNBUFFERED": "1"}
    cmd = [str(HERE / "poison.py"), "train", "recipe=grpo", "trainer.max_steps=10", "trainer.save_every=1",
           "trainer.max_bad_steps=2", f"trainer.output_dir={out}", *FAST]  # fmt: skip
    result = warm().run(cmd, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "stopping at step 4: 2 steps in a row had a non-finite loss or gradient norm" in result.stderr
    assert str(checkpoint.step_dir(out, 2)) in result.stderr  # it names the last good checkpoint
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    assert [m["actor/bad_updates"] for m in metrics[1:]] == [0, 0, 16, 16]  # every update of a poisoned step skipped
    assert [p.name for p in checkpoint.list_complete(out)] == ["step_00000001", "step_00000002"]
    assert not (out / "model").exists()  # no final model from a run that failed
