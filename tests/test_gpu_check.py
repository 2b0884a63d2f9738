"""The device check (scripts/gpu_check.py) runs end to end on CPU: `--allow-cpu`, tiny Qwen2, in a process of its own
(forked warm: tests/warm_cli.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from warm_cli import warm

REPO = Path(__file__).resolve().parents[1]
KEYS = {"pass", "failed", "device", "torch", "elapsed_s", "tokens_per_s", "mfu", "mfu_6nd", "head_s", "head_peak_bytes",
        "update_peak_bytes", "lifecycle_awake_fits", "lifecycle_awake_peak_bytes", "lifecycle_asleep_peak_bytes",
        "plan_ratio", "numerics_max_abs", "numerics_mean_abs", "sections"}  # fmt: skip


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
    assert set(summary["sections"]) == {"setup", "update", "plan", "lifecycle", "head", "numerics"}
    assert summary["lifecycle_awake_fits"] is True  # on CPU nothing is held: the code path runs, every update fits
    assert summary["sections"]["plan"]["predicted_bytes"] > 0 and len(summary["sections"]["plan"]["micro_batches"]) > 1
    assert len(summary["head_s"]) == 2
    assert any(line.startswith("PASS: gpu_check on CPU") for line in out)
