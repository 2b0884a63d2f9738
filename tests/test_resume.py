"""Checkpoints and exact resume through the CLI, with real SIGKILLs: after step k, and in the middle of a save.

What is bitwise and why: the resumed run restores the sharded weights and Adam state exactly (DCP), the lr
schedule, the prompt stream's position and the RNGs, and the engine samples with per-request seeds derived from
(seed, step, round), so it draws the same prompts and the same tokens. Everything in metrics.jsonl except
timings is then equal to the uninterrupted run's, compared here with ==.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_cli import WarmProcess, warm

from rlvr import checkpoint
from rlvr.config import ConfigError

ARGS = ["recipe=dapo", "trainer.max_steps=4", "trainer.eval_every=2", "data.eval_size=64", "logger.progress=false"]
VOLATILE = ("timing/", "perf/", "time/")  # wall-clock values: the only ones allowed to differ


def start(out: Path, *extra: str, fresh: bool = False) -> subprocess.Popen[str] | WarmProcess:
    """The run as a process of its own: forked warm (tests/warm_cli.py), or with `fresh`, a new interpreter (the
    uninterrupted run, so that every comparison below is between processes with different hash seeds, as a user's
    resume is)."""
    args = ["-m", "rlvr", "train", *ARGS, f"trainer.output_dir={out}", *extra]
    if not fresh:
        return warm().start(args, cwd=out.parent)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *args], cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def finish(proc: subprocess.Popen[str] | WarmProcess) -> None:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def kill_when(proc: WarmProcess, ready, what: str) -> None:
    """SIGKILL the run as soon as ready() holds (polled every 2 ms)."""
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}: {proc.output()[1][-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run (save_every=2, keep_last=2: checkpoints at steps 2 and 4), read by the resumes below."""
    out = tmp_path_factory.mktemp("resume") / "straight"
    finish(start(out, "trainer.save_every=2", fresh=True))
    assert [r["step"] for r in rows(out)] == [0, 1, 2, 3, 4]
    assert [p.name for p in checkpoint.list_complete(out)] == ["step_00000002", "step_00000004"]
    return out


@pytest.fixture(scope="module")
def uninterrupted(straight) -> list[dict]:
    return rows(straight)


@pytest.mark.slow  # ~15 s: make test-slow (CI runs it too); make test keeps the exact resumes of a damaged checkpoint,
# a SIGTERM, tools and environments
def test_sigkill_after_step_3_then_resume_matches_uninterrupted(uninterrupted, tmp_path):
    out = tmp_path / "run"
    proc = start(out, "trainer.save_every=2")
    logged = lambda: (out / "metrics.jsonl").exists() and '"step": 3' in (out / "metrics.jsonl").read_text()  # noqa: E731
    kill_when(proc, logged, "step 3")
    assert checkpoint.latest(out) == checkpoint.step_dir(out, 2)
    finish(start(out, "trainer.save_every=2"))  # trainer.resume=auto is the default
    resumed = rows(out)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]  # the killed run's step-3 row was replaced, not repeated
    for got, want in zip(resumed, uninterrupted):
        assert stable(got) == stable(want), got["step"]
    assert resumed[3]["data/index"] > resumed[2]["data/index"]  # the stream moved on: no prompt was drawn twice
    for clock in ("time/elapsed_s", "time/train_s"):  # both clocks continue from the checkpoint's values
        values = [r[clock] for r in resumed]
        assert values == sorted(values) and values[3] > values[2], (clock, values)
    # the loop clock adds step 3's own time to the checkpoint's, once (rows round to 1 ms; the rest is the metrics)
    added = resumed[3]["time/train_s"] - resumed[2]["time/train_s"]
    assert resumed[3]["timing/step_s"] - 2e-3 <= added <= resumed[3]["timing/step_s"] + 0.5


@pytest.fixture(scope="module")
def killed_during_a_save(tmp_path_factory) -> Path:
    """A run (save_every=1) SIGKILLed as soon as its step-3 save begins, left as the kill left it: read (copied) by the
    resume on the same world size and by the resume on two ranks."""
    out = tmp_path_factory.mktemp("killed") / "run"
    proc = start(out, "trainer.save_every=1")
    kill_when(proc, checkpoint.staging_path(out, 3).exists, "the step-3 save to begin")
    return out


def copy_run(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to, symlinks=True)
    return to


def test_sigkill_during_a_save_leaves_the_previous_checkpoint(uninterrupted, killed_during_a_save, tmp_path):
    out = copy_run(killed_during_a_save, tmp_path / "run")
    staging = checkpoint.staging_path(out, 3)
    if staging.exists():  # killed mid-save (the usual case): the half-written step 3 is not a checkpoint
        assert checkpoint.latest(out) == checkpoint.step_dir(out, 2)
        assert checkpoint.resolve_resume("auto", out) == checkpoint.step_dir(out, 2)
    finish(start(out, "trainer.save_every=1"))
    assert not staging.exists()  # the resumed run's saves pruned the stale staging folder
    for got, want in zip(rows(out), uninterrupted):
        assert stable(got) == stable(want), got["step"]


def test_sigterm_finishes_the_step_and_writes_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "trainer.save_every=0", "trainer.max_steps=50")
    logged = lambda: (out / "metrics.jsonl").exists() and '"step": 1' in (out / "metrics.jsonl").read_text()  # noqa: E731
    deadline = time.monotonic() + 300
    while not logged():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]
    last = rows(out)[-1]["step"]
    assert 1 <= last < 50
    assert checkpoint.latest(out) == checkpoint.step_dir(out, last)  # the step it stopped after, saved
    assert f"stopped by SIGTERM after step {last}; newest checkpoint: {checkpoint.step_dir(out, last)}" in stderr
    assert "trainer.resume=auto" in stderr


@pytest.mark.slow  # a torchrun resume (~20-30 s): make test-slow; make test keeps the same-world resumes
def test_resume_on_another_world_size(killed_during_a_save, tmp_path):
    """A world-of-one checkpoint (the run killed during its step-3 save) continues under `torchrun --nproc_per_node=2`:
    DCP reshards the state on load and the prompt stream goes on where it stopped (not bitwise: two engines and two
    ranks reduce in another order)."""
    out = copy_run(killed_during_a_save, tmp_path / "run")
    newest = checkpoint.latest(out)  # step 2 (killed mid-save, the usual case) or 3 (killed just after the save)
    assert newest in (checkpoint.step_dir(out, 2), checkpoint.step_dir(out, 3))
    k = int(newest.name.split("_")[-1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rlvr", "train",
           *ARGS, f"trainer.output_dir={out}", "trainer.save_every=1", "trainer.torch_threads=1", "reward.workers=1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {newest} (step {k})" in result.stdout
    metrics = rows(out)
    assert [r["step"] for r in metrics] == [0, 1, 2, 3, 4]  # the killed run's rows after step k were replaced
    assert metrics[k + 1]["data/index"] > metrics[k]["data/index"]  # no prompt drawn twice across the change of world size
    assert sorted(p.name for p in (checkpoint.step_dir(out, 4) / "learner").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_damaged_checkpoint_is_named_and_the_run_resumes_from_the_newest_intact_one(straight, uninterrupted, tmp_path):
    """Issue 51: the newest checkpoint's largest file truncated after it was marked complete (a failed copy; a flipped
    bit is tests/test_faults.py's), and metrics.jsonl's last line torn by a kill: resume=auto names the damaged file,
    falls back to step 2, redoes steps 3 and 4 equal to the uninterrupted run, and drops the torn line (said once)."""
    out = copy_run(straight, tmp_path / "damaged")
    shutil.rmtree(out / "model")  # (as a run killed after its last checkpoint leaves it)
    newest = checkpoint.step_dir(out, 4)
    target = max((p for p in newest.rglob("*") if p.is_file() and p.name != checkpoint.MARKER), key=lambda p: p.stat().st_size)
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward/mean": 0.')  # torn mid-write
    with pytest.raises(ConfigError, match=rf"trainer.resume '{newest}' is damaged: {target}"):
        checkpoint.resolve_resume(str(newest), out)  # named by hand: no fallback, an error
    proc = start(out, "trainer.save_every=2")
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"checkpoint {newest} is damaged: {target}" in stderr
    assert f"resuming from {checkpoint.step_dir(out, 2)} (step 2): steps 3-4 are redone" in stderr
    assert "dropped 1 torn line" in stderr
    assert [r["step"] for r in rows(out)] == [0, 1, 2, 3, 4]
    for got, want in zip(rows(out), uninterrupted):
        assert stable(got) == stable(want), got["step"]
    assert checkpoint.damage(checkpoint.step_dir(out, 4)) is None  # rewritten whole


@pytest.mark.slow  # ~25 s: make test-slow; make test keeps the write guard's checks (tests/test_faults.py) and this resume's kin above
def test_a_checkpoint_write_that_fails_stops_the_run_and_its_resume_matches_uninterrupted(straight, uninterrupted, tmp_path):
    """Issue 51: the step-4 checkpoint's write fails (ENOSPC from a writer, tests/run_faults.py) in a run continued from
    step 2: exit status 5 with rlvr's words last, no staging folder left, step 2's checkpoint untouched; resume=auto then
    ends equal to the uninterrupted run."""
    out = copy_run(straight, tmp_path / "full")
    shutil.rmtree(checkpoint.step_dir(out, 4))
    shutil.rmtree(out / "model")  # (the run as a SIGKILL after step 2's checkpoint leaves it)
    env = {**os.environ, "RLVR_FAULT": "enospc", "RLVR_FAULT_STEP": "4", "PYTHONUNBUFFERED": "1"}
    cmd = [str(Path(__file__).parent / "run_faults.py"), "train", *ARGS, f"trainer.output_dir={out}", "trainer.save_every=2"]
    result = warm().run(cmd, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 5, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rlvr train: writing the step-4 checkpoint failed: OSError: No space left on device ("), last
    assert f"the filesystem of {out} ({checkpoint.mount_point(out)}) is full. Nothing of it was kept; the newest " \
           f"checkpoint, {checkpoint.step_dir(out, 2)}, is untouched." in last  # fmt: skip
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    assert checkpoint.damage(checkpoint.step_dir(out, 2)) is None and not (out / "model").exists()
    finish(start(out, "trainer.save_every=2"))
    assert [r["step"] for r in rows(out)] == [0, 1, 2, 3, 4]
    for got, want in zip(rows(out), uninterrupted):
        assert stable(got) == stable(want), got["step"]
