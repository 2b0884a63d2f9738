"""rlvr.sync_check: after every weight push the engine must compute what the learner computes.

The arithmetic with fakes (FakeEngine, FakeLearner: fixed logprobs), then each fault a real run can meet, injected into
the real loop (tests/sync_faults.py: real vLLM, learner and CLI): the run stops at the step the fault happens, exit
status 4, with rows and checkpoints of the steps before it intact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from warm_cli import warm

from rlvr import checkpoint
from rlvr.sync_check import EXIT_CODE, FLOOR, PROBE_TOKENS, START_LIMIT, SyncCheck, SyncError, probe_ids

HERE = Path(__file__).resolve().parent
FAST = ["trainer.eval_every=0", "data.eval_size=16", "logger.progress=false"]


class FakeEngine:
    """Stands in for rlvr.rollout.Engine: its prompt logprobs are whatever the test sets."""

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        assert len(ids) == len(self.logprobs) + 1
        return self.logprobs


class FakeLearner:
    """Stands in for rlvr.learner.Learner: its sequence logprobs are whatever the test sets."""

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    def sequence_logprobs(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(self.logprobs, dtype=torch.float32)


def test_probe_is_the_prompts_in_order_cut_to_the_budget_and_the_context() -> None:
    assert probe_ids([(1, 2, 3), (4, 5)], max_len=100) == [1, 2, 3, 4, 5]
    assert probe_ids([(1, 2, 3), (4, 5)], max_len=4) == [1, 2, 3, 4]
    assert len(probe_ids([tuple(range(100))] * 3, max_len=10_000)) == PROBE_TOKENS
    with pytest.raises(ValueError, match="at least 2 tokens"):
        probe_ids([(7,)], max_len=10)


def test_tolerance_is_four_times_the_start_up_gap_or_the_floor() -> None:
    learner = FakeLearner([-1.0, -2.0, -3.0, -4.0])
    noisy = SyncCheck(FakeEngine([-1.01, -2.03, -3.0, -4.0]), learner, [0] * 5)  # mean |gap| = 0.04 / 4 = 0.01
    assert noisy.baseline == pytest.approx(0.01, abs=1e-12) and noisy.tolerance == pytest.approx(0.04, abs=1e-12)
    exact = SyncCheck(FakeEngine([-1.0, -2.0, -3.0, -4.0]), learner, [0] * 5)
    assert exact.baseline == 0.0 and exact.tolerance == FLOOR


def test_a_push_that_took_passes_with_its_metrics() -> None:
    engine, learner = FakeEngine([-1.0, -2.0, -3.0, -4.0]), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5)
    learner.logprobs = [-0.5, -2.5, -3.0, -4.0]  # the update moved two tokens by 0.5: mean move 0.25
    engine.logprobs = [-0.5, -2.5, -3.0, -4.0002]  # the push took (within the floor)
    metrics = check.after_push("step 1")
    assert metrics["sync/gap"] == pytest.approx(0.00005, abs=1e-9) and metrics["sync/gap_max"] == pytest.approx(0.0002, abs=1e-9)
    assert metrics["sync/moved"] == pytest.approx(0.25, abs=1e-12) and metrics["timing/sync_check_s"] >= 0


def test_an_engine_left_at_the_previous_policy_stops_the_run_saying_the_push_did_not_take() -> None:
    engine, learner = FakeEngine([-1.0, -2.0, -3.0, -4.0]), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5)
    learner.logprobs = [-0.5, -2.5, -3.0, -4.0]  # moved; the engine did not
    with pytest.raises(SyncError) as caught:
        check.after_push("step 7")
    message = str(caught.value)
    assert message.startswith("step 7: after the weight push the engine's logprobs differ from the learner's by 0.25 nats")
    assert "(max 0.5)" in message and "the push did not take" in message and caught.value.exit_code == EXIT_CODE == 4


def test_an_engine_unchanged_bit_for_bit_stops_the_run_however_small_the_update() -> None:
    """A bf16 engine's noise can hide a small update from the tolerance (here 4 x 0.05 = 0.2 nats), not from the
    engine's own logprobs: a push that took changes them, one that did not leaves them bit for bit."""
    engine, learner = FakeEngine([-1.05, -2.05, -3.05, -4.05]), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5)
    learner.logprobs = [-1.0, -2.0, -3.0, -4.001]  # moved 0.00025 on average
    with pytest.raises(SyncError, match=r"step 3: .* by 0\.0498 nats .* moved the learner's by 0\.00025; .*did not take"):
        check.after_push("step 3")
    learner.logprobs = [-1.0, -2.0, -3.0, -4.002]
    engine.logprobs = [-1.05, -2.05, -3.05, -4.0521]  # the engine moved too (not exactly as the learner): it took
    assert check.after_push("step 4")["sync/gap"] == pytest.approx(0.050025, abs=1e-6)  # (fp32 inputs)


def test_an_engine_back_at_an_earlier_check_bit_for_bit_stops_the_run_naming_it() -> None:
    """An adapter that stops being applied after good pushes takes a bf16 engine back to the base: within the gap's
    tolerance, but bit for bit what it computed at start-up, while the learner is elsewhere."""
    base = [-1.05, -2.05, -3.05, -4.05]
    engine, learner = FakeEngine(base), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5)  # tolerance 0.2
    learner.logprobs, engine.logprobs = [-1.0, -2.0, -3.0, -4.01], [-1.05, -2.05, -3.05, -4.0601]
    check.after_push("step 1")  # the adapter applied
    learner.logprobs, engine.logprobs = [-1.0, -2.0, -3.0, -4.02], base  # not applied: the base again
    with pytest.raises(SyncError, match="It computes bit for bit what it computed at the start-up check: the push did not take"):
        check.after_push("step 2")


def test_non_finite_logprobs_always_stop_the_run() -> None:
    """An engine woken on freed memory can compute NaN: never within a tolerance (a comparison with NaN is false)."""
    engine, learner = FakeEngine([-1.0, -2.0]), FakeLearner([-1.0, -2.0])
    check = SyncCheck(engine, learner, [0] * 3)
    learner.logprobs, engine.logprobs = [-1.1, -2.0], [float("nan"), -2.0]
    with pytest.raises(SyncError, match="step 1: .* by inf nats"):
        check.after_push("step 1")
    with pytest.raises(SyncError, match="at start-up, before any training"):
        SyncCheck(FakeEngine([float("nan"), -2.0]), FakeLearner([-1.0, -2.0]), [0] * 3)


def test_an_engine_that_computes_something_else_stops_the_run_without_blaming_a_stale_push() -> None:
    engine, learner = FakeEngine([-1.0, -2.0, -3.0, -4.0]), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5)
    learner.logprobs = [-0.5, -2.5, -3.0, -4.0]
    engine.logprobs = [-9.0] * 4  # garbage weights, far from both policies: |gap| 8.5, 6.5, 6, 5
    with pytest.raises(SyncError, match=r"step 2: .* by 6\.5 nats a token on average \(max 8\.5\)") as caught:
        check.after_push("step 2")
    assert "did not take" not in str(caught.value)


def test_an_engine_that_moved_less_than_the_learner_is_told_apart_from_a_push_that_did_not_take() -> None:
    """The issue-45 split: the push reached the engine (its logprobs moved) but it computes another function of the
    weights than the learner does (a bf16 learner, the unrounded masters in a float32 engine). The message says the
    push took, how far each side moved, and names the settings that decide what each side computes."""
    computes = "the learner computes in bfloat16 (trainer.precision=bf16), the engine in float32 (rollout.dtype)"
    engine, learner = FakeEngine([-1.0, -2.0, -3.0, -4.0]), FakeLearner([-1.0, -2.0, -3.0, -4.0])
    check = SyncCheck(engine, learner, [0] * 5, computes=computes)
    learner.logprobs = [-0.5, -2.5, -3.0, -4.0]  # the learner moved 0.25 on average
    engine.logprobs = [-0.95, -2.05, -3.0, -4.0]  # the engine a tenth of that: |gap| 0.45, 0.45 -> mean 0.225
    with pytest.raises(SyncError) as caught:
        check.after_push("step 1")
    message = str(caught.value)
    assert "by 0.225 nats a token on average (max 0.45)" in message and "moved the learner's by 0.25" in message
    assert f"The push reached the engine (its logprobs moved by 0.025), but it computes another policy than the learner: {computes}" in message
    assert "did not take" not in message


def test_an_engine_and_learner_that_disagree_at_start_up_stop_the_run_there() -> None:
    with pytest.raises(SyncError, match=r"at start-up, before any training, .* by 0\.75 nats"):
        SyncCheck(FakeEngine([-1.5, -3.0]), FakeLearner([-1.0, -2.0]), [0] * 3)
    assert 0.75 > START_LIMIT


@pytest.mark.parametrize(
    ("fault", "step", "extra", "why"),
    [
        ("dropped", 2, [], "the push did not take"),
        ("previous", 2, ["trainer.tf32=true"], "the push did not take"),  # (and TF32 as asked, after vLLM's "highest")
        ("asleep", 3, [], ""),  # step 2's sleep zeroed the weights and its full push refilled them: it passed
        # without its adapter the engine computes the base, bit for bit as at start-up
        ("adapter", 2, ["model.lora.rank=8", "model.lora.sync=adapter", "trainer.lr=1e-2"], "at the start-up check: the push did not take"),
    ],
)
def test_a_push_fault_stops_the_run_at_its_step_keeping_what_was_written(tmp_path, fault, step, extra, why) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "RLVR_FAULT": fault, "RLVR_FAULT_STEP": str(step), "PYTHONUNBUFFERED": "1"}
    cmd = [str(HERE / "sync_faults.py"), "train", "recipe=dapo", "trainer.max_steps=4", "trainer.save_every=1",
           "algo.prompts_per_step=8", f"trainer.output_dir={out}", *extra, *FAST]  # fmt: skip
    result = warm().run(cmd, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == EXIT_CODE, result.stderr[-3000:]
    assert f"step {step}: after the weight push the engine's logprobs differ from the learner's" in result.stderr
    assert why in result.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(step))  # step 0's evaluation, then the steps that passed
    for m in metrics[1:]:  # every push before the fault passed, after moving the policy past the floor
        assert m["sync/gap"] <= FLOOR < m["sync/moved"], m
    assert [p.name for p in checkpoint.list_complete(out)] == [checkpoint.step_dir(out, s).name for s in range(1, step)]
    assert not (out / "model").exists()
    applied = json.loads((out / "settings.json").read_text())["applied"]  # what start-up applied, read back
    tf32 = "trainer.tf32=true" in extra
    assert applied == {"float32_matmul_precision": "high" if tf32 else "highest", "sleep_level": 0}  # (no sleep on CPU)
