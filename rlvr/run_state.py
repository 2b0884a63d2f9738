"""What a run carries across steps and restarts: its counters, checkpoints of it (save_checkpoint, restore), its two
clocks (RunClock) and the signals that stop it (StopSignal, RunStopped).

rlvr.checkpoint is the low-level part (folders, commit, prune, RNG files); this module says what goes into a
checkpoint and what comes back out.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from rlvr import checkpoint, console, distributed
from rlvr.config import ConfigError
from rlvr.data import PromptStream
from rlvr.learner import Learner
from rlvr.runs import FINAL_STEP_FILE


class RunStopped(RuntimeError):
    """The run ended early on purpose (a signal, or too many bad steps); `exit_code` is for the shell."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fresh_counters() -> dict[str, Any]:
    """What a checkpoint carries besides weights and RNGs, at a run's start (elapsed_s, train_s: the clock at that
    step; pi_old_fell_back: the engine's logprobs strayed from the learner's, pi_old comes from the learner;
    informative_frac: what dynamic sampling's next round is sized from)."""
    return {"step": 0, "bad_in_a_row": 0, "wandb_id": None, "elapsed_s": 0.0, "train_s": 0.0,
            "informative_frac": None, "pi_old_fell_back": False}  # fmt: skip


def save_checkpoint(out: Path, run: dict[str, Any], learner: Learner, stream: PromptStream, keep_last: int) -> None:
    """Every rank writes its shards into a staging folder; rank 0 adds the rest, then renames it into place. Its size is
    held against the free space first; a write that fails (a full disk, an I/O error) removes the staging folder and
    stops the run (RunStopped, exit code 5), every earlier checkpoint as it was."""
    step = run["step"]
    write = _Write(f"the step-{step} checkpoint", out, keep_last, checkpoint.staging_path(out, step))
    with write:
        if distributed.is_main():
            checkpoint.ensure_space(out / "checkpoints", learner.checkpoint_bytes(), write.what)
            checkpoint.staging_dir(out, step)  # empty, stale copies removed
    write.settle()  # the folder exists before any rank writes into it
    with write:
        learner.save_state(write.staging / "learner")  # sharded policy, optimizer, reference (torch.distributed.checkpoint)
        learner.save(write.staging / "model")  # the policy as a Hugging Face folder
        checkpoint.save_state(write.staging / f"rng_rank{distributed.rank()}.pt", checkpoint.rng_state())
        if distributed.is_main():
            state = {**run, "stream": stream.state_dict(), "scheduler": learner.scheduler.state_dict(),
                     "train_examples": len(stream.examples), "seed": stream.seed}  # fmt: skip
            checkpoint.save_state(write.staging / "trainer_state.pt", state)
    write.settle()  # every rank's files are written and fsynced
    with write:
        if distributed.is_main():
            checkpoint.commit(write.staging, checkpoint.step_dir(out, step), {"step": step, "world_size": distributed.world_size()})
            checkpoint.prune(out, keep_last)
    write.settle()  # nobody goes on (or exits) before the checkpoint is in place


def save_model(out: Path, learner: Learner, step: int, keep_last: int) -> None:
    """The final policy as <out>/model (a Hugging Face folder, with the step its weights are from), written beside it
    and swapped in once whole, so an earlier model/ stays until the new one is complete; a write that fails or would not
    fit stops the run as save_checkpoint's does."""
    write = _Write("the final model", out, keep_last, out / ".tmp-model")
    with write:
        if distributed.is_main():
            checkpoint.ensure_space(out, learner.checkpoint_bytes(state=False), write.what)
            shutil.rmtree(write.staging, ignore_errors=True)
    write.settle()
    with write:
        learner.save(write.staging)
        if distributed.is_main():  # which step these weights are from (`rlvr eval run=` compares it with the checkpoints)
            (write.staging / FINAL_STEP_FILE).write_text(json.dumps({"step": step}) + "\n")
            checkpoint.publish(write.staging, out / "model")
    write.settle()


class _Write:
    """One write of a checkpoint or of the final model, on every rank: `with write:` around each part keeps its failure
    (a full disk shows as torch's RuntimeError, safetensors' SafetensorError or DCP's CheckpointException as often as an
    OSError, so every exception is kept, and whether the filesystem was full is judged there and then); `settle()`, a
    collective, stops every rank when any failed, the staging folder removed and rlvr's words on where, why and what to
    do, the failure's traceback chained (rlvr.cli writes it to the run's log)."""

    def __init__(self, what: str, out: Path, keep_last: int, staging: Path) -> None:
        self.what, self.out, self.keep_last, self.staging = what, out, keep_last, staging
        self.failure: Exception | None = None
        self.full = False

    def __enter__(self) -> _Write:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        if not isinstance(error, Exception):
            return False  # done, or a KeyboardInterrupt / SystemExit: not a write's failure
        self.failure = error
        self.full = isinstance(error, checkpoint.NoSpace) or checkpoint.disk_full(error, self.staging)
        return True

    def settle(self) -> None:
        if not distributed.any_true(self.failure is not None):
            return
        if distributed.is_main():
            shutil.rmtree(self.staging, ignore_errors=True)
        error = self.failure
        if isinstance(error, checkpoint.NoSpace):
            why = str(error)
        elif error is None:
            why = f"writing {self.what} failed on another rank"
        else:
            said = (error.strerror or str(error)) if isinstance(error, OSError) else str(error)
            where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
            why = f"writing {self.what} failed: {type(error).__name__}: {said.splitlines()[0][:200] if said else ''}{where}"
            if self.full:
                why += f"; the filesystem of {self.out} ({checkpoint.mount_point(self.out)}) is full"
        newest = checkpoint.newest_intact(self.out)
        raise RunStopped(
            f"{why}. Nothing of it was kept; the newest checkpoint, {newest or 'none yet'}, is untouched. Free space "
            f"there, keep fewer checkpoints (trainer.keep_last={self.keep_last}) or choose another trainer.output_dir, "
            f"then continue with trainer.resume=auto",
            exit_code=WRITE_FAILED,
        ) from error


WRITE_FAILED = 5  # the exit code of a run stopped by a write that failed or would not fit (docs/guide/checkpoints.md)


def restore(folder: Path, learner: Learner, stream: PromptStream, seed: int) -> dict[str, Any]:
    """Load a checkpoint into the learner, the prompt stream and the RNGs; return the run's counters."""
    state = checkpoint.load_state(folder / "trainer_state.pt")
    if state["train_examples"] != len(stream.examples) or state["seed"] != seed:
        raise ConfigError(
            f"trainer.resume: {folder} was written with {state['train_examples']} training examples and "
            f"trainer.seed={state['seed']}; this run has {len(stream.examples)} and seed {seed}, so it "
            "would not continue the same prompt order. Resume with the original data and seed, or trainer.resume=never"
        )
    learner.load_state(folder / "learner")
    learner.scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    rng = folder / f"rng_rank{distributed.rank()}.pt"
    if rng.exists():  # absent when resuming on more ranks than wrote it: those keep the seeded RNGs
        checkpoint.set_rng_state(checkpoint.load_state(rng))
    counters = fresh_counters()  # elapsed_s, train_s, informative_frac, pi_old_fell_back: absent from older checkpoints
    return {**counters, **{k: state[k] for k in counters if k in state}}


class Part:
    """Which part of a step is running, so that a failure of one (the engine, the verifiers, the learner, an evaluation)
    stops the run with rlvr's one paragraph naming the part and the step, and where to continue from; the exception's
    traceback goes to the run's log (rlvr.cli)."""

    def __init__(self) -> None:
        self.step, self.name = 0, "start-up"

    def now(self, name: str, step: int | None = None) -> None:
        self.name = name
        self.step = self.step if step is None else step

    def failed(self, error: Exception, out: Path) -> RunStopped:
        import torch

        oom = isinstance(error, (MemoryError, torch.OutOfMemoryError))
        hint = (" (out of memory: lower trainer.micro_batch_tokens or rollout.gpu_memory_utilization, or set "
                "trainer.activation_checkpointing=true; `rlvr plan` shows what fits)") if oom else ""  # fmt: skip
        newest = checkpoint.newest_intact(out)
        where = f"continue from it with trainer.resume=auto trainer.output_dir={out}" if newest else "no checkpoint was written yet"
        return RunStopped(f"step {self.step}: {self.name} failed: {type(error).__name__}: {str(error)[:300]}{hint}. The "
                          f"newest checkpoint, {newest or 'none'}, is intact; {where}", exit_code=PART_FAILED)  # fmt: skip


PART_FAILED = 1  # the exit code of a run stopped by a failing part (an error, as an unexpected one; the words say which)


class RunClock:
    """The two clocks every metrics row carries, so curves can be drawn against wall clock:
    `time/elapsed_s`, seconds since launch (this process's start, imports included; a sweep's later job: its start); `time/train_s`, the loop alone
    (rollout, update, weight sync and the step's metrics; no start-up, evaluation, logging or checkpoint). A resumed run continues both
    from its checkpoint's values, so the time between the kill and the resume is not counted."""

    def __init__(self, launched: float | None, elapsed_s: float, train_s: float) -> None:
        self.launch = psutil.Process().create_time() if launched is None else launched  # seconds since the epoch
        self.before = elapsed_s
        self.train_s = train_s

    def elapsed(self) -> float:
        return self.before + time.time() - self.launch

    def row(self) -> dict[str, float]:
        return {"time/elapsed_s": round(self.elapsed(), 3), "time/train_s": round(self.train_s, 3)}


class StopSignal:
    """SIGINT/SIGTERM ask the run to finish the current step, write a checkpoint and stop; a second one stops at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        console.warn(f"{self.requested}: finishing this step, then writing a checkpoint (again to stop now)")

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
