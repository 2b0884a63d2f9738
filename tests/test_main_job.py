"""The main job itself (slow: ~5 minutes): `rlvr train recipe=dapo` with no other argument.

Only the outcome is asserted (held-out greedy accuracy >= 0.90 at the end); its time is a
benchmark figure (scripts/bench_main_job.py), not a test condition.
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_default_dapo_run_reaches_090(rlvr_cli, tmp_path):
    out = tmp_path / "main"
    result = rlvr_cli("train", "recipe=dapo", f"trainer.output_dir={out}", "logger.progress=false", cwd=tmp_path,
                      timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert evals[0] < 0.65  # it starts from the warm start, not from a solved task
    assert evals[-1] >= 0.90, evals
