"""Checkpoint folders: stage, commit atomically (marker, then rename), find, prune; RNG state capture.

Layout: <out>/checkpoints/step_00000010/ holds whatever the learner and trainer wrote plus COMPLETE (json meta),
written last. A folder is a checkpoint only once it has its final name, and it only gets that name after every file
in it, the marker included, is on disk. Staging folders (.tmp-*) are never listed and are removed by prune.

A checkpoint proves itself: COMPLETE lists every file with its size and a fast checksum (adler32) as written, and
whatever loads one checks them first (`damage`): a file truncated by a failed copy or flipped by a disk fault is named,
and trainer.resume=auto falls back to the newest intact checkpoint. Before a checkpoint is written, its expected size is
held against the filesystem's free space (`ensure_space`); a write that fails anyway (ENOSPC, EIO) removes the staging
folder and says where and why (rlvr.run_state), leaving every earlier checkpoint as it was.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.config import ConfigError

MARKER = "COMPLETE"
_STEP = re.compile(r"step_(\d+)")


def step_dir(out: Path, step: int) -> Path:
    """The final folder of a step's checkpoint."""
    return out / "checkpoints" / f"step_{step:08d}"


def staging_path(out: Path, step: int) -> Path:
    """The staging folder's path (no side effects: for ranks other than 0)."""
    final = step_dir(out, step)
    return final.with_name(".tmp-" + final.name)


def staging_dir(out: Path, step: int) -> Path:
    """Rank 0: remove a stale staging folder for this step, create it empty, return it."""
    staging = staging_path(out, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some network/FUSE file systems cannot fsync a directory (EINVAL); the rename stays the commit point.
        if not (path.is_dir() and e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EBADF)):
            raise
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file and directory under folder (files first, each directory after its entries)."""
    for root, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))


def _write_marker(staging: Path, meta: dict[str, Any]) -> None:
    """Write COMPLETE (json meta) and fsync it and its folder."""
    with open(staging / MARKER, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync(staging)


def publish(staging: Path, final: Path) -> None:
    """Rename staging -> final (moving an existing final aside first, deleting it after); fsync the parent."""
    aside = final.with_name(".tmp-replaced-" + final.name)
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    staging.rename(final)
    _fsync(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def commit(staging: Path, final: Path, meta: dict[str, Any]) -> None:
    """Rank 0, after every rank has written and closed its files: make `final` appear complete, atomically, its files'
    sizes and checksums in the marker."""
    _sync_tree(staging)
    _write_marker(staging, {**meta, "files": manifest(staging)})
    publish(staging, final)


def _checksum(path: Path) -> int:
    """adler32 of a file's bytes, read 8 MiB at a time (~2.4 GB/s on a Zen 3 core: a fast check, not a cryptographic one)."""
    value = 1
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            value = zlib.adler32(chunk, value)
    return value


def manifest(folder: Path) -> dict[str, list[int]]:
    """Every file under `folder` (relative path) -> [size, checksum]."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)
    return {p.relative_to(folder).as_posix(): [p.stat().st_size, _checksum(p)] for p in files}


def damage(folder: Path, within: str = "") -> str | None:
    """Why a complete checkpoint cannot be loaded as written (a file missing, of another size or with another checksum
    than its marker lists, naming it); None when it is intact, or predates the marker's file list. `within`: only the
    files in that subfolder (`rlvr eval` reads model/ alone)."""
    files = json.loads((folder / MARKER).read_text()).get("files")
    if not isinstance(files, dict):
        return None
    for name, (size, checksum) in files.items():
        if within and not name.startswith(within + "/"):
            continue
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size:,} bytes, not the {size:,} it was written with (truncated or overwritten)"
        if _checksum(path) != checksum:
            return f"{path} does not hold the bytes it was written with (its checksum differs: damaged on disk or in a copy)"
    return None


def verify(folder: Path, within: str = "") -> None:
    """ConfigError naming the damaged file when `folder` (a complete checkpoint; `within`: that subfolder of it) is not
    intact."""
    problem = damage(folder, within)
    if problem is not None:
        raise ConfigError(f"checkpoint {folder} is damaged: {problem}")


def is_complete(folder: Path) -> bool:
    """A finished checkpoint: not a .tmp-* folder, and its COMPLETE marker exists and parses."""
    if folder.name.startswith(".tmp-"):
        return False
    try:
        json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return True


def _complete_in(checkpoints: Path) -> list[Path]:
    if not checkpoints.is_dir():
        return []
    found = [(int(m[1]), p) for p in checkpoints.iterdir() if (m := _STEP.fullmatch(p.name)) and is_complete(p)]
    return [p for _, p in sorted(found)]


def list_complete(out: Path) -> list[Path]:
    """Complete checkpoints under out, oldest step first (by step number, not name or mtime)."""
    return _complete_in(out / "checkpoints")


def latest(out: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_complete(out)
    return found[-1] if found else None


def resolve_resume(resume: str, out: Path) -> Path | None:
    """trainer.resume -> the checkpoint folder to load: never -> None; auto -> the newest intact complete checkpoint (a
    damaged newer one is named, with the steps that will be redone); else a checked path (damaged: ConfigError)."""
    if resume == "never":
        return None
    if resume == "auto":
        return _newest_intact(out)
    folder = Path(resume)
    if not folder.exists():
        why = "does not exist"
    elif not folder.is_dir():
        why = "is not a checkpoint folder (not a directory)"
    elif is_complete(folder):
        problem = damage(folder)
        if problem is None:
            return folder
        raise ConfigError(f"trainer.resume '{resume}' is damaged: {problem}; resume from another checkpoint "
                          f"({', '.join(str(p) for p in _complete_in(folder.parent) if p != folder) or 'none left'})")  # fmt: skip
    elif folder.name.startswith(".tmp-"):
        why = "is incomplete: a staging folder, a save was interrupted before it was committed"
    elif (folder / MARKER).exists():
        why = f"is incomplete: its {MARKER} marker does not parse"
    elif _STEP.fullmatch(folder.name):
        why = f"is incomplete: no {MARKER} marker, a save was interrupted"
    else:
        why = f"is not a checkpoint folder (no {MARKER} marker; checkpoints live in <output_dir>/checkpoints/step_*)"
    # the folder's own run is the likelier source of a good checkpoint than this run's output_dir
    checkpoints = folder.parent if folder.parent.name == "checkpoints" else out / "checkpoints"
    found = _complete_in(checkpoints)
    hint = f"; the newest complete checkpoint there is '{found[-1]}'" if found else ""
    raise ConfigError(f"trainer.resume '{resume}' {why}{hint}")


def newest_intact(out: Path) -> Path | None:
    """The newest complete checkpoint whose files are as written (what a stopped run names as the one to continue
    from: a damaged newer one, left by an earlier fallback, is not)."""
    return next((folder for folder in reversed(list_complete(out)) if damage(folder) is None), None)


def _newest_intact(out: Path) -> Path | None:
    """newest_intact, each damaged newer one said (a warning naming its file and the steps redone); ConfigError when
    checkpoints exist and none is intact."""
    from rlvr import console

    found = list_complete(out)
    damaged: list[tuple[Path, str]] = []
    for folder in reversed(found):
        problem = damage(folder)
        if problem is None:
            if damaged:
                step, last = _step_of(folder), _step_of(damaged[0][0])
                for bad, why in damaged:
                    console.warn(f"rlvr: warning: checkpoint {bad} is damaged: {why}; not resumed from")
                console.warn(f"rlvr: resuming from {folder} (step {step}): steps {step + 1}-{last} are redone")
            return folder
        damaged.append((folder, problem))
    if damaged:
        raise ConfigError(f"every checkpoint in {out / 'checkpoints'} is damaged (the newest, {damaged[0][0]}: "
                          f"{damaged[0][1]}); restore one from a copy, or start afresh in a new trainer.output_dir")  # fmt: skip
    return None


def ensure_space(folder: Path, needed: int, what: str) -> None:
    """NoSpace naming the filesystem, the bytes needed and free, and what to do, when `what` (about `needed` bytes) will
    not fit in `folder`'s filesystem."""
    free = shutil.disk_usage(_existing(folder)).free
    if needed > free:
        raise NoSpace(f"{what} needs about {_mib(needed)} in {folder}, but its filesystem ({mount_point(_existing(folder))}) has "
                      f"{_mib(free)} free")  # fmt: skip


def disk_full(error: BaseException, folder: Path) -> bool:
    """Whether a failed write failed for want of space: ENOSPC anywhere in its chain or words (safetensors and DCP wrap
    it), or `folder`'s filesystem left with under 1 MiB free (torch.save says only "unexpected pos 704 vs 598")."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "errno", None) == errno.ENOSPC or "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return shutil.disk_usage(_existing(folder)).free < 1 << 20


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest ancestor that exists (a staging folder not yet made, or already removed)."""
    while not folder.exists():
        folder = folder.parent
    return folder


def _step_of(folder: Path) -> int:
    return int(_STEP.fullmatch(folder.name)[1])  # type: ignore[index]


class NoSpace(OSError):
    """A write would not fit, or did not: the message names where and how much (rlvr.run_state stops the run with it)."""


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path`."""
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def prune(out: Path, keep_last: int) -> None:
    """Rank 0, with no save in flight: delete all but the newest keep_last complete checkpoints, and stale .tmp-*."""
    checkpoints = out / "checkpoints"
    found = list_complete(out)
    old = found[: max(len(found) - keep_last, 0)]
    stale = [p for p in checkpoints.glob(".tmp-*")] if checkpoints.is_dir() else []
    for path in old + stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def ensure_writable(out: Path) -> None:
    """Create out and prove it takes a written, fsynced file; ConfigError with the OS reason otherwise."""
    probe = out / f".write-probe-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"trainer.output_dir '{out}' is not writable: {e.strerror or e}") from None


def rng_state() -> dict[str, Any]:
    """python `random`, numpy's global generator, torch CPU and every CUDA device, as weights_only-loadable types."""
    version, internal, gauss = random.getstate()
    np_state: dict[str, Any] = np.random.get_state(legacy=False)  # {bit_generator, state: {key, pos}, has_gauss, gauss}
    mt = np_state["state"]
    key = torch.from_numpy(mt["key"].astype(np.int64))  # [624] uint32 words; weights_only cannot load an ndarray
    return {
        "python": [version, list(internal), gauss],
        "numpy": {**np_state, "state": {"key": key, "pos": int(mt["pos"])}},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured (CUDA: the devices present here, up to those saved)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({**n, "state": {**n["state"], "key": n["state"]["key"].numpy().astype(np.uint32)}})
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for device, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device)


def save_state(path: Path, obj: dict[str, Any]) -> None:
    """torch.save obj to path and fsync it (atomicity comes from commit, not from here)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def load_state(path: Path) -> dict[str, Any]:
    """torch.load with weights_only=True (cannot run code), tensors mapped to CPU."""
    return torch.load(path, weights_only=True, map_location="cpu")
