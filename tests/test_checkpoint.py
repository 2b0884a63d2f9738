"""Checkpoint folders: atomic commit, listing by step, pruning, resume resolution, RNG round trip, kill mid-save."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr import checkpoint as ck
from rlvr.config import ConfigError

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB of known content


def make(out: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    """Stage files for a step and commit them; returns the final folder."""
    staging = ck.staging_dir(out, step)
    for name, data in (files or {"weights.bin": WEIGHTS}).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    ck.commit(staging, ck.step_dir(out, step), {"step": step})
    return ck.step_dir(out, step)


def test_commit_makes_folder_appear_with_files_and_marker(tmp_path):
    staging = ck.staging_dir(tmp_path, 10)
    assert staging == tmp_path / "checkpoints" / ".tmp-step_00000010" and list(staging.iterdir()) == []
    (staging / "model").mkdir()
    (staging / "model" / "shard_0.distcp").write_bytes(b"abc")
    ck.save_state(staging / "trainer.pt", {"step": 10, "data": [1, 2]})
    assert ck.list_complete(tmp_path) == []  # a staging folder without marker is never listed

    ck.commit(staging, ck.step_dir(tmp_path, 10), {"step": 10, "note": "x"})
    final = tmp_path / "checkpoints" / "step_00000010"
    assert not staging.exists()
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == [
        "COMPLETE",
        "model",
        "model/shard_0.distcp",
        "trainer.pt",
    ]
    meta = json.loads((final / "COMPLETE").read_text())
    assert meta == {"step": 10, "note": "x", "files": ck.manifest(final)}  # every file's size and checksum as written
    assert sorted(meta["files"]) == ["model/shard_0.distcp", "trainer.pt"] and ck.damage(final) is None
    assert (final / "model" / "shard_0.distcp").read_bytes() == b"abc"
    assert ck.load_state(final / "trainer.pt") == {"step": 10, "data": [1, 2]}
    assert ck.is_complete(final) and ck.list_complete(tmp_path) == [final] and ck.latest(tmp_path) == final


def test_staging_dir_clears_a_stale_one(tmp_path):
    (ck.staging_dir(tmp_path, 3) / "half.bin").write_bytes(b"old")
    assert list(ck.staging_dir(tmp_path, 3).iterdir()) == []


def test_incomplete_folders_are_not_checkpoints(tmp_path):
    make(tmp_path, 1)
    (tmp_path / "checkpoints" / "step_00000002").mkdir()  # no marker
    bad = tmp_path / "checkpoints" / "step_00000003"
    bad.mkdir()
    (bad / "COMPLETE").write_text("{trunc")  # marker does not parse
    tmp = tmp_path / "checkpoints" / ".tmp-step_00000004"
    tmp.mkdir()
    (tmp / "COMPLETE").write_text("{}")  # marker written but never renamed
    assert not ck.is_complete(bad) and not ck.is_complete(tmp)
    assert ck.list_complete(tmp_path) == [ck.step_dir(tmp_path, 1)]


def test_latest_orders_by_step_number(tmp_path):
    assert ck.latest(tmp_path) is None
    ten, nine = make(tmp_path, 10), make(tmp_path, 9)
    os.utime(ten, (1, 1))  # step 10 older by mtime than step 9
    assert ck.latest(tmp_path) == ten
    big, small = make(tmp_path, 100_000_000), make(tmp_path, 99_999_999)  # "step_1..." sorts before "step_9..."
    assert ck.list_complete(tmp_path) == [nine, ten, small, big]


def test_prune_keeps_newest_and_removes_stale_staging(tmp_path):
    steps = [make(tmp_path, s) for s in (1, 2, 3, 4, 5)]
    (ck.staging_dir(tmp_path, 6) / "half.bin").write_bytes(b"x")
    ck.prune(tmp_path, keep_last=2)
    assert ck.list_complete(tmp_path) == steps[-2:]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000004", "step_00000005"]
    ck.prune(tmp_path, keep_last=5)
    assert ck.list_complete(tmp_path) == steps[-2:]


def test_recommit_same_step_replaces_it(tmp_path):
    make(tmp_path, 7, {"a.bin": b"old", "only_old.bin": b"1"})
    final = make(tmp_path, 7, {"a.bin": b"new"})
    assert (final / "a.bin").read_bytes() == b"new" and not (final / "only_old.bin").exists()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000007"]  # nothing left aside


def test_resolve_resume(tmp_path):
    assert ck.resolve_resume("never", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) is None
    make(tmp_path, 1)
    two = make(tmp_path, 2)
    assert ck.resolve_resume("never", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) == two
    assert ck.resolve_resume(str(ck.step_dir(tmp_path, 1)), tmp_path) == ck.step_dir(tmp_path, 1)


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("missing", "does not exist"),
        ("file", "is not a checkpoint folder (not a directory)"),
        ("plain_dir", "is not a checkpoint folder (no COMPLETE marker"),
        ("no_marker", "is incomplete: no COMPLETE marker, a save was interrupted"),
        ("staging", "is incomplete: a staging folder"),
        ("bad_marker", "is incomplete: its COMPLETE marker does not parse"),
    ],
)
def test_resolve_resume_errors(tmp_path, kind, reason):
    newest = make(tmp_path, 2)
    path = {
        "missing": tmp_path / "nope",
        "file": tmp_path / "file.pt",
        "plain_dir": tmp_path / "some_dir",
        "no_marker": tmp_path / "checkpoints" / "step_00000003",
        "staging": tmp_path / "checkpoints" / ".tmp-step_00000003",
        "bad_marker": tmp_path / "checkpoints" / "step_00000004",
    }[kind]
    if kind == "file":
        path.write_bytes(b"x")
    elif kind != "missing":
        path.mkdir()
    if kind == "bad_marker":
        (path / "COMPLETE").write_text("")
    with pytest.raises(ConfigError) as e:
        ck.resolve_resume(str(path), tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"trainer.resume '{path}' {reason}")
    assert msg.endswith(f"the newest complete checkpoint there is '{newest}'")


def test_ensure_writable(tmp_path):
    out = tmp_path / "a" / "b"
    ck.ensure_writable(out)
    assert out.is_dir() and list(out.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError) as e:
        ck.ensure_writable(tmp_path / "file" / "out")
    assert str(e.value) == f"trainer.output_dir '{tmp_path / 'file' / 'out'}' is not writable: Not a directory"


def draws() -> list:
    return [random.random(), random.gauss(0, 1), np.random.rand(), np.random.randn(), torch.rand(3).tolist()]


def test_rng_state_round_trip(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    random.gauss(0, 1), np.random.randn()  # leave a cached gaussian in both generators
    ck.save_state(tmp_path / "rng.pt", {"rng": ck.rng_state()})
    expected = draws()
    draws()  # move every generator on
    ck.set_rng_state(ck.load_state(tmp_path / "rng.pt")["rng"])
    assert draws() == expected


HELPER = """
import os, sys, time
from pathlib import Path
from rlvr import checkpoint as ck

out, mode = Path(sys.argv[1]), sys.argv[2]
s1 = ck.staging_dir(out, 1)
(s1 / "weights.bin").write_bytes(bytes(range(256)) * 4096)
ck.save_state(s1 / "trainer.pt", {"step": 1})
ck.commit(s1, ck.step_dir(out, 1), {"step": 1})
s2 = ck.staging_dir(out, 2)
for i in range(20):
    with open(s2 / f"shard_{i}.bin", "wb") as f:
        f.write(os.urandom(2 << 20))
        f.flush()
        os.fsync(f.fileno())
    if i == 2:
        if mode == "marker":  # commit's first two steps, then die before the rename
            ck._sync_tree(s2)
            ck._write_marker(s2, {"step": 2})
        (out / "ready").touch()
        if mode == "marker":
            time.sleep(600)
    time.sleep(0.1)
time.sleep(600)  # never commits: the test kills it mid-write
"""


@pytest.mark.parametrize("mode", ["write", "marker"])
def test_kill_during_save_keeps_previous_checkpoint(tmp_path, mode):
    out = tmp_path / "out"
    script = tmp_path / "helper.py"
    script.write_text(HELPER)
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, str(script), str(out), mode], stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not (out / "ready").exists():
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, "helper never got mid-write"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    assert proc.returncode == -9

    one, staging = ck.step_dir(out, 1), ck.staging_path(out, 2)
    assert len(list(staging.glob("shard_*.bin"))) >= 3  # it really was mid-save
    assert (staging / "COMPLETE").exists() == (mode == "marker")
    assert ck.latest(out) == one and ck.resolve_resume("auto", out) == one
    assert ck.list_complete(out) == [one] and not ck.step_dir(out, 2).exists()
    assert (one / "weights.bin").read_bytes() == WEIGHTS
    assert ck.load_state(one / "trainer.pt") == {"step": 1}
    assert json.loads((one / "COMPLETE").read_text()) == {"step": 1, "files": ck.manifest(one)}

    ck.prune(out, keep_last=3)
    assert not staging.exists() and ck.list_complete(out) == [one]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000001"]
