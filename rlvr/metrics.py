"""Reduce and log per-step metrics: metrics.jsonl, the console's progress (rlvr.console), and wandb if asked; sample
rollouts go to samples.jsonl (and a wandb table)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlvr import console


class MetricsLogger:
    """One JSON object per optimizer step in `metrics.jsonl`; the same dict to wandb."""

    def __init__(
        self,
        output_dir: Path,
        *,
        max_steps: int,
        progress: bool,
        wandb_project: str | None,
        config: dict[str, Any],
        enabled: bool = True,
        resume_step: int | None = None,
        wandb_id: str | None = None,
    ) -> None:
        self.enabled = enabled  # under torchrun only rank 0 writes; the other ranks' loggers do nothing
        self.wandb_id = wandb_id
        if not enabled:
            return
        self.path = output_dir / "metrics.jsonl"
        self.samples_path = output_dir / "samples.jsonl"
        for path in (self.path, self.samples_path):
            if resume_step is not None:  # a resumed run redoes the steps after its checkpoint: drop their old rows
                _truncate(path, resume_step)
            elif path.exists() and path.stat().st_size:  # an earlier run here that never checkpointed: keep it
                path.rename(output_dir / f"{path.stem}.{int(time.time())}.jsonl")
        self.file = self.path.open("a")
        self.progress = console.Progress(max_steps, resume_step or 0, live=progress)
        self.wandb_run = None
        if wandb_project is not None:
            import wandb  # only when asked: it is slow to import

            # a resumed run continues the same wandb run (its id is in the checkpoint)
            try:
                self.wandb_run = wandb.init(project=wandb_project, dir=str(output_dir), config=config, id=wandb_id,
                                            resume="allow")  # fmt: skip
            except Exception as e:  # an unwritable folder, a bad setting: the run goes on, logged to metrics.jsonl
                console.warn(f"rlvr: wandb could not start ({type(e).__name__}: {str(e)[:200]}): this run logs to "
                             f"{self.path} only")  # fmt: skip
            else:
                self.wandb_id = self.wandb_run.id
                if self.wandb_run.url:  # (None offline)
                    console.say(f"wandb: {self.wandb_run.url}")

    def samples(self, rows: list[dict[str, Any]]) -> None:
        """Append sample rollouts (rlvr.sample_log.records) to samples.jsonl, and to wandb as a table."""
        if not self.enabled or not rows:
            return
        with self.samples_path.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        if self.wandb_run is not None:
            import wandb

            columns = list(rows[0])
            data = [[row[c] if c == "reward" else str(row[c]) for c in columns] for row in rows]
            table = wandb.Table(columns=list[str | int](columns), data=data)
            self.wandb_run.log({f"samples/{rows[0]['kind']}": table}, step=rows[0]["step"])

    def note(self, message: str) -> None:
        """A line on the console (rank 0)."""
        if self.enabled:
            console.say(message)

    def log(self, metrics: dict[str, Any]) -> None:
        """Append one step's metrics (must hold 'step') and refresh the progress line."""
        if not self.enabled:
            return
        self.file.write(json.dumps(metrics) + "\n")
        self.file.flush()
        if self.wandb_run is not None:
            try:
                self.wandb_run.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])
            except Exception as e:  # its folder became unwritable, its service went away: said once, the run goes on
                console.warn(f"rlvr: wandb stopped taking rows at step {metrics['step']} ({type(e).__name__}: "
                             f"{str(e)[:200]}): the rest of this run logs to {self.path} only")  # fmt: skip
                self.wandb_run = None
        self.progress.update(metrics)

    def close(self) -> None:
        if not self.enabled:
            return
        self.progress.close()
        self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def split_lengths(prefix: str, lengths: list[int], correct: list[bool]) -> dict[str, float]:
    """`{prefix}correct_mean` and `{prefix}incorrect_mean`: the mean length of the correct and of the incorrect
    responses (Dr.GRPO's length bias); a side without responses is absent."""
    out = {}
    for side, want in (("correct", True), ("incorrect", False)):
        chosen = [n for n, c in zip(lengths, correct) if c == want]
        if chosen:
            out[f"{prefix}{side}_mean"] = sum(chosen) / len(chosen)
    return out


def _truncate(path: Path, last_step: int) -> None:
    """Keep the rows up to and including `last_step` (a killed run may have logged steps past its checkpoint). A line
    that is not a whole row (a kill mid-write tears the last one) is dropped, and said once."""
    if not path.exists():
        return
    kept, torn = [], 0
    for line in path.read_text(errors="replace").splitlines():
        row = _row(line)
        if row is None:
            torn += bool(line.strip())
        elif row["step"] <= last_step:
            kept.append(line + "\n")
    if torn:
        console.warn(f"rlvr: {path}: dropped {torn} torn line{'s' if torn > 1 else ''} (a write cut short by a kill)")
    path.write_text("".join(kept))


def _row(line: str) -> dict[str, Any] | None:
    """A logged row (a JSON object with an integer step), or None for anything else."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None
