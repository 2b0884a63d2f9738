"""Run folders as training wrote them so far (config.yaml, .hydra/overrides.yaml, metrics.jsonl, samples.jsonl):
finding them under sweep folders, grouping the seeds of one config, naming the groups, and their series (mean and
min-max over seeds). What `rlvr report` draws; no torch, no vllm, no matplotlib.

A file being written has a partial last line: it is ignored, so this reads runs that are still training.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlvr import console
from rlvr.config import override_key

SAME_GROUP_KEYS = ("trainer.seed", "trainer.output_dir", "logger.")  # runs differing only here are seeds of one config
TARGET_ACCURACY = 0.90  # the first wall-clock time a run's held-out accuracy reached this is in its summary
SAMPLES_PER_GROUP = 3  # completions shown per group from its last evaluation
MAX_LABEL_KEYS = 3  # config keys named in a legend label before "…" (more only when needed to tell groups apart)
FINAL_STEP_FILE = "rlvr_step.json"  # in <run>/model, written with the final weights: {"step": N}
PASS_AT = re.compile(r"eval/pass@(\d+)")


@dataclass(eq=False)
class Run:
    """One run folder as written so far."""

    path: Path
    config: dict[str, Any]  # flattened: {"trainer.seed": 0, ...}
    overrides: list[str] | None  # Hydra's command-line overrides; None without .hydra/overrides.yaml
    rows: list[dict[str, Any]]  # metrics.jsonl, one per step, in step order
    failure: str | None  # why there is nothing to plot; None when there are rows
    finished: bool  # its final model/ is from its last logged step

    @property
    def step(self) -> int:
        return self.rows[-1]["step"] if self.rows else 0

    @property
    def status(self) -> str:
        if self.failure is not None:
            return f"FAILED: {self.failure}"
        return "finished" if self.finished else f"running or stopped at step {self.step}"


@dataclass
class Band:
    x: np.ndarray  # [S] steps, wall-clock seconds or k
    mean: np.ndarray  # [S] mean over the group's runs
    lo: np.ndarray  # [S] min over the runs
    hi: np.ndarray  # [S] max over the runs


# ---- reading run folders ----


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Run folders under the paths (a run, a sweep, or any folder holding them), in natural order (2-x before 10-x)."""
    found: list[Path] = []
    for root in paths:
        for folder, subdirs, _ in os.walk(root):
            if _is_run(Path(folder)):
                found.append(Path(folder).resolve())
                subdirs.clear()  # a run's own subfolders (model/, checkpoints/) hold no runs
            else:
                subdirs[:] = sorted((d for d in subdirs if not d.startswith(".")), key=_natural)
    return list(dict.fromkeys(found))


def _is_run(folder: Path) -> bool:
    # a sweep job that crashed at start-up has only .hydra/; an `rlvr eval` folder (.hydra/ and eval.json) is no run
    if (folder / "eval.json").exists() and not (folder / "metrics.jsonl").exists():
        return False
    return any((folder / name).exists() for name in ("metrics.jsonl", "config.yaml", ".hydra"))


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file; a last line without its newline is still being written: ignored. A
    line that is not JSON (torn by a kill, with a later run's rows appended after it) is skipped, with a note."""
    complete = path.read_text(errors="replace").split("\n")[:-1]
    rows = []
    for number, line in enumerate(complete, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                console.warn(f"rlvr: {path} line {number} is not JSON ({e.msg}; torn by a kill?): skipped")
    return rows


def load_run(path: Path) -> Run:
    """A run folder as it is now; one without metrics rows is kept, with the reason, to be listed as failed."""
    config = _read_yaml(path / "config.yaml") or _read_yaml(path / ".hydra" / "config.yaml")  # a crashed job: Hydra's
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml")
    rows, failure = _read_metrics(path / "metrics.jsonl")
    return Run(
        path, flatten(config if isinstance(config, dict) else {}),
        [str(o) for o in overrides] if isinstance(overrides, list) else None, rows, failure, _finished(path, rows),
    )


def final_step(run: Path) -> int | None:
    """The step of <run>/model's weights (written when a run finishes); None without model/. A run extended later
    (a higher trainer.max_steps) keeps its older model/ until it finishes again, so the step is written beside it."""
    model = run / "model"
    if not model.is_dir():
        return None
    try:
        return int(json.loads((model / FINAL_STEP_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):  # written before the step file existed: at trainer.max_steps
        config = _read_yaml(run / "config.yaml")
        return int(config["trainer"]["max_steps"]) if isinstance(config, dict) else None


def _finished(path: Path, rows: list[dict[str, Any]]) -> bool:
    step = final_step(path)
    return step is not None and bool(rows) and step >= rows[-1]["step"]


def _read_yaml(path: Path) -> Any:
    """The file's YAML; None if it is missing or unreadable (being written)."""
    import yaml  # PyYAML comes with omegaconf

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows, one per step in step order; or why there are none."""
    if not path.exists():
        return [], "no metrics.jsonl"
    try:
        by_step = {r["step"]: r for r in read_jsonl(path) if isinstance(r, dict) and isinstance(r.get("step"), int)}
    except ValueError as e:
        return [], str(e)
    return ([by_step[s] for s in sorted(by_step)], None) if by_step else ([], "no rows")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# ---- groups and their legend labels ----


def _same_group(key: str) -> bool:
    return key.startswith(SAME_GROUP_KEYS)


def group_runs(runs: list[Run]) -> list[list[Run]]:
    """Runs (with rows) whose configs are equal but for seed, output folder and logger; in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in run.config.items() if not _same_group(k)}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def legend_labels(groups: list[list[Run]]) -> list[str]:
    """One label per group: the overrides that differ between groups (seed excluded), else the differing config keys
    with their values; " (n seeds)" when a group has several runs."""
    labels = _override_labels(groups) or _config_labels(groups)
    return [label + _seeds_suffix(runs) for label, runs in zip(labels, groups)]


def _override_labels(groups: list[list[Run]]) -> list[str] | None:
    """None when a run has no overrides file or the overrides do not tell the groups apart."""
    if any(run.overrides is None for runs in groups for run in runs):
        return None
    per_group = []  # the overrides every run of the group shares, by key
    for runs in groups:
        shared = set.intersection(*(set(run.overrides or []) for run in runs))
        ordered = [o for o in runs[0].overrides or [] if o in shared]
        per_group.append({override_key(o): o for o in ordered if not _same_group(override_key(o))})
    if len(groups) == 1:
        return [" ".join(per_group[0].values())] if per_group[0] else None
    keys = list(dict.fromkeys(k for overrides in per_group for k in overrides))
    differing = [k for k in keys if len({overrides.get(k) for overrides in per_group}) > 1]
    labels = [" ".join(overrides[k] for k in differing if k in overrides) for overrides in per_group]
    return labels if all(labels) and len(set(labels)) == len(labels) else None


def _config_labels(groups: list[list[Run]]) -> list[str]:
    """Name the config keys whose values differ between groups; the folder name for a single group."""
    if len(groups) == 1:
        return [Path(os.path.commonpath([run.path for run in groups[0]])).name]
    configs = [runs[0].config for runs in groups]
    keys = list(dict.fromkeys(k for config in configs for k in config if not _same_group(k)))
    differing = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
    shown = min(MAX_LABEL_KEYS, len(differing))
    while True:  # more keys only when the first ones do not tell the groups apart
        labels = [" ".join(f"{k}={_yaml_value(c.get(k))}" for k in differing[:shown]) for c in configs]
        if len(set(labels)) == len(labels) or shown >= len(differing):
            break
        shown += 1
    return [label + (" …" if shown < len(differing) else "") for label in labels]


def _yaml_value(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _seeds_suffix(runs: list[Run]) -> str:
    if len(runs) == 1:
        return ""
    seeds = {run.config.get("trainer.seed") for run in runs}
    return f" ({len(runs)} {'seeds' if len(seeds) == len(runs) else 'runs'})"


# ---- series over a group's runs ----


def values(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """step -> finite value of `key`, at the steps that logged it."""
    return {row["step"]: float(row[key]) for row in rows if _finite(row.get(key))}


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def aggregate(per_run: list[dict[Any, float]]) -> tuple[list[Any], np.ndarray]:
    """The x values every run has, sorted, and the runs' values there: (x [S], values [R, S])."""
    xs = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    return xs, np.array([[d[x] for x in xs] for d in per_run], dtype=float).reshape(len(per_run), len(xs))


def band(runs: list[Run], key: str, clock: bool = False) -> Band | None:
    """Mean and min-max over the runs of `key`, at the steps where every run has it; None if there are none.
    clock: x = the runs' mean time/elapsed_s at that step (steps without it are left out)."""
    per_run = [values(run.rows, key) for run in runs]
    clocks = [values(run.rows, "time/elapsed_s") for run in runs]
    if clock:
        per_run = [{s: v for s, v in d.items() if s in c} for d, c in zip(per_run, clocks)]
    steps, v = aggregate(per_run)  # v: [R, S]
    if not steps:
        return None
    x = aggregate([{s: c[s] for s in steps} for c in clocks])[1].mean(0) if clock else np.asarray(steps, dtype=float)
    return Band(x, v.mean(0), v.min(0), v.max(0))


def pass_at_k_band(runs: list[Run]) -> Band | None:
    """pass@k against k at each run's last evaluation that logged pass@k; None if none did."""
    per_run = []
    for run in runs:
        last = next((r for r in reversed(run.rows) if any(PASS_AT.fullmatch(k) for k in r)), None)
        if last is None:
            return None
        per_run.append({int(m[1]): float(v) for k, v in last.items() if (m := PASS_AT.fullmatch(k)) and _finite(v)})
    ks, v = aggregate(per_run)  # v: [R, K]
    return Band(np.asarray(ks, dtype=float), v.mean(0), v.min(0), v.max(0)) if ks else None


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average; the first points average what there is so far."""
    sums = np.cumsum(np.insert(np.asarray(y, dtype=float), 0, 0.0))
    counts = np.minimum(np.arange(1, len(y) + 1), window)
    return (sums[1:] - sums[np.arange(len(y)) + 1 - counts]) / counts



# ---- one run's summary and samples ----


def run_summary(run: Run) -> dict[str, float | None]:
    """The table's numbers for one run; None where it logged nothing."""
    accuracy, clock = values(run.rows, "eval/accuracy"), values(run.rows, "time/elapsed_s")
    reached = [clock.get(step) for step in sorted(accuracy) if accuracy[step] >= TARGET_ACCURACY]
    return {
        "final_accuracy": _last(run.rows, "eval/accuracy"),
        "best_accuracy": max(accuracy.values(), default=None),
        "time_to_target": reached[0] if reached else None,
        "train_s": _last(run.rows, "time/train_s"),
        "reward": _last(run.rows, "reward/mean"),
        "length": _last(run.rows, "response_length/mean"),
    }


def _last(rows: list[dict[str, Any]], key: str) -> float | None:
    logged = values(rows, key)
    return logged[max(logged)] if logged else None


def last_eval_samples(runs: list[Run]) -> tuple[Run, list[dict[str, Any]]] | None:
    """The first few completions of the last evaluation in samples.jsonl, from the first of the runs that has one."""
    for run in runs:
        try:
            rows = [r for r in read_jsonl(run.path / "samples.jsonl") if _is_eval_sample(r)]
        except (OSError, ValueError):
            continue
        if rows:
            last = max(r["step"] for r in rows)
            return run, [r for r in rows if r["step"] == last][:SAMPLES_PER_GROUP]
    return None


def _is_eval_sample(row: Any) -> bool:
    return isinstance(row, dict) and row.get("kind") == "eval" and isinstance(row.get("step"), int)
