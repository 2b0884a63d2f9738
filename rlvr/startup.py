"""Start-up: everything a run needs, built and checked in one place. `start(cfg)` returns a `Run` that owns the parts
(learner, engine, rewarder, prompt stream, metrics logger, clock, round sizer, held-out set, weight-sync mode, the
counters a checkpoint carries, the stop signal, the loss options, the sync check); rlvr.trainer's loop runs over it
and closes it.

The order is the run's contract: the checks that need no model come first (output folder, resume point, device
settings, data, reward functions, the verifier on the gold answers), then the learner, the engine (which re-seeds the
global RNGs and resets torch's float32 matmul precision), the sync check's baseline (rlvr.sync_check: engine and
learner hold the same weights there), the seeding, the resume (its push checked), the logger and the step-0
evaluation.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from rlvr import (
    checkpoint,
    console,
    distributed,
    evaluation,
    gold,
    lora,
    multiturn,
    prompts,
    sample_log,
    settings,
    thinking,
)
from rlvr.algo import LossOptions
from rlvr.collect import RoundSizer
from rlvr.config import Config, ConfigError, PiOld, Task, ThinkMode
from rlvr.data import PromptStream
from rlvr.learner import Learner, loss_options
from rlvr.metrics import MetricsLogger
from rlvr.models import is_builtin, resolve_model_path
from rlvr.ranks import check_world
from rlvr.rewards import Rewarder
from rlvr.rollout import Engine
from rlvr.run_state import RunClock, StopSignal, fresh_counters, restore
from rlvr.sync_check import SyncCheck, probe_ids
from rlvr.types import Example

PROBE_PROMPTS = 8  # the sync probe's prompts (rlvr.sync_check), the held-out set's first
_runs_started: list[float] = []  # a Hydra sweep runs its jobs one after another in one process


class Run:
    """One run's parts, as start() builds them. `counters` is what a checkpoint carries besides weights and RNGs
    (rlvr.run_state.fresh_counters); `from_engine`: pi_old is the engine's logprobs (pi_old_from_engine) until they
    stray from the learner's. close() takes down what was built: on a half-built Run too, and twice is once."""

    out: Path
    learner: Learner
    engine: Engine
    sampler: multiturn.Sampler  # what rollouts and evaluations sample from: the engine, with tools where asked
    rewarder: Rewarder
    stream: PromptStream
    logger: MetricsLogger
    clock: RunClock
    sizer: RoundSizer
    eval_set: list[Example]
    sync: str | None  # LoRA: how the engine follows the adapter (rlvr.lora.sync_mode); None: full weights
    from_engine: bool
    resume_from: Path | None
    dropped: dict[str, int]  # the data's prompts left out (too long), for the step-0 row
    loss: LossOptions  # the loss's options, as learner.update takes them
    stop: StopSignal
    sync_check: SyncCheck  # after every push: does the engine compute what the learner computes?
    think_prompts: int  # prompts whose template left a thinking block open or closed at their end

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg  # (start() replaces it with the resolved one: every `auto` a value)
        self.counters = fresh_counters()
        self._closed = False

    def push(self, where: str) -> dict[str, float]:
        """The learner's policy into the engine (push_weights), then the check that the engine now computes what the
        learner does (rlvr.sync_check: SyncError, naming `where`, if not); its sync/* metrics. A collective."""
        push_weights(self.engine, self.learner, self.sync, self.out)
        return self.sync_check.after_push(where)

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The eval/* metrics on the held-out set, and its sample records (rlvr.evaluation)."""
        return evaluation.evaluate(self.sampler, self.eval_set, self.rewarder, self.cfg, step)

    def close(self) -> None:
        """The tools' workers, the verifier workers, the signal handlers, the engine, then the process group."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "sampler"):
            multiturn.close(self.sampler)
        if hasattr(self, "rewarder"):
            self.rewarder.close()
        if hasattr(self, "stop"):
            self.stop.restore()
        if hasattr(self, "engine"):
            self.engine.close()  # vLLM's shutdown tears down its process groups (and the default one): before ours
        distributed.shutdown()


def start(cfg: Config, recipe: str | None = None) -> Run:
    """Check and build everything the run needs; log the step-0 evaluation (a fresh run) or the resume point. `recipe`:
    the recipe's name, for the start-up summary. If a part fails, the parts built before it are closed first."""
    # the run's clock (time/elapsed_s) starts at its launch: the process's start for the first run in a process
    # (imports included), the call for a sweep's later jobs
    launched = time.time() if _runs_started else None
    _runs_started.append(time.time())
    run = Run(cfg)
    try:
        _build(run, recipe, launched)
    except BaseException:
        run.close()
        raise
    return run


def _build(run: Run, recipe: str | None, launched: float | None) -> None:
    cfg = run.cfg
    distributed.init()  # torchrun's process group, or a world of one
    check_world(cfg, distributed.world_size())
    # Hydra's timestamped folder may differ per rank: rank 0's
    out = run.out = Path(distributed.broadcast_object(cfg.trainer.output_dir))

    # Start-up checks, before any model loads: the output folder, the resume point, the device settings, the data and
    # its prompt budget, the reward functions (the verifier workers start here), the verifier on the data's gold answers.
    checkpoint.ensure_writable(out)
    console.log_to(out, distributed.rank())  # other libraries' output: into <out>/rlvr.log from here on
    model_path = resolve_model_path(cfg.model.path)
    lora.check_init(cfg)
    resume_from = run.resume_from = checkpoint.resolve_resume(cfg.trainer.resume, out)
    # every `auto` becomes a value for this device and model (rank 0's device); a resume keeps what the run started with
    device = distributed.broadcast_object(settings.DeviceSpec.detect(distributed.local_world_size()))
    cfg, resolved, setting_notes = settings.for_run(cfg, model_path, out if resume_from else None, device=device,
                                                    world_size=distributed.world_size(), builtin=is_builtin(cfg.model.path))  # fmt: skip
    run.cfg = cfg
    a, t = cfg.algo, cfg.trainer
    sync = run.sync = lora.sync_mode(cfg)  # LoRA: how the engine follows the adapter; needs the resolved dtype
    adapter_rank = cfg.model.lora.rank if sync == "adapter" else 0
    if adapter_rank:
        settings.engine_lora_rank(adapter_rank)  # vLLM's limit on adapter ranks: a ConfigError now, before any model loads
    torch.set_num_threads(t.torch_threads)  # the engine and the learner take turns on the same cores
    # the token ids the engine and learner will see
    loaded = prompts.load(cfg, model_path, verbose=distributed.is_main())
    train_set, run.eval_set, task_verifier, max_model_len, run.dropped = loaded
    run.think_prompts = sum(e.think is not thinking.State.ABSENT for e in train_set + run.eval_set)  # rlvr.thinking
    if resume_from is None and checkpoint.latest(out) is not None:  # trainer.resume=never over an earlier run
        raise ConfigError(
            f"trainer.resume=never, but {out} already holds checkpoints (newest: {checkpoint.latest(out)}) that this run "
            "would overwrite; choose a new trainer.output_dir, or continue the earlier run with trainer.resume=auto"
        )
    rewarder = run.rewarder = Rewarder(cfg.reward, a, max_len=cfg.rollout.max_new_tokens, task_verifier=task_verifier)
    # the tools' functions import, their sandbox works; the environment makes one with reset and step
    multiturn.check(cfg, train_set[0], rewarder.verifier_name)
    # every rank checks the same rows (deterministic, seconds), so every rank stops on a failure (and closes the rewarder)
    gold_note = gold.startup_note(train_set + run.eval_set, rewarder.gold_check(), cfg.reward.gold_check, t.seed,
                                  rewarder.gold_unchecked, **rewarder.gold_options)  # fmt: skip
    if distributed.is_main():  # the config as this run uses it (settings resolved), and the device they were resolved for
        (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        settings.record(out, device, resolved, lora_rank=cfg.model.lora.rank)
        sizes = len(train_set), len(run.eval_set)
        for line in startup_summary(cfg, recipe, model_path, *sizes, gold_note, device, resolved, out):
            console.say(line)  # before the models load (minutes, for a big one)
        console.detail(setting_notes[0])  # every resolved setting (settings.json has them too)

    # Model, engine. The engine re-seeds the global RNGs when it starts, so seed after it (a resume restores them).
    stream = run.stream = PromptStream(train_set, t.seed, cfg.data.skip_solved)
    learner = run.learner = Learner.from_config(cfg, model_path)
    engine = run.engine = Engine.from_config(model_path, cfg, max_model_len, lora_rank=adapter_rank)
    run.sampler = multiturn.sampler(engine, cfg, rewarder.verifier_name)  # several turns with rollout.tools / rollout.env
    # vLLM's worker sets torch's float32 matmul precision when it starts ("highest"): the learner's choice again, after it
    torch.set_float32_matmul_precision("high" if t.tf32 else "highest")
    if distributed.is_main():  # as applied, read back
        settings.record_applied(out, {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                                      "sleep_level": engine.memory.level})  # fmt: skip
    # the engine starts from model.path as it loads it: give it the policy the learner computes where that differs (the
    # starting adapter; a bf16 learner's rounded weights beside an engine that is not bf16: rlvr.settings.startup_push)
    if cfg.model.lora.init or settings.startup_push(resolved.precision, resolved.engine_dtype):
        push_weights(engine, learner, sync, out)
    # the engine and the learner hold the same policy here: the gap their kernels leave between them, for later checks
    probe = probe_ids([e.prompt_ids for e in (run.eval_set + train_set)[:PROBE_PROMPTS]], max_model_len - 1)
    run.sync_check = SyncCheck(engine, learner, probe, computes=settings.push_note(resolved, lora_rank=cfg.model.lora.rank))
    seed_everything(t.seed)
    if resume_from is not None:
        run.counters = restore(resume_from, learner, stream, t.seed)
        run.push("the resume's push")
    counters = run.counters
    logger = run.logger = MetricsLogger(
        out,
        max_steps=t.max_steps,
        progress=cfg.logger.progress,
        wandb_project=cfg.logger.project if cfg.logger.wandb else None,
        config=OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True),  # type: ignore[arg-type]
        enabled=distributed.is_main(),
        resume_step=None if resume_from is None else counters["step"],
        wandb_id=counters["wandb_id"],
    )
    counters["wandb_id"] = logger.wandb_id
    run.clock = RunClock(launched, counters["elapsed_s"], counters["train_s"])
    run.sizer = RoundSizer.for_config(a, counters["informative_frac"])
    for note in setting_notes[1:]:  # a resume on another device keeps the settings the run started with
        logger.note(note)
    if sync is not None:
        trained = sum(p.numel() for p in learner.trainable)  # (a DTensor counts its whole tensor)
        logger.note(f"LoRA: rank {cfg.model.lora.rank}, alpha {cfg.model.lora.alpha:g}; {trained:,} trained parameters; "
                    f"the engine follows the adapter {'merged into its weights' if sync == 'merged' else 'as a vLLM LoRA adapter'} "
                    f"(model.lora.sync={sync})")  # fmt: skip
    run.from_engine = pi_old_from_engine(cfg, learner.precision) and not counters["pi_old_fell_back"]
    if run.from_engine:
        logger.note(f"algo.pi_old={a.pi_old.value}: pi_old is the engine's sampled-token logprobs (the learner checks them at evaluations)")
    if resume_from is None:
        eval_metrics, eval_samples = run.evaluate(0)
        # the start-up gap (the sync check's baseline): the engine's and the learner's kernels on the same policy
        logger.log({"step": 0, **run.dropped, **eval_metrics, "sync/gap": run.sync_check.baseline, **run.clock.row()})
        logger.samples(eval_samples)
        warn_if_unreadable("the step-0 evaluation (greedy)", eval_metrics["eval/no_answer_frac"], eval_samples)
    else:
        logger.note(f"resumed from {resume_from} (step {counters['step']})")
    run.loss = loss_options(cfg)
    run.stop = StopSignal()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def push_weights(engine: Engine, learner: Learner, sync: str | None, out: Path) -> None:
    """The learner's policy into the engine: its full weights (sync None: full fine-tuning; "merged": LoRA merged in),
    or its adapter as a peft folder that the engine loads as a new vLLM LoRA adapter (rlvr.lora). A collective."""
    if sync == "adapter":
        folder = learner.save_adapter(out / ENGINE_ADAPTER_FOLDER)  # rank 0 writes it (overwriting the last push's)
        distributed.barrier()  # written before any rank's engine reads it
        engine.load_adapter(folder)
    else:
        engine.load_weights(learner.pushed_weights(engine.dtype))  # in the engine's dtype: a bf16 engine gets half the bytes


ENGINE_ADAPTER_FOLDER = ".engine_adapter"  # in the run folder: the adapter of the last push (model.lora.sync=adapter)


def pi_old_from_engine(cfg: Config, learner_precision: str) -> bool:
    """Whether pi_old's logprobs are the engine's (algo.pi_old). auto: where the engine computes what the learner's
    pass would, up to kernel rounding: its weights in float32, the learner's compute in float32 (learner.precision),
    top_p 1 (the engine's processed logprobs are then log_softmax(logits / T), the learner's definition). On the
    built-in model the two agree within ~1e-5 at every token."""
    r = cfg.rollout
    if cfg.algo.pi_old is PiOld.auto:
        return r.dtype in ("float32", "float") and learner_precision == "float32" and r.top_p == 1.0
    return cfg.algo.pi_old is PiOld.engine


def note_unused_think_tags(run: Run, step_metrics: dict[str, float]) -> None:
    """After step 1: one note when the run expected thinking but nothing thought (rlvr.thinking.unused_tags_note)."""
    r = run.cfg.reward
    tags = (r.think_tags[0], r.think_tags[1])
    vocab: dict[str, int] = getattr(run.engine.tokenizer, "get_added_vocab", dict)()
    expected = r.think is ThinkMode.auto and (tags != thinking.DEFAULT_TAGS or tags[0] in vocab)
    note = thinking.unused_tags_note(tags, expected=expected, prompts_with_blocks=run.think_prompts,
                                     think_mean=step_metrics.get("response_length/think_mean", 0.0))  # fmt: skip
    if note is not None:
        run.logger.note(note)


def warn_if_unreadable(where: str, no_answer_frac: float, rows: list[dict[str, Any]]) -> None:
    """Say so (rank 0, on stderr) when almost no completion has an answer the verifier can read."""
    warning = sample_log.format_warning(where, no_answer_frac, rows)
    if warning is not None and distributed.is_main():
        console.warn(warning)


def startup_summary(cfg: Config, recipe: str | None, model_path: str, train_size: int, eval_size: int, gold_note: str,
                    device: settings.DeviceSpec, resolved: settings.Settings, out: Path) -> list[str]:  # fmt: skip
    """What the run is, in five lines: recipe, model and its size (from its config.json), data (and what the gold
    self-check found: rlvr.gold), device and precision, output folder."""
    a, lora_rank = cfg.algo, cfg.model.lora.rank
    params = settings.model_shape(model_path).num_params
    how = f"a rank-{lora_rank} LoRA adapter trained" if lora_rank else "every weight trained"
    log = "" if cfg.logger.verbose else f" (other libraries' output: {console.LOG_FILE})"
    task = {Task.gym: f"reasoning-gym {cfg.data.name}", Task.file: cfg.data.path,
            Task.code: f"code {cfg.data.name}", Task.calc: "built-in calc (the tool task)"}.get(cfg.data.task, "built-in arithmetic")  # fmt: skip
    world = distributed.world_size()
    return [
        f"rlvr train: {recipe or 'recipe'} | {a.prompts_per_step} prompts x {a.group_size} samples per step, "
        f"{cfg.trainer.max_steps} steps" + (f"; tools {', '.join(cfg.rollout.tools)}, <= {cfg.rollout.max_turns} calls an answer" if cfg.rollout.tools else ""),
        f"  model   {cfg.model.path} ({_count(params)} parameters; {how})",
        f"  data    {task}: {train_size:,} training prompts, {eval_size:,} held out; {gold_note}",
        f"  device  {settings.describe(device)}, {world} rank{'s' if world > 1 else ''}; learner {resolved.precision}, "
        f"engine {resolved.engine_dtype}",
        f"  output  {out}{log}",
    ]


def _count(n: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "") if n < 10 * size else f"{n / size:.0f}{unit}"
    return str(n)
