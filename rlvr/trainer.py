"""The loop, top to bottom: rollout -> verify -> (refill) -> advantages -> updates -> push weights -> checkpoint.

One call of `train` is one run (or the continuation of one: trainer.resume). rlvr.startup builds and checks its parts
(a Run); this module is the loop over them, each step docs/DESIGN.md's "The loop", steps 1-9; rlvr.run_state keeps
what the run carries across steps and restarts (checkpoints, clocks, signals).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from rlvr import algo, checkpoint, distributed
from rlvr.collect import collect, mean_dicts
from rlvr.config import Config, ConfigError
from rlvr.run_state import Part, RunStopped, save_checkpoint, save_model
from rlvr.startup import note_unused_think_tags, start, warn_if_unreadable

# the largest |learner - engine| logprob gap (nats, any response token) at which pi_old may still come from the engine:
# a ratio error of 0.1%, 1/200 of the clip range; fp32 engine and learner differ by ~1e-5 on the built-in model
PI_OLD_ENGINE_TOLERANCE = 1e-3


def train(cfg: Config, recipe: str | None = None) -> Path:
    """Run (or continue) until `cfg.trainer.max_steps` steps; return the output folder. `recipe`: the recipe's name,
    for the start-up summary."""
    run = start(cfg, recipe)  # checked and built (rlvr.startup); a fresh run's step-0 evaluation is logged
    part = Part()  # the part of the step that runs: a failure names it (RunStopped, below)
    try:
        cfg, out, counters, sync, stop = run.cfg, run.out, run.counters, run.sync, run.stop
        learner, engine, rewarder, stream, logger = run.learner, run.engine, run.rewarder, run.stream, run.logger
        clock, sizer, loss = run.clock, run.sizer, run.loss
        a, t = cfg.algo, cfg.trainer

        for step in range(counters["step"] + 1, t.max_steps + 1):
            t_start = time.perf_counter()
            # 1-4. Draw prompts, sample G answers each, verify, and (DAPO) refill until B groups are informative.
            part.now("the rollout (the engine, the tools, the verifiers)", step)
            batch, metrics, train_samples = collect(run.sampler, stream, rewarder, cfg, step, sizer)
            counters["informative_frac"] = sizer.informative_frac
            # the stream's position after drawing
            metrics.update({"data/epoch": stream.epoch, "data/index": stream.index})
            if stream.skip_solved:  # prompts passed over so far, and those that would be now
                metrics["data/skipped_solved"] = stream.skipped
                metrics["data/solved_prompts"] = stream.mastered()
            if step == 1:
                warn_if_unreadable("step 1 (sampled)", metrics["reward/no_answer_frac"], train_samples)
                note_unused_think_tags(run, metrics)  # one note, where thinking was expected and nothing thought
            if cfg.logger.samples_every and step % cfg.logger.samples_every == 0:
                logger.samples(train_samples)
            t_rollout = time.perf_counter()
            if batch is None:
                clock.train_s += t_rollout - t_start
                logger.log({"step": step, "skipped": 1, **metrics, "timing/step_s": t_rollout - t_start, **clock.row()})
                counters["step"] = step  # nothing trained; the next checkpoint carries the stream past these prompts
                continue
            engine.sleep()  # the learner's phases: on a GPU the engine's weights and KV cache leave it (rollout.sleep)

            # 5. Advantages (algo.advantage); overlong filtering removes truncated responses from the loss.
            part.now("the learner's update")
            flops_before = learner.flops
            G = a.group_size
            advantages = algo.advantages(batch.rewards, G, a.advantage.value)  # [N]
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
            # (with a LoRA adapter in the engine too: its gap on real rollouts, beside the push's probe check)
            check = (run.from_engine or sync == "adapter") and evaluating
            learner_old = learner.logprobs(batch) if (several and not run.from_engine) or check else None  # [N, T]
            if learner_old is not None:
                gaps = (learner_old - batch.engine_logprobs).abs() * batch.response_mask  # [N, T]
                metrics["rollout/logprob_mismatch"] = algo.masked_mean(gaps, batch.response_mask).item()
                metrics["rollout/logprob_mismatch_max"] = gaps.max().item()
                if run.from_engine and metrics["rollout/logprob_mismatch_max"] > PI_OLD_ENGINE_TOLERANCE:
                    # e.g. a weight push that did not take: the learner's pass from now on
                    counters["pi_old_fell_back"], run.from_engine = True, False
                    logger.note(
                        f"step {step}: the engine's logprobs differ from the learner's by up to "
                        f"{metrics['rollout/logprob_mismatch_max']:.2e} nats (> {PI_OLD_ENGINE_TOLERANCE:g}); pi_old comes "
                        "from the learner from this step on"
                    )
            old = (batch.engine_logprobs if run.from_engine else learner_old) if several else None  # [N, T]
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
                            options=loss,
                        )
                    )
            t_update = time.perf_counter()
            metrics["perf/learner_gflop"] = (learner.flops - flops_before) / 1e9  # updates and logprob passes (rlvr.flops)
            metrics["perf/learner_gflops_per_s"] = metrics["perf/learner_gflop"] / (t_update - t_rollout)

            # 8. Push the new weights into the engine (its prefix cache is reset there). A sleeping engine wakes its
            # weights, takes the new ones, then wakes its KV cache, into the memory the learner's allocator has just
            # given back.
            part.now("the weight push")
            learner.release_memory()
            metrics.update(run.push(f"step {step}"))  # stops the run here if the engine does not compute the new policy
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
            eval_samples: list[dict[str, Any]] = []
            if evaluating:
                part.now("the evaluation")
                eval_metrics, eval_samples = run.evaluate(step)
                metrics.update(eval_metrics)
            # A non-finite loss or gradient norm skipped that update (learner.update); too many such steps in a row stop
            # the run, and a step with one is never checkpointed, so the last good checkpoint stays the newest.
            bad = sum(m["bad"] for m in update_metrics)
            metrics["actor/bad_updates"] = bad
            counters["bad_in_a_row"] = counters["bad_in_a_row"] + 1 if bad else 0
            logger.log({"step": step, **metrics, **clock.row()})
            logger.samples(eval_samples)
            if counters["bad_in_a_row"] >= t.max_bad_steps:
                newest = checkpoint.newest_intact(out)
                raise RunStopped(
                    f"stopping at step {step}: {counters['bad_in_a_row']} steps in a row had a non-finite loss or gradient norm "
                    f"(trainer.max_bad_steps={t.max_bad_steps}); their updates were skipped. The newest good checkpoint is "
                    f"{newest or 'none (no checkpoint was written yet)'}; check the rewards, lower trainer.lr, or resume "
                    f"from it with trainer.resume=auto",
                    exit_code=3,
                )

            # Checkpoint every save_every steps, at the end, and when a signal asked to stop (every rank agrees on it).
            counters.update(step=step, elapsed_s=clock.elapsed(), train_s=clock.train_s)
            stopping = distributed.any_true(stop.requested is not None)
            part.now("the checkpoint")
            if not bad and (stopping or step == t.max_steps or (t.save_every and step % t.save_every == 0)):
                save_checkpoint(out, counters, learner, stream, t.keep_last)
                logger.note(f"checkpoint: {checkpoint.step_dir(out, step)}")
            if stopping:
                raise RunStopped(
                    f"stopped by {stop.requested or 'a signal on another rank'} after step {step}; newest checkpoint: "
                    f"{checkpoint.latest(out)}; continue with trainer.resume=auto trainer.output_dir={out}",
                    exit_code=130 if stop.requested == "SIGINT" else 143,
                )

        part.now("saving the final model")
        save_model(out, learner, t.max_steps, t.keep_last)  # <out>/model, swapped in whole
        logger.close()
        newest = checkpoint.latest(out)
        logger.note(f"model: {out / 'model'}" + (f"; newest checkpoint: {newest}" if newest else ""))
    except (RunStopped, ConfigError):  # rlvr's own stops, said as they are
        raise
    except Exception as e:  # a part failed (the engine, the verifiers, the learner...): its name, the step, where to go on
        raise part.failed(e, run.out) from e
    finally:
        run.close()  # the verifier workers, the signal handlers, the engine, the process group
    return out


def splittable_groups(groups: int, group_size: int, world_size: int) -> int:
    """The most of `groups` whose rows split evenly over the ranks (each trains on an equal share of every mini-batch).
    Full mini-batches always split (rlvr.ranks.check_world); a last, short one of a step that kept fewer than B groups
    (dynamic sampling) may not, when there are more ranks than G: its leftover groups sit out that update."""
    while groups * group_size % world_size:
        groups -= 1
    return groups
