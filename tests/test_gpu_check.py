"""The device check (scripts/gpu_check.py) runs end to end on CPU: `--allow-cpu`, tiny Qwen2, in a process of its own
(forked warm: tests/warm_cli.py); its engine sections too (vLLM's CPU build: no sleep mode, no CUDA graphs), all but the
`rlvr train` steps, whose metrics reading is tested on a file here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from warm_cli import warm

REPO = Path(__file__).resolve().parents[1]
KEYS = {"pass", "failed", "device", "torch", "elapsed_s", "tokens_per_s", "mfu", "mfu_6nd", "head_s", "head_peak_bytes",
        "update_peak_bytes", "lifecycle_awake_fits", "lifecycle_awake_peak_bytes", "lifecycle_asleep_peak_bytes",
        "plan_ratio", "numerics_max_abs", "numerics_mean_abs", "engine_checked", "engine_skipped", "engine_start_s",
        "engine_start_gap", "engine_push_gaps", "engine_push_moved", "adapter_push_gaps", "adapter_push_moved",
        "engine_phases", "train_step_s", "sections"}  # fmt: skip


@pytest.mark.slow  # ~8 s: make test-slow (CI runs it too)
def test_gpu_check_allow_cpu_smoke():
    # no GPU even where the tests run on a GPU machine: --allow-cpu would otherwise run the full-size check there
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    result = warm().run([REPO / "scripts" / "gpu_check.py", "--allow-cpu"], cwd=REPO, env=env, timeout=240)
    out = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out[-1])  # the last line is one JSON object
    assert KEYS <= set(summary), KEYS - set(summary)
    assert summary["pass"] is True and summary["failed"] == []
    assert summary["tokens_per_s"] > 0 and summary["numerics_max_abs"] is not None
    assert set(summary["sections"]) == {
        "setup",
        "update",
        "plan",
        "lifecycle",
        "head",
        "numerics",
        "engine",
        "adapters",
        "train",
    }
    assert summary["lifecycle_awake_fits"] is True  # on CPU nothing is held: the code path runs, every update fits
    assert summary["sections"]["plan"]["predicted_bytes"] > 0 and len(summary["sections"]["plan"]["micro_batches"]) > 1
    assert len(summary["head_s"]) == 2
    assert any(line.startswith("PASS: gpu_check on CPU") for line in out)
    # the engine sections ran (vLLM is installed here) and every one of their checks passed (the summary's pass above)
    assert summary["engine_checked"] is True and summary["engine_skipped"] is None
    checks = [line for line in out if line.startswith(("ok  ", "FAIL"))]
    for prefix, pushes in (("engine", 2), ("adapters", 2)):
        assert sum(line.startswith(f"ok   {prefix}: push ") and "moved" in line for line in checks) == pushes, checks
        assert (
            sum(line.startswith(f"ok   {prefix}: push ") and "match the learner" in line for line in checks) == pushes
        ), checks
    assert len(summary["engine_push_gaps"]) == len(summary["adapter_push_gaps"]) == 2
    for moved, follows in zip(
        summary["engine_push_moved"] + summary["adapter_push_moved"],
        summary["engine_push_gaps"] + summary["adapter_push_gaps"],
    ):
        assert moved["mean_abs"] > 5 * follows["mean_abs"]  # the push moved the engine, onto the learner's new policy
    phases = summary["engine_phases"]
    assert (
        phases["rollout"]["predicted_gib"] > 0
        and phases["learner"]["predicted_gib"] > 0
        and phases["rollout"]["rss_bytes"] > 0
    )
    assert summary["sections"]["train"]["skipped"] == "--train-steps 0" and summary["train_step_s"] is None


def test_train_metrics_reads_a_runs_steps(tmp_path):
    """What the train section reads of `rlvr train`'s metrics.jsonl (the CPU smoke skips the steps themselves)."""
    import sys

    path = list(sys.path)
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path[:] = path
    gpu_check.vllm_installed()  # puts back the `vllm` its import blocked (this process's other tests may use it)
    train_metrics = gpu_check.train_metrics
    rows = [{"step": 0, "eval/accuracy": 0.0}]
    rows += [{"step": k, "timing/step_s": 1.5 * k, "timing/rollout_s": 0.5, "timing/update_s": 0.7, "timing/sync_s": 0.1,
              "perf/tokens_per_s": 100.0, "actor/pg_loss": 0.01, "actor/bad_updates": 0.0} for k in (1, 2)]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = train_metrics(tmp_path)
    assert got["steps"] == [1, 2] and got["timing/step_s"] == [1.5, 3.0] and got["finite"] and got["bad_updates"] == 0
    rows[-1]["actor/pg_loss"] = float("nan")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not train_metrics(tmp_path)["finite"]
