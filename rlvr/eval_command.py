"""`rlvr eval`: what to evaluate (a run folder, a checkpoint folder, or model.path), the config it is evaluated with,
and where the results go (eval.json, samples.jsonl). The evaluation itself is rlvr.evaluation's, as in training."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr import console, gold
from rlvr.config import GROUPS, ConfigError, override_key, validate
from rlvr.imports import heavy_imports
from rlvr.models import is_builtin
from rlvr.ranks import check_engines
from rlvr.runs import final_step
from rlvr.settings import AUTO, Settings

APP_KEYS = ("run", "output_dir")  # recipes/eval.yaml's own keys, beside the training config's


@dataclass(frozen=True)
class Target:
    """A trained model and the run that made it."""

    model: Path  # a Hugging Face folder
    run: Path  # the run folder, holding config.yaml
    step: int | None  # the training step the weights are from


def locate(folder: Path) -> Target:
    """run=<folder>: a checkpoint folder (its model/), or a run folder (its final model/, or its newest complete
    checkpoint when that is newer: the run was extended, or is still going); ConfigError naming the folder otherwise."""
    from rlvr import checkpoint  # imports torch: only once a run is asked for

    folder = folder.resolve()
    if not folder.is_dir():
        raise ConfigError(f"run={folder}: no such folder")
    if checkpoint.is_complete(folder):
        checkpoint.verify(folder, "model")  # its model's files as written (a damaged one is named)
        target = Target(folder / "model", folder.parent.parent, json.loads((folder / checkpoint.MARKER).read_text())["step"])
    elif (folder / "config.yaml").is_file():
        newest, final = checkpoint.latest(folder), final_step(folder)
        newest_step = -1 if newest is None else int(json.loads((newest / checkpoint.MARKER).read_text())["step"])
        if newest is not None and (final is None or newest_step > final):
            if final is None:
                console.warn(f"rlvr eval: {folder} has not finished (no model/): evaluating its newest checkpoint, {newest}")
            return locate(newest)
        if final is None:
            raise ConfigError(f"run={folder} has no model yet: neither model/ (written when a run finishes) nor a "
                              "complete checkpoint (checkpoints/step_*)")  # fmt: skip
        target = Target(folder / "model", folder, final)
    else:
        raise ConfigError(f"run={folder} is neither a run folder (it has no config.yaml) nor a checkpoint folder (no "
                          f"{checkpoint.MARKER} marker; checkpoints live in <run>/checkpoints/step_*)")  # fmt: skip
    if not (target.run / "config.yaml").is_file() or not target.model.is_dir():
        raise ConfigError(f"run={folder}: expected {target.run / 'config.yaml'} and the model folder {target.model}")
    return target


def run_config(target: Target, raw: DictConfig, overrides: list[str]) -> DictConfig:
    """The run's own config.yaml (its eval settings included, with eval.n from recipes/eval.yaml where the run sampled
    none), and this command's overrides on top, their values as Hydra parsed them; model.path is the target's model.
    Config groups (data=gym) cannot be re-chosen over a run's config: they replace whole sections."""
    keys = [override_key(o) for o in overrides if not override_key(o).startswith(("hydra.", *APP_KEYS))]
    groups = [o for o in overrides if override_key(o) in GROUPS or override_key(o) == "model.path"]
    if groups or any(o.startswith("~") for o in overrides):
        raise ConfigError(
            f"with run=, the run's own config and model are used, so {', '.join(groups) or 'a key deletion (~)'} cannot "
            f"be applied; override single keys (data.eval_size=500), or evaluate its model with "
            f"model.path={target.model} and the groups you want"
        )
    saved = OmegaConf.load(target.run / "config.yaml")
    assert isinstance(saved, DictConfig), f"{target.run / 'config.yaml'} is not a mapping"
    # keys added since the run was written (eval.*, algo.round_size, algo.pi_old, data.skip_solved, ...) take today's defaults
    defaults = OmegaConf.masked_copy(raw, [str(k) for k in raw if k not in ("hydra", *APP_KEYS)])
    OmegaConf.set_struct(defaults, False)
    merged = OmegaConf.merge(defaults, saved)
    assert isinstance(merged, DictConfig)
    if merged.eval.n == 0 and "eval.n" not in keys:  # training's default (greedy only): rlvr eval also samples
        merged.eval.n = raw.eval.n
    for key in Settings.KEYS.values():  # the device settings are resolved for the machine that evaluates (rlvr.settings)
        OmegaConf.update(merged, key, AUTO, merge=False)
    for key in keys:
        OmegaConf.update(merged, key, OmegaConf.select(raw, key), merge=False)
    merged.model.path = str(target.model)
    return merged  # type: ignore[return-value]


def run(raw: DictConfig, overrides: list[str]) -> Path:
    """Evaluate, write eval.json and samples.jsonl into output_dir, print the metrics; return output_dir."""
    out = Path(raw.output_dir)
    target = None if raw.run is None else locate(Path(raw.run))
    training = OmegaConf.masked_copy(raw, [str(k) for k in raw if k not in ("hydra", *APP_KEYS)])
    cfg = validate(training if target is None else run_config(target, raw, overrides))
    # a run's model: built-in if the run's was (the settings keep it in fp32); its config.yaml names it
    builtin = is_builtin(str(OmegaConf.load(target.run / "config.yaml").model.path if target else cfg.model.path))

    with heavy_imports():  # torch, vllm: only once the config is valid
        import torch

        from rlvr import checkpoint, distributed, multiturn, prompts, settings
        from rlvr.evaluation import evaluate
        from rlvr.models import resolve_model_path
        from rlvr.rewards import Rewarder
        from rlvr.rollout import Engine

    distributed.init()
    check_engines(cfg.rollout.tensor_parallel_size, distributed.world_size())
    if (out / "metrics.jsonl").exists():
        raise ConfigError(f"output_dir={out} holds a training run (metrics.jsonl); write the evaluation elsewhere")
    checkpoint.ensure_writable(out)
    console.log_to(out, distributed.rank())  # other libraries' output: into <out>/rlvr.log from here on
    model_path = resolve_model_path(cfg.model.path)
    device = distributed.broadcast_object(settings.DeviceSpec.detect(distributed.local_world_size()))
    cfg, _, notes = settings.for_run(cfg, model_path, None, device=device, world_size=distributed.world_size(), builtin=builtin)
    if distributed.is_main():
        for note in notes:
            console.detail(note)
    torch.set_num_threads(cfg.trainer.torch_threads)
    _, eval_set, task_verifier, max_model_len, dropped = prompts.load(cfg, model_path, verbose=distributed.is_main())
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=task_verifier)
    try:  # the tools' functions import, their sandbox works; the environment makes one with reset and step
        multiturn.check(cfg, eval_set[0], rewarder.verifier_name)
    except ConfigError:
        rewarder.close()
        raise
    try:  # the verifier must read the held-out gold answers before any model loads (rlvr.gold); every rank checks
        gold_note = gold.startup_note(eval_set, rewarder.gold_check(), cfg.reward.gold_check, cfg.trainer.seed,
                                     rewarder.gold_unchecked, **rewarder.gold_options)
    except ConfigError:
        rewarder.close()
        raise
    if distributed.is_main():
        console.say(f"rlvr eval: {len(eval_set):,} held-out prompts; {gold_note}")
    engine = Engine.from_config(model_path, cfg, max_model_len)
    start = time.perf_counter()
    sampler = multiturn.sampler(engine, cfg, rewarder.verifier_name)  # rollout.tools / rollout.env: several turns
    try:
        metrics, rows = evaluate(sampler, eval_set, rewarder, cfg, None if target is None else target.step, every_row=True)
    finally:
        multiturn.close(sampler)
    seconds = time.perf_counter() - start
    if distributed.is_main():
        report = {
            "model": model_path, "run": None if target is None else str(target.run),
            "step": None if target is None else target.step, "prompts": len(eval_set), "seconds": round(seconds, 3),
            "eval": OmegaConf.to_container(OmegaConf.structured(cfg.eval)),
            "max_new_tokens": cfg.rollout.max_new_tokens, "metrics": metrics, **dropped,
        }  # fmt: skip
        write(out, report, rows)
        console.say(summary(report))
    rewarder.close()
    engine.close()
    distributed.shutdown()
    return out


def write(out: Path, report: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """eval.json and samples.jsonl; files of an earlier evaluation in the same folder are kept under a timestamp."""
    for name in ("eval.json", "samples.jsonl"):
        if (out / name).exists():
            (out / name).rename(out / f"{Path(name).stem}.{int(time.time())}{Path(name).suffix}")
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    with (out / "samples.jsonl").open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def summary(report: dict[str, Any]) -> str:
    """The metrics as a person reads them, one per line; the verifier's timeout shares only where it gave up on some
    answer, with a line saying what that means; the shares of its details (code) only where above zero."""
    e = report["eval"]
    what = "greedy" + (f" + {e['n']} samples each (temperature {e['temperature']}, top_p {e['top_p']})" if e["n"] else "")
    lines = [f"rlvr eval: {report['model']}: {report['prompts']} held-out prompts, {what}, {report['seconds']:.1f} s"]
    metrics = report["metrics"]
    shown = [(key, value) for key, value in metrics.items() if value or not (key.endswith("timeout_frac") or "detail/" in key)]
    lines += [f"  {key:<44} {value:.4f}" for key, value in shown]
    if any(value for key, value in metrics.items() if key.endswith("timeout_frac")):
        lines.append("  timeout_frac: answers the verifier gave up on (its work budget or reward.timeout_s ran out), "
                     "scored as reward.timed_out, not judged")  # fmt: skip
    return "\n".join(lines)
