"""What a run carries across steps and restarts: its counters, checkpoints of it (save_checkpoint, restore), its two
clocks (RunClock) and the signals that stop it (StopSignal, RunStopped).

rlvr.checkpoint is the low-level part (folders, commit, prune, RNG files); this module says what goes into a
checkpoint and what comes back out.
"""

from __future__ import annotations

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
    """Every rank writes its shards into a staging folder; rank 0 adds the rest, then renames it into place."""
    step = run["step"]
    if distributed.is_main():
        checkpoint.staging_dir(out, step)  # empty, stale copies removed
    distributed.barrier()  # the folder exists before any rank writes into it
    staging = checkpoint.staging_path(out, step)
    learner.save_state(staging / "learner")  # sharded policy, optimizer, reference (torch.distributed.checkpoint)
    learner.save(staging / "model")  # the policy as a Hugging Face folder
    checkpoint.save_state(staging / f"rng_rank{distributed.rank()}.pt", checkpoint.rng_state())
    if distributed.is_main():
        state = {**run, "stream": stream.state_dict(), "scheduler": learner.scheduler.state_dict(),
                 "train_examples": len(stream.examples), "seed": stream.seed}  # fmt: skip
        checkpoint.save_state(staging / "trainer_state.pt", state)
    distributed.barrier()  # every rank's files are written and fsynced
    if distributed.is_main():
        checkpoint.commit(staging, checkpoint.step_dir(out, step), {"step": step, "world_size": distributed.world_size()})
        checkpoint.prune(out, keep_last)
    distributed.barrier()  # nobody goes on (or exits) before the checkpoint is in place


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
