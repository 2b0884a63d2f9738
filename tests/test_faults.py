"""Issue 51: the faults a long run meets, each injected, each ending with rlvr's own words and nothing earlier lost.

Unit tests of rlvr's logic first (the checkpoint manifest and its checks, the free-space check, the write guard with a
learner that is a fake, torn log lines, a wandb that fails), some on a real 1 MiB tmpfs where the tests run as root;
then the real loop through the CLI (tests/run_faults.py: real vLLM, learner and Hydra) with a failing engine, a learner
out of memory, and an output folder on a 2 MiB filesystem. The resumes that must equal an uninterrupted run (a damaged
checkpoint, a checkpoint write that fails) are in tests/test_resume.py, beside the uninterrupted run they compare with.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from warm_cli import warm

from rlvr import checkpoint as ck
from rlvr.config import ConfigError
from rlvr.metrics import MetricsLogger
from rlvr.run_state import PART_FAILED, WRITE_FAILED, Part, RunStopped, save_checkpoint, save_model
from rlvr.runs import read_jsonl

HERE = Path(__file__).resolve().parent
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB of known content


def committed(out: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    staging = ck.staging_dir(out, step)
    for name, data in (files or {"learner/__0_0.distcp": WEIGHTS, "trainer_state.pt": b"state"}).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    ck.commit(staging, ck.step_dir(out, step), {"step": step})
    return ck.step_dir(out, step)


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs (root only; skipped elsewhere): a filesystem that fills as a real disk does."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)


# --- checkpoints that prove themselves ---------------------------------------------------------------------------------


def test_the_marker_lists_every_file_with_its_size_and_checksum(tmp_path) -> None:
    folder = committed(tmp_path, 2)
    files = json.loads((folder / ck.MARKER).read_text())["files"]
    assert sorted(files) == ["learner/__0_0.distcp", "trainer_state.pt"]
    assert files["learner/__0_0.distcp"][0] == len(WEIGHTS) and files["trainer_state.pt"][0] == 5
    assert ck.damage(folder) is None


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("truncate", f"has 524,288 bytes, not the {len(WEIGHTS):,} it was written with (truncated or overwritten)"),
        ("flip", "does not hold the bytes it was written with (its checksum differs"),
        ("missing", "is missing"),
    ],
)
def test_a_damaged_file_is_named(tmp_path, fault, words) -> None:
    folder = committed(tmp_path, 2)
    target = folder / "learner" / "__0_0.distcp"
    data = bytearray(target.read_bytes())
    if fault == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif fault == "flip":
        data[12345] ^= 0x10  # one bit: the size is as written, the bytes are not
        target.write_bytes(data)
    else:
        target.unlink()
    assert (ck.damage(folder) or "").startswith(f"{target} {words}")
    with pytest.raises(ConfigError, match=f"checkpoint {folder} is damaged: {target}"):
        ck.verify(folder)
    assert ck.damage(folder, within="model") is None  # `rlvr eval` reads model/ alone: a learner shard does not stop it


def test_a_checkpoint_written_before_the_file_list_is_trusted(tmp_path) -> None:
    folder = committed(tmp_path, 2)
    (folder / ck.MARKER).write_text(json.dumps({"step": 2}))  # as rlvr wrote markers before issue 51
    (folder / "trainer_state.pt").write_bytes(b"other")
    assert ck.damage(folder) is None


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint_saying_what_is_redone(tmp_path, capsys) -> None:
    for step in (2, 4, 6):
        committed(tmp_path, step)
    (ck.step_dir(tmp_path, 6) / "trainer_state.pt").write_bytes(b"")
    (ck.step_dir(tmp_path, 4) / "learner" / "__0_0.distcp").unlink()
    assert ck.resolve_resume("auto", tmp_path) == ck.step_dir(tmp_path, 2)
    err = capsys.readouterr().err
    assert f"checkpoint {ck.step_dir(tmp_path, 6)} is damaged: {ck.step_dir(tmp_path, 6) / 'trainer_state.pt'} has 0 bytes" in err
    assert f"checkpoint {ck.step_dir(tmp_path, 4)} is damaged: {ck.step_dir(tmp_path, 4) / 'learner/__0_0.distcp'} is missing" in err
    assert f"resuming from {ck.step_dir(tmp_path, 2)} (step 2): steps 3-6 are redone" in err
    assert err.index("step_00000006 is damaged") < err.index("step_00000004 is damaged") < err.index("resuming from")


def test_resume_auto_with_every_checkpoint_damaged_is_an_error_and_an_intact_newest_says_nothing(tmp_path, capsys) -> None:
    for step in (2, 4):
        committed(tmp_path, step)
    assert ck.resolve_resume("auto", tmp_path) == ck.step_dir(tmp_path, 4)
    assert capsys.readouterr().err == ""
    for step in (2, 4):
        (ck.step_dir(tmp_path, step) / "trainer_state.pt").write_bytes(b"stale")  # same size, other bytes
    with pytest.raises(ConfigError, match=r"every checkpoint in .*checkpoints is damaged \(the newest, .*step_00000004: "
                                          r".*trainer_state.pt does not hold the bytes.*restore one from a copy"):  # fmt: skip
        ck.resolve_resume("auto", tmp_path)


def test_resume_to_a_damaged_path_is_an_error_naming_the_file_and_the_others(tmp_path) -> None:
    for step in (2, 4):
        committed(tmp_path, step)
    newest = ck.step_dir(tmp_path, 4)
    (newest / "trainer_state.pt").write_bytes(b"st")
    with pytest.raises(ConfigError) as info:
        ck.resolve_resume(str(newest), tmp_path)
    assert str(info.value) == (f"trainer.resume '{newest}' is damaged: {newest / 'trainer_state.pt'} has 2 bytes, not the 5 it "
                               f"was written with (truncated or overwritten); resume from another checkpoint "
                               f"({ck.step_dir(tmp_path, 2)})")  # fmt: skip


def test_rlvr_eval_of_a_damaged_checkpoint_names_its_model_file(tmp_path) -> None:
    from rlvr.eval_command import locate

    (tmp_path / "config.yaml").write_text("{}\n")
    folder = committed(tmp_path, 2, {"model/model.safetensors": WEIGHTS, "model/config.json": b"{}", "trainer_state.pt": b"s"})
    assert locate(folder).model == folder / "model"
    (folder / "trainer_state.pt").write_bytes(b"")  # not read by an evaluation: no matter
    assert locate(folder).model == folder / "model"
    (folder / "model" / "model.safetensors").write_bytes(WEIGHTS[:100])
    with pytest.raises(ConfigError, match=f"checkpoint {folder} is damaged: {folder / 'model' / 'model.safetensors'} has 100 bytes"):
        locate(folder)
    with pytest.raises(ConfigError, match=f"checkpoint {folder} is damaged"):
        locate(tmp_path)  # the run folder: its newest checkpoint (no final model/ yet)


# --- space before writing; a write that fails anyway -------------------------------------------------------------------


def test_ensure_space_names_the_filesystem_and_the_sizes(tmp_path) -> None:
    ck.ensure_space(tmp_path / "checkpoints", 1 << 20, "the step-1 checkpoint")  # fits: nothing said
    with pytest.raises(ck.NoSpace) as info:
        ck.ensure_space(tmp_path / "checkpoints", 1 << 60, "the step-1 checkpoint")
    words = str(info.value)
    assert words.startswith(f"the step-1 checkpoint needs about 1,099,511,627,776.0 MiB in {tmp_path / 'checkpoints'}, "
                            f"but its filesystem ({ck.mount_point(tmp_path)}) has ")  # fmt: skip
    assert words.endswith(" MiB free") and os.path.ismount(ck.mount_point(tmp_path))


def test_a_full_disk_is_recognised_however_the_writer_words_it(tmp_path) -> None:
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert ck.disk_full(enospc, tmp_path)
    try:
        try:
            raise enospc
        except OSError as inner:
            raise RuntimeError("DCP: writing the shard failed") from inner
    except RuntimeError as wrapped:
        assert ck.disk_full(wrapped, tmp_path)  # the cause, down the chain
    assert ck.disk_full(RuntimeError("I/O error: No space left on device (os error 28)"), tmp_path)  # safetensors' words
    assert not ck.disk_full(OSError(errno.EIO, os.strerror(errno.EIO)), tmp_path)  # this folder has room
    assert not ck.disk_full(RuntimeError("unexpected pos 704 vs 598"), tmp_path)


def test_on_a_real_full_filesystem_torch_save_fails_in_its_own_words_and_is_recognised(tiny_fs) -> None:
    with pytest.raises(Exception) as info:  # torch says "unexpected pos ...": no errno, no word of space
        ck.save_state(tiny_fs / "state.pt", {"weights": torch.zeros(1 << 19)})  # 2 MiB into 1 MiB
    assert ck.disk_full(info.value, tiny_fs)
    with pytest.raises(ck.NoSpace, match=rf"needs about 2\.0 MiB in {tiny_fs}, but its filesystem \({tiny_fs}\) has"):
        ck.ensure_space(tiny_fs, 2 << 20, "x")


class FakeLearner:
    """Stands in for rlvr.learner.Learner in a checkpoint write: writes `size` bytes per file, raising `fault` (an
    exception) from the write named `failing` ("save_state" or "save")."""

    def __init__(self, size: int = 1000, failing: str = "", fault: Exception | None = None, needs: int = 1 << 20) -> None:
        self.size, self.failing, self.fault, self.needs = size, failing, fault, needs
        self.scheduler = SimpleNamespace(state_dict=lambda: {"last_epoch": 0})

    def checkpoint_bytes(self, *, state: bool = True) -> int:
        return self.needs

    def _write(self, name: str, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if name == self.failing and self.fault is not None:
            (folder / "partial").write_bytes(b"\0" * 10)
            raise self.fault
        torch.save({"w": torch.zeros(self.size // 4)}, folder / "weights.pt")

    def save_state(self, folder: Path) -> None:
        self._write("save_state", folder)

    def save(self, folder: Path) -> None:
        self._write("save", folder)


STREAM = SimpleNamespace(state_dict=lambda: {"epoch": 0, "position": 3}, examples=[0] * 10, seed=0)


def counters(step: int) -> dict[str, Any]:
    return {"step": step, "bad_steps": 0}


def test_a_write_that_fails_removes_its_staging_and_stops_the_run_keeping_the_previous_checkpoint(tmp_path) -> None:
    save_checkpoint(tmp_path, counters(1), FakeLearner(), STREAM, keep_last=2)  # type: ignore[arg-type]
    previous = ck.step_dir(tmp_path, 1)
    assert ck.damage(previous) is None
    fault = OSError(errno.EIO, os.strerror(errno.EIO), str(tmp_path / "x"))
    with pytest.raises(RunStopped) as info:
        save_checkpoint(tmp_path, counters(2), FakeLearner(failing="save", fault=fault), STREAM, keep_last=2)  # type: ignore[arg-type]
    assert info.value.exit_code == WRITE_FAILED == 5 and info.value.__cause__ is fault
    assert str(info.value) == (
        f"writing the step-2 checkpoint failed: OSError: Input/output error ({tmp_path / 'x'}). Nothing of it was kept; "
        f"the newest checkpoint, {previous}, is untouched. Free space there, keep fewer checkpoints (trainer.keep_last=2) "
        f"or choose another trainer.output_dir, then continue with trainer.resume=auto"
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001"]  # no staging folder left
    assert ck.damage(previous) is None and ck.resolve_resume("auto", tmp_path) == previous


def test_a_checkpoint_that_will_not_fit_is_refused_before_a_byte_is_written(tmp_path) -> None:
    with pytest.raises(RunStopped) as info:
        save_checkpoint(tmp_path, counters(1), FakeLearner(needs=1 << 60), STREAM, keep_last=2)  # type: ignore[arg-type]
    assert info.value.exit_code == WRITE_FAILED
    assert str(info.value).startswith(f"the step-1 checkpoint needs about 1,099,511,627,776.0 MiB in {tmp_path / 'checkpoints'}")
    assert "Nothing of it was kept; the newest checkpoint, none yet, is untouched" in str(info.value)
    assert list(tmp_path.rglob("*")) == []  # not even a staging folder


def test_a_real_full_filesystem_mid_write_is_said_as_full(tiny_fs) -> None:
    """The estimate fits (the learner says 4 KiB), the write does not (2 MiB): torch's own error, recognised."""
    with pytest.raises(RunStopped) as info:
        save_checkpoint(tiny_fs, counters(1), FakeLearner(size=2 << 20, needs=4096), STREAM, keep_last=2)  # type: ignore[arg-type]
    assert info.value.exit_code == WRITE_FAILED
    assert str(info.value).startswith("writing the step-1 checkpoint failed: ")
    assert f"; the filesystem of {tiny_fs} ({tiny_fs}) is full. Nothing of it was kept" in str(info.value)
    assert list((tiny_fs / "checkpoints").iterdir()) == []  # the staging folder is gone: the space is free again


def test_a_final_model_that_fails_to_write_leaves_the_earlier_one_whole(tmp_path) -> None:
    save_model(tmp_path, FakeLearner(), step=3, keep_last=2)  # type: ignore[arg-type]
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    assert json.loads(before["rlvr_step.json"]) == {"step": 3}
    with pytest.raises(RunStopped, match=r"^writing the final model failed: OSError: No space left on device") as info:
        save_model(tmp_path, FakeLearner(failing="save", fault=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))), 5, 2)  # type: ignore[arg-type]
    assert info.value.exit_code == WRITE_FAILED and "is full" in str(info.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    assert not (tmp_path / ".tmp-model").exists()


# --- logs that survive a kill -------------------------------------------------------------------------------------------


def test_a_resume_drops_torn_lines_saying_so_once_and_keeps_whole_rows_byte_for_byte(tmp_path, capsys) -> None:
    rows = [json.dumps({"step": s, "reward/mean": s / 3}) + "\n" for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text(rows[0] + rows[1] + '{"step": 2, "rew\n' + rows[2] + rows[3] + '{"step": 4, "rewa')
    (tmp_path / "samples.jsonl").write_text(rows[0] + rows[1])
    logger = MetricsLogger(tmp_path, max_steps=9, progress=False, wandb_project=None, config={}, resume_step=2)
    logger.close()
    assert (tmp_path / "metrics.jsonl").read_text() == rows[0] + rows[1] + rows[2]
    assert (tmp_path / "samples.jsonl").read_text() == rows[0] + rows[1]
    err = capsys.readouterr().err
    assert err.count("torn line") == 1  # samples.jsonl had none: nothing said of it
    assert f"{tmp_path / 'metrics.jsonl'}: dropped 2 torn lines (a write cut short by a kill)" in err


def test_readers_skip_a_line_that_is_not_json_with_a_note(tmp_path, capsys) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "rew\n{"step": 1}\n{"step": 2')  # a torn line, then a resumed run's rows
    assert read_jsonl(path) == [{"step": 0}, {"step": 1}]  # (the last line, unfinished, is still being written)
    assert f"{path} line 2 is not JSON (Unterminated string" in capsys.readouterr().err


# --- a logger that cannot write ------------------------------------------------------------------------------------------


def test_wandb_that_cannot_start_or_stops_taking_rows_is_a_note_and_the_run_logs_on(tmp_path, monkeypatch, capsys) -> None:
    import wandb

    def refusing_init(**kwargs: Any) -> None:  # a fake wandb.init: as an unwritable folder makes the real one fail
        raise PermissionError(errno.EACCES, "Permission denied", kwargs["dir"])

    monkeypatch.setattr(wandb, "init", refusing_init)
    logger = MetricsLogger(tmp_path, max_steps=2, progress=False, wandb_project="p", config={})
    logger.log({"step": 1, "reward/mean": 0.5})
    assert f"rlvr: wandb could not start (PermissionError: [Errno 13] Permission denied: '{tmp_path}'): this run logs to " \
           f"{tmp_path / 'metrics.jsonl'} only" in capsys.readouterr().err  # fmt: skip

    class FailingRun:  # a fake wandb run whose folder went away mid-run
        id, url = "abc", None
        calls = 0

        def log(self, *args: Any, **kwargs: Any) -> None:
            FailingRun.calls += 1
            raise OSError(errno.ENOSPC, "No space left on device")

    logger.wandb_run = FailingRun()  # type: ignore[assignment]
    logger.log({"step": 2, "reward/mean": 0.75})
    logger.log({"step": 3, "reward/mean": 1.0})
    logger.close()
    assert FailingRun.calls == 1  # said once, then no more tries
    err = capsys.readouterr().err
    assert err.count("wandb stopped taking rows at step 2 (OSError: [Errno 28] No space left on device)") == 1
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


# --- a failing part ------------------------------------------------------------------------------------------------------


def test_a_failing_part_is_named_with_its_step_and_where_to_continue(tmp_path) -> None:
    part = Part()
    part.now("the rollout (the engine, the tools, the verifiers)", 7)
    stop = part.failed(RuntimeError("the engine's worker died"), tmp_path)
    assert stop.exit_code == PART_FAILED == 1
    assert str(stop) == ("step 7: the rollout (the engine, the tools, the verifiers) failed: RuntimeError: the engine's "
                         "worker died. The newest checkpoint, none, is intact; no checkpoint was written yet")  # fmt: skip
    committed(tmp_path, 6)
    part.now("the learner's update")
    stop = part.failed(torch.OutOfMemoryError("tried to allocate 8.00 GiB"), tmp_path)
    assert str(stop).startswith("step 7: the learner's update failed: OutOfMemoryError: tried to allocate 8.00 GiB (out of "
                                "memory: lower trainer.micro_batch_tokens")  # fmt: skip
    assert str(stop).endswith(f"The newest checkpoint, {ck.step_dir(tmp_path, 6)}, is intact; continue from it with "
                              f"trainer.resume=auto trainer.output_dir={tmp_path}")  # fmt: skip
    committed(tmp_path, 8)
    (ck.step_dir(tmp_path, 8) / "trainer_state.pt").write_bytes(b"")  # damaged: a run that fell back past it, then failed
    assert ck.latest(tmp_path) == ck.step_dir(tmp_path, 8) and ck.newest_intact(tmp_path) == ck.step_dir(tmp_path, 6)
    assert f"The newest checkpoint, {ck.step_dir(tmp_path, 6)}, is intact" in str(part.failed(RuntimeError("x"), tmp_path))


# --- the real loop, through the CLI ----------------------------------------------------------------------------------------

FAST = ["recipe=grpo", "trainer.eval_every=0", "data.eval_size=16", "logger.progress=false", "algo.prompts_per_step=8"]


def faulty(tmp_path: Path, fault: str, step: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RLVR_FAULT": fault, "RLVR_FAULT_STEP": str(step), "PYTHONUNBUFFERED": "1"}
    return warm().run([str(HERE / "run_faults.py"), "train", *FAST, *args], cwd=tmp_path, env=env, timeout=600)


@pytest.mark.parametrize(
    ("fault", "part", "words"),
    [
        pytest.param("engine", "the rollout (the engine, the tools, the verifiers)", "RuntimeError: the engine's worker died (injected)",
                     marks=pytest.mark.slow),  # ~11 s (the engine's shutdown): make test-slow, which CI runs too
        ("oom", "the learner's update", "OutOfMemoryError: CPU out of memory (injected): tried to allocate 8.00 GiB (out of memory: lower"),
    ],
)
def test_a_failing_part_stops_the_run_at_its_step_with_rlvr_s_words_last(tmp_path, fault, part, words) -> None:
    out = tmp_path / "out"
    result = faulty(tmp_path, fault, 2, "trainer.max_steps=3", "trainer.save_every=1", f"trainer.output_dir={out}")
    assert result.returncode == PART_FAILED, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlvr train: step 2: {part} failed: {words}"), result.stderr[-3000:]
    assert last.endswith(f"The newest checkpoint, {ck.step_dir(out, 1)}, is intact; continue from it with trainer.resume=auto "
                         f"trainer.output_dir={out}")  # fmt: skip
    assert "Traceback" not in result.stderr  # the traceback is in the run's log
    log = (out / "rlvr.log").read_text()
    assert "Traceback (most recent call last)" in log and "(injected)" in log
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1]
    assert [p.name for p in ck.list_complete(out)] == ["step_00000001"] and ck.damage(ck.step_dir(out, 1)) is None
    assert not (out / "model").exists()


def test_an_output_folder_on_a_full_filesystem_stops_at_the_first_checkpoint_naming_it(tmp_path) -> None:
    """The issue's run: the output folder on a 2 MiB filesystem. Start-up's files fit, the first checkpoint does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    out = tmp_path / "small"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(out)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        result = faulty(tmp_path, "none", 0, "trainer.max_steps=2", "trainer.save_every=1", f"trainer.output_dir={out}")
        assert result.returncode == WRITE_FAILED, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("rlvr train: the step-1 checkpoint needs about "), last
        assert f" MiB in {out / 'checkpoints'}, but its filesystem ({out}) has " in last
        assert last.endswith("Nothing of it was kept; the newest checkpoint, none yet, is untouched. Free space there, keep "
                             "fewer checkpoints (trainer.keep_last=2) or choose another trainer.output_dir, then continue "
                             "with trainer.resume=auto")  # fmt: skip
        assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1]  # step 1's row, logged before its checkpoint
        assert ck.list_complete(out) == [] and list(out.glob("checkpoints/.tmp-*")) == []
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)
