"""The loop, top to bottom: rollout -> verify -> (refill) -> advantages -> updates -> push weights -> checkpoint.

One call of `train` is one run (or the continuation of one: trainer.resume). Each step follows
docs/DESIGN.md, "The loop", steps 1-9.
"""

from __future__ import annotations

import json
import math
import random
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from omegaconf import OmegaConf

from rlvr import algo, checkpoint, console, distributed, gold, lora, prompts, samples, settings
from rlvr.config import Advantage, Config, ConfigError, PiOld, Task, check_world
from rlvr.data import PromptStream
from rlvr.evaluation import evaluate
from rlvr.learner import Learner
from rlvr.metrics import MetricsLogger
from rlvr.models import is_builtin, resolve_model_path
from rlvr.rewards import Rewarder
from rlvr.rollout import Engine, engine_lora_rank
from rlvr.runs import FINAL_STEP_FILE
from rlvr.sampling import RoundSizer, collect, mean_dicts


class RunStopped(RuntimeError):
    """The run ended early on purpose (a signal, or too many bad steps); `exit_code` is for the shell."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


_runs_started: list[float] = []  # a Hydra sweep runs its jobs one after another in one process


def train(cfg: Config, recipe: str | None = None) -> Path:
    """Run (or continue) until `cfg.trainer.max_steps` steps; return the output folder. `recipe`: the recipe's name,
    for the start-up summary."""
    # the run's clock (time/elapsed_s) starts at its launch: the process's start for the first run in a process
    # (imports included), the call for a sweep's later jobs
    launched = time.time() if _runs_started else None
    _runs_started.append(time.time())
    a, t = cfg.algo, cfg.trainer
    distributed.init()  # torchrun's process group, or a world of one
    check_world(cfg, distributed.world_size())
    out = Path(distributed.broadcast_object(t.output_dir))  # Hydra's timestamped folder may differ per rank: rank 0's

    # Start-up checks, before any model loads: the output folder, the resume point, the device settings, the data and
    # its prompt budget, the reward functions (the verifier workers start here), the verifier on the data's gold answers.
    checkpoint.ensure_writable(out)
    console.log_to(out, distributed.rank())  # other libraries' output: into <out>/rlvr.log from here on
    model_path = resolve_model_path(cfg.model.path)
    lora.check_init(cfg)
    resume_from = checkpoint.resolve_resume(t.resume, out)
    # every `auto` becomes a value for this device and model (rank 0's device); a resume keeps what the run started with
    device = distributed.broadcast_object(settings.DeviceSpec.detect(distributed.local_world_size()))
    cfg, resolved, setting_notes = settings.for_run(cfg, model_path, out if resume_from else None, device=device,
                                                    world_size=distributed.world_size(), builtin=is_builtin(cfg.model.path))  # fmt: skip
    a, t = cfg.algo, cfg.trainer
    sync = lora.sync_mode(cfg)  # LoRA: how the engine follows the adapter (None: full weights); needs the resolved dtype
    adapter_rank = cfg.model.lora.rank if sync == "adapter" else 0
    if adapter_rank:
        engine_lora_rank(adapter_rank)  # vLLM's limit on adapter ranks: a ConfigError now, before any model loads
    torch.set_num_threads(t.torch_threads)  # the engine and the learner take turns on the same cores
    # the token ids the engine and learner will see
    train_set, eval_set, task_verifier, max_model_len, dropped = prompts.load(cfg, model_path, verbose=distributed.is_main())
    if resume_from is None and checkpoint.latest(out) is not None:  # trainer.resume=never over an earlier run
        raise ConfigError(
            f"trainer.resume=never, but {out} already holds checkpoints (newest: {checkpoint.latest(out)}) that this run "
            "would overwrite; choose a new trainer.output_dir, or continue the earlier run with trainer.resume=auto"
        )
    rewarder = Rewarder(cfg.reward, a, max_len=cfg.rollout.max_new_tokens, task_verifier=task_verifier)
    try:  # every rank checks the same rows (deterministic, seconds), so every rank stops on a failure
        gold_note = gold.startup_note(train_set + eval_set, rewarder.gold_check(), cfg.reward.gold_check, t.seed,
                                     **rewarder.gold_options)
    except ConfigError:
        rewarder.close()
        raise
    if distributed.is_main():  # the config as this run uses it (settings resolved), and the device they were resolved for
        (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        settings.record(out, device, resolved)
        for line in startup_summary(cfg, recipe, model_path, len(train_set), len(eval_set), gold_note, device, resolved, out):
            console.say(line)  # before the models load (minutes, for a big one)
        console.detail(setting_notes[0])  # every resolved setting (settings.json has them too)

    # Model, engine. The engine re-seeds the global RNGs when it starts, so seed after it (a resume restores them).
    stream = PromptStream(train_set, t.seed, cfg.data.skip_solved)
    learner = Learner(
        model_path,
        dtype=cfg.model.dtype,
        lr=t.lr,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps,
        lr_schedule=t.lr_schedule.value,
        total_updates=t.max_steps * a.prompts_per_step // a.prompts_per_minibatch * a.epochs,
        grad_clip=t.grad_clip,
        micro_batch_rows=t.micro_batch_rows,
        micro_batch_tokens=t.micro_batch_tokens,
        temperature=cfg.rollout.temperature,  # the learner's logprobs are those of the distribution the engine samples
        with_reference=a.kl_coef > 0,
        precision=t.precision.value,
        activation_checkpointing=t.activation_checkpointing,
        cpu_offload=t.cpu_offload,
        logits_chunk_tokens=t.logits_chunk_tokens,
        tf32=t.tf32,
        lora_spec=lora.LoraSpec.from_config(cfg),
    )
    engine = Engine.from_config(model_path, cfg, max_model_len, lora_rank=adapter_rank)
    push = partial(push_weights, engine, learner, sync, out)
    if cfg.model.lora.init:  # the engine starts from the base: give it the starting adapter
        push()
    seed_everything(t.seed)
    # what a checkpoint carries besides weights and RNGs (elapsed_s, train_s: the clock at that step; pi_old_fell_back:
    # the engine's logprobs strayed from the learner's, pi_old comes from the learner; informative_frac:
    # what dynamic sampling's next round is sized from)
    run: dict[str, Any] = {"step": 0, "bad_in_a_row": 0, "wandb_id": None, "elapsed_s": 0.0, "train_s": 0.0,
                           "informative_frac": None, "pi_old_fell_back": False}  # fmt: skip
    if resume_from is not None:
        run = restore(resume_from, learner, stream, t.seed)
        push()
    logger = MetricsLogger(
        out,
        max_steps=t.max_steps,
        progress=cfg.logger.progress,
        wandb_project=cfg.logger.project if cfg.logger.wandb else None,
        config=OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True),  # type: ignore[arg-type]
        enabled=distributed.is_main(),
        resume_step=None if resume_from is None else run["step"],
        wandb_id=run["wandb_id"],
    )
    run["wandb_id"] = logger.wandb_id
    clock = RunClock(launched, run["elapsed_s"], run["train_s"])
    sizer = RoundSizer.for_config(a, run["informative_frac"])
    for note in setting_notes[1:]:  # a resume on another device keeps the settings the run started with
        logger.note(note)
    if sync is not None:
        trained = sum(p.numel() for p in learner.trainable)  # (a DTensor counts its whole tensor)
        logger.note(f"LoRA: rank {cfg.model.lora.rank}, alpha {cfg.model.lora.alpha:g}; {trained:,} trained parameters; "
                    f"the engine follows the adapter {'merged into its weights' if sync == 'merged' else 'as a vLLM LoRA adapter'} "
                    f"(model.lora.sync={sync})")  # fmt: skip
    from_engine = pi_old_from_engine(cfg, learner.precision) and not run["pi_old_fell_back"]
    if from_engine:
        logger.note(f"algo.pi_old={a.pi_old.value}: pi_old is the engine's sampled-token logprobs (the learner checks them at evaluations)")
    evaluate_now = partial(evaluate, engine, eval_set, rewarder, cfg)
    if resume_from is None:
        eval_metrics, eval_samples = evaluate_now(0)
        logger.log({"step": 0, **dropped, **eval_metrics, **clock.row()})
        logger.samples(eval_samples)
        warn_if_unreadable("the step-0 evaluation (greedy)", eval_metrics["eval/no_answer_frac"], eval_samples)
    else:
        logger.note(f"resumed from {resume_from} (step {run['step']})")
    loss_kwargs = dict(
        ratio=a.ratio.value,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        clip_ratio_c=a.clip_ratio_c,
        aggregation=a.aggregation.value,
        max_len=cfg.rollout.max_new_tokens,
        kl_coef=a.kl_coef,
        kl_estimator=a.kl_estimator.value,
        rollout_correction=a.rollout_correction.value,
        rollout_correction_cap=a.rollout_correction_cap,
    )
    stop = StopSignal()

    for step in range(run["step"] + 1, t.max_steps + 1):
        t_start = time.perf_counter()
        # 1-4. Draw prompts, sample G answers each, verify, and (DAPO) refill until B groups are informative.
        batch, metrics, train_samples = collect(engine, stream, rewarder, cfg, step, sizer)
        run["informative_frac"] = sizer.informative_frac
        metrics.update({"data/epoch": stream.epoch, "data/index": stream.index})  # the stream's position after drawing
        if stream.skip_solved:  # prompts passed over so far, and those that would be now
            metrics["data/skipped_solved"] = stream.skipped
            metrics["data/solved_prompts"] = stream.mastered()
        if step == 1:
            warn_if_unreadable("step 1 (sampled)", metrics["reward/no_answer_frac"], train_samples)
        if cfg.logger.samples_every and step % cfg.logger.samples_every == 0:
            logger.samples(train_samples)
        t_rollout = time.perf_counter()
        if batch is None:
            clock.train_s += t_rollout - t_start
            logger.log({"step": step, "skipped": 1, **metrics, "timing/step_s": t_rollout - t_start, **clock.row()})
            run["step"] = step  # nothing trained; the next checkpoint carries the stream past these prompts
            continue
        engine.sleep()  # the learner's phases: on a GPU the engine's weights and KV cache leave it (rollout.sleep)

        # 5. Group-relative advantages; overlong filtering removes truncated responses from the loss.
        G = a.group_size
        advantages = algo.group_advantages(
            batch.rewards, G, scale_by_std=a.advantage is Advantage.group_norm
        )  # [N]
        mask = batch.response_mask  # [N, T]
        if a.overlong_filter:
            mask = mask * (~batch.truncated)[:, None]

        # 6. pi_old (the weights that sampled the batch) and pi_ref logprobs. With one update per rollout pi_old is
        # pi_theta exactly (None). pi_old comes from the learner's pass or from the engine (algo.pi_old); with the
        # engine's, the learner's pass still runs on evaluation steps, to check that the two agree.
        num_groups = batch.num_rows // G
        minibatches = math.ceil(num_groups / a.prompts_per_minibatch)
        evaluating = step == t.max_steps or bool(t.eval_every and step % t.eval_every == 0)
        several = minibatches * a.epochs > 1
        # (a LoRA adapter in the engine is checked the same way at evaluations: nothing else would see a push that did not take)
        check = (from_engine or sync == "adapter") and evaluating
        learner_old = learner.logprobs(batch) if (several and not from_engine) or check else None  # [N, T]
        if learner_old is not None:
            gaps = (learner_old - batch.engine_logprobs).abs() * batch.response_mask  # [N, T]
            metrics["rollout/logprob_mismatch"] = algo.masked_mean(gaps, batch.response_mask).item()
            metrics["rollout/logprob_mismatch_max"] = gaps.max().item()
            if from_engine and metrics["rollout/logprob_mismatch_max"] > PI_OLD_ENGINE_TOLERANCE:
                # e.g. a weight push that did not take: the learner's pass from now on
                run["pi_old_fell_back"], from_engine = True, False
                logger.note(
                    f"step {step}: the engine's logprobs differ from the learner's by up to "
                    f"{metrics['rollout/logprob_mismatch_max']:.2e} nats (> {PI_OLD_ENGINE_TOLERANCE:g}); pi_old comes "
                    "from the learner from this step on"
                )
        old = (batch.engine_logprobs if from_engine else learner_old) if several else None  # [N, T]
        ref = learner.logprobs(batch, reference=True) if a.kl_coef > 0 else None  # [N, T]

        # 7. mu epochs over mini-batches of whole groups, shuffled per epoch: one optimizer update each.
        update_metrics: list[dict[str, float]] = []
        order_rng = torch.Generator().manual_seed(t.seed * 1_000_003 + step)
        for _ in range(a.epochs):
            group_order = torch.randperm(num_groups, generator=order_rng)  # [num_groups]
            for k in range(minibatches):
                groups = group_order[k * a.prompts_per_minibatch : (k + 1) * a.prompts_per_minibatch]
                groups = groups[: splittable_groups(len(groups), G, distributed.world_size())]  # a short last one
                if len(groups) == 0:
                    continue
                rows = (groups[:, None] * G + torch.arange(G)[None, :]).reshape(-1)  # [n]
                update_metrics.append(
                    learner.update(
                        batch.select(rows),
                        advantages[rows],
                        mask[rows],
                        None if old is None else old[rows],
                        None if ref is None else ref[rows],
                        loss_kwargs=loss_kwargs,
                    )
                )
        t_update = time.perf_counter()

        # 8. Push the new weights into the engine (its prefix cache is reset there). A sleeping engine wakes its weights,
        # takes the new ones, then wakes its KV cache, into the memory the learner's allocator has just given back.
        learner.release_memory()
        push()
        t_sync = time.perf_counter()

        # 9. Reference refresh, metrics, evaluation.
        if a.ref_update_every and step % a.ref_update_every == 0:
            learner.refresh_reference()
        metrics.update({f"actor/{k}": v for k, v in mean_dicts(update_metrics).items()})
        metrics["actor/updates"] = len(update_metrics)
        metrics["adv/mean"] = advantages.mean().item()
        metrics["adv/std"] = advantages.std().item() if advantages.numel() > 1 else 0.0
        step_s = time.perf_counter() - t_start
        metrics.update(
            {
                "timing/rollout_s": t_rollout - t_start,
                "timing/update_s": t_update - t_rollout,
                "timing/sync_s": t_sync - t_update,
                "timing/step_s": step_s,
                "perf/tokens_per_s": metrics["perf/generated_tokens"] / step_s,
            }
        )
        clock.train_s += time.perf_counter() - t_start
        eval_samples = []
        if evaluating:
            eval_metrics, eval_samples = evaluate_now(step)
            metrics.update(eval_metrics)
        # A non-finite loss or gradient norm skipped that update (learner.update); too many such steps in a row stop
        # the run, and a step with one is never checkpointed, so the last good checkpoint stays the newest.
        bad = sum(m["bad"] for m in update_metrics)
        metrics["actor/bad_updates"] = bad
        run["bad_in_a_row"] = run["bad_in_a_row"] + 1 if bad else 0
        logger.log({"step": step, **metrics, **clock.row()})
        logger.samples(eval_samples)
        if run["bad_in_a_row"] >= t.max_bad_steps:
            newest = checkpoint.latest(out)
            raise RunStopped(
                f"stopping at step {step}: {run['bad_in_a_row']} steps in a row had a non-finite loss or gradient norm "
                f"(trainer.max_bad_steps={t.max_bad_steps}); their updates were skipped. The newest good checkpoint is "
                f"{newest or 'none (no checkpoint was written yet)'}; check the rewards, lower trainer.lr, or resume "
                f"from it with trainer.resume=auto",
                exit_code=3,
            )

        # Checkpoint every save_every steps, at the end, and when a signal asked to stop (every rank agrees on it).
        run.update(step=step, elapsed_s=clock.elapsed(), train_s=clock.train_s)
        stopping = distributed.any_true(stop.requested is not None)
        if not bad and (stopping or step == t.max_steps or (t.save_every and step % t.save_every == 0)):
            save_checkpoint(out, run, learner, stream, t.keep_last)
            logger.note(f"checkpoint: {checkpoint.step_dir(out, step)}")
        if stopping:
            raise RunStopped(
                f"stopped by {stop.requested or 'a signal on another rank'} after step {step}; newest checkpoint: "
                f"{checkpoint.latest(out)}; continue with trainer.resume=auto trainer.output_dir={out}",
                exit_code=130 if stop.requested == "SIGINT" else 143,
            )

    learner.save(out / "model")
    if distributed.is_main():  # which step these weights are from (`rlvr eval run=` compares it with the checkpoints)
        (out / "model" / FINAL_STEP_FILE).write_text(json.dumps({"step": t.max_steps}) + "\n")
    logger.close()
    newest = checkpoint.latest(out)
    logger.note(f"model: {out / 'model'}" + (f"; newest checkpoint: {newest}" if newest else ""))
    rewarder.close()
    stop.restore()
    engine.close()  # vLLM's shutdown tears down its process groups (and the default one): before ours
    distributed.shutdown()
    return out


def push_weights(engine: Engine, learner: Learner, sync: str | None, out: Path) -> None:
    """The learner's policy into the engine: its full weights (sync None: full fine-tuning; "merged": LoRA merged in),
    or its adapter as a peft folder that the engine loads as a new vLLM LoRA adapter (rlvr.lora). A collective."""
    if sync == "adapter":
        folder = learner.save_adapter(out / ENGINE_ADAPTER_FOLDER)  # rank 0 writes it (overwriting the last push's)
        distributed.barrier()  # written before any rank's engine reads it
        engine.load_adapter(folder)
    else:
        engine.load_weights(learner.named_weights())


ENGINE_ADAPTER_FOLDER = ".engine_adapter"  # in the run folder: the adapter of the last push (model.lora.sync=adapter)


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


# the largest |learner - engine| logprob gap (nats, any response token) at which pi_old may still come from the engine:
# a ratio error of 0.1%, 1/200 of the clip range; fp32 engine and learner differ by ~1e-5 on the built-in model
PI_OLD_ENGINE_TOLERANCE = 1e-3


def pi_old_from_engine(cfg: Config, learner_precision: str) -> bool:
    """Whether pi_old's logprobs are the engine's (algo.pi_old). auto: where the engine computes what the learner's
    pass would, up to kernel rounding: its weights in float32, the learner's compute in float32 (learner.precision),
    top_p 1 (the engine's processed logprobs are then log_softmax(logits / T), the learner's definition). On the
    built-in model the two agree within ~1e-5 at every token."""
    r = cfg.rollout
    if cfg.algo.pi_old is PiOld.auto:
        return r.dtype in ("float32", "float") and learner_precision == "float32" and r.top_p == 1.0
    return cfg.algo.pi_old is PiOld.engine


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
    keys = ("step", "bad_in_a_row", "wandb_id", "elapsed_s", "train_s", "informative_frac", "pi_old_fell_back")
    return {"elapsed_s": 0.0, "train_s": 0.0, "informative_frac": None, "pi_old_fell_back": False,  # absent from older checkpoints
            **{k: state[k] for k in keys if k in state}}


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


def splittable_groups(groups: int, group_size: int, world_size: int) -> int:
    """The most of `groups` whose rows split evenly over the ranks (each trains on an equal share of every mini-batch).
    Full mini-batches always split (rlvr.config.check_world); a last, short one of a step that kept fewer than B groups
    (dynamic sampling) may not, when there are more ranks than G: its leftover groups sit out that update."""
    while groups * group_size % world_size:
        groups -= 1
    return groups


def warn_if_unreadable(where: str, no_answer_frac: float, rows: list[dict[str, Any]]) -> None:
    """Say so (rank 0, on stderr) when almost no completion has an answer the verifier can read."""
    warning = samples.format_warning(where, no_answer_frac, rows)
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
            Task.code: f"code {cfg.data.name}"}.get(cfg.data.task, "built-in arithmetic")  # fmt: skip
    world = distributed.world_size()
    return [
        f"rlvr train: {recipe or 'recipe'} | {a.prompts_per_step} prompts x {a.group_size} samples per step, "
        f"{cfg.trainer.max_steps} steps",
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
