"""The loop, top to bottom: rollout -> verify -> (refill) -> advantages -> updates -> push weights.

One call of `train` is one run. Each step follows docs/DESIGN.md, "The loop", steps 1-9.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoTokenizer

from rlvr import algo, distributed
from rlvr.config import Advantage, Config, ConfigError, FilterMetric, resolve_model_path
from rlvr.data import PromptStream, load_task
from rlvr.learner import Learner
from rlvr.metrics import MetricsLogger
from rlvr.rewards import Rewarder
from rlvr.rollout import Engine
from rlvr.types import Completion, Example, RolloutBatch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: Config) -> Path:
    """Run `cfg.trainer.max_steps` steps; return the output folder."""
    a, t = cfg.algo, cfg.trainer
    distributed.init()  # torchrun's process group, or a world of one
    check_world(cfg, distributed.world_size())
    out = Path(distributed.broadcast_object(t.output_dir))  # Hydra's timestamped folder may differ per rank: rank 0's
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    torch.set_num_threads(t.torch_threads)  # the engine and the learner take turns on the same cores

    # Data, verifier workers, model, engine. The engine re-seeds the global RNGs when it starts, so seed after it.
    train_set, eval_set, task_verifier = load_task(cfg.data)
    stream = PromptStream(train_set, t.seed)
    rewarder = Rewarder(cfg.reward, a, max_len=cfg.rollout.max_new_tokens, task_verifier=task_verifier)
    model_path = resolve_model_path(cfg.model.path)
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
        with_reference=a.kl_coef > 0,
        precision=t.precision.value,
        activation_checkpointing=t.activation_checkpointing,
        cpu_offload=t.cpu_offload,
    )
    engine = Engine(
        model_path,
        seed=t.seed,
        max_model_len=_max_model_len(model_path, train_set + eval_set, cfg.rollout.max_new_tokens),
        dtype=cfg.rollout.dtype,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        cpu_kv_cache_gib=cfg.rollout.cpu_kv_cache_gib,
        tensor_parallel_size=cfg.rollout.tensor_parallel_size,
    )
    seed_everything(t.seed)
    logger = MetricsLogger(
        out,
        max_steps=t.max_steps,
        progress=cfg.logger.progress,
        wandb_project=cfg.logger.project if cfg.logger.wandb else None,
        config=OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True),  # type: ignore[arg-type]
        enabled=distributed.is_main(),
    )
    logger.log({"step": 0, **evaluate(engine, eval_set, rewarder, cfg.rollout.max_new_tokens, cfg.rollout.tensor_parallel_size)})
    loss_kwargs = dict(
        ratio=a.ratio.value,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        clip_ratio_c=a.clip_ratio_c,
        aggregation=a.aggregation.value,
        max_len=cfg.rollout.max_new_tokens,
        kl_coef=a.kl_coef,
        kl_estimator=a.kl_estimator.value,
    )

    for step in range(1, t.max_steps + 1):
        t_start = time.perf_counter()
        # 1-4. Draw prompts, sample G answers each, verify, and (DAPO) refill until B groups are informative.
        batch, metrics = collect(engine, stream, rewarder, cfg, step)
        t_rollout = time.perf_counter()
        if batch is None:
            logger.log({"step": step, "skipped": 1, **metrics, "timing/step_s": t_rollout - t_start})
            continue

        # 5. Group-relative advantages; overlong filtering removes truncated responses from the loss.
        G = a.group_size
        advantages = algo.group_advantages(
            batch.rewards, G, scale_by_std=a.advantage is Advantage.group_norm
        )  # [N]
        mask = batch.response_mask  # [N, T]
        if a.overlong_filter:
            mask = mask * (~batch.truncated)[:, None]

        # 6. pi_old and pi_ref logprobs from the learner (pi_old = the weights that sampled the batch).
        num_groups = batch.num_rows // G
        minibatches = math.ceil(num_groups / a.prompts_per_minibatch)
        old = learner.logprobs(batch) if minibatches * a.epochs > 1 else None  # [N, T]
        ref = learner.logprobs(batch, reference=True) if a.kl_coef > 0 else None  # [N, T]

        # 7. mu epochs over mini-batches of whole groups, shuffled per epoch: one optimizer update each.
        update_metrics: list[dict[str, float]] = []
        order_rng = torch.Generator().manual_seed(t.seed * 1_000_003 + step)
        for _ in range(a.epochs):
            group_order = torch.randperm(num_groups, generator=order_rng)  # [num_groups]
            for k in range(minibatches):
                groups = group_order[k * a.prompts_per_minibatch : (k + 1) * a.prompts_per_minibatch]
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

        # 8. Push the new weights into the engine (its prefix cache is reset there).
        engine.load_weights(learner.named_weights())
        t_sync = time.perf_counter()

        # 9. Reference refresh, metrics, evaluation.
        if a.ref_update_every and step % a.ref_update_every == 0:
            learner.refresh_reference()
        metrics.update({f"actor/{k}": v for k, v in _mean_dicts(update_metrics).items()})
        metrics["actor/updates"] = len(update_metrics)
        metrics["adv/mean"] = advantages.mean().item()
        metrics["adv/std"] = advantages.std().item() if advantages.numel() > 1 else 0.0
        if old is not None:
            metrics["rollout/logprob_mismatch"] = algo.masked_mean(
                (old - batch.engine_logprobs).abs(), batch.response_mask
            ).item()
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
        if step == t.max_steps or (t.eval_every and step % t.eval_every == 0):
            metrics.update(evaluate(engine, eval_set, rewarder, cfg.rollout.max_new_tokens, cfg.rollout.tensor_parallel_size))
        logger.log({"step": step, **metrics})

    learner.save(out / "model")
    logger.close()
    rewarder.close()
    engine.close()  # vLLM's shutdown tears down its process groups (and the default one): before ours
    distributed.shutdown()
    return out


def check_world(cfg: Config, world_size: int) -> None:
    """Every rank must get whole groups and the same number of rows (FSDP2 collectives run in lock-step)."""
    a, tp = cfg.algo, cfg.rollout.tensor_parallel_size
    if world_size % tp:
        raise ConfigError(f"rollout.tensor_parallel_size ({tp}) must divide the number of ranks ({world_size})")
    if a.prompts_per_step % (world_size // tp) or a.prompts_per_minibatch % world_size:
        raise ConfigError(
            f"with {world_size} ranks, algo.prompts_per_step ({a.prompts_per_step}) must be a multiple of "
            f"{world_size // tp} (ranks / rollout.tensor_parallel_size) and algo.prompts_per_minibatch "
            f"({a.prompts_per_minibatch}) a multiple of {world_size}: each rank generates and trains on whole groups"
        )


def collect(
    engine: Engine, stream: PromptStream, rewarder: Rewarder, cfg: Config, step: int
) -> tuple[RolloutBatch | None, dict[str, float]]:
    """Roll out until B informative groups are kept (or the round cap): steps 1-4 of the loop.

    Without dynamic sampling this is one round of B prompts, all kept. With it, each round draws B
    more prompts; groups whose filter metric is identical across all G are dropped; the kept groups
    are trimmed to exactly B. After `max_gen_batches` rounds the step trains on what was kept, and
    returns None (a skipped step) if nothing was.
    """
    a, r = cfg.algo, cfg.rollout
    G, B = a.group_size, a.prompts_per_step
    tp = r.tensor_parallel_size
    engines = distributed.world_size() // tp  # each engine (tp consecutive ranks) samples its share of the prompts
    share = B // engines
    mine = slice(distributed.rank() // tp * share, (distributed.rank() // tp + 1) * share)
    rounds = 1 if not a.dynamic_sampling else a.max_gen_batches
    kept: list[tuple[list[Completion], torch.Tensor, torch.Tensor]] = []  # per group: completions, rewards, correct
    drawn = generated = zero_spread = 0
    correct_count = 0
    reward_metrics: list[dict[str, float]] = []
    all_rewards: list[torch.Tensor] = []
    lengths: list[int] = []
    truncated = 0
    for round_ in range(rounds):
        if len(kept) >= B:
            break
        examples = stream.take(B)  # the same B on every rank: the stream is seeded alike
        seeds = np.random.SeedSequence([cfg.trainer.seed, step, round_]).generate_state(B).tolist()
        local = engine.generate(
            [e.prompt for e in examples[mine]],
            n=G,
            max_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seeds=[s & 0x7FFFFFFF for s in seeds[mine]],
        )
        local_rewards = rewarder.score([c for g in local for c in g], [ex.answer for ex in examples[mine] for _ in range(G)])
        # every rank gets every engine's groups, in prompt order: from here on all ranks hold the same round
        shares = distributed.all_gather_objects((local, *local_rewards))[::tp]
        groups = [g for part in shares for g in part[0]]
        rewards = torch.cat([part[1] for part in shares])  # [B*G]
        correct = torch.cat([part[2] for part in shares])  # [B*G]
        reward_metrics += [part[3] for part in shares]
        flat = [c for g in groups for c in g]
        metric = correct if a.filter_metric is FilterMetric.correctness else rewards
        informative = algo.informative_groups(metric, G) if a.dynamic_sampling else torch.ones(B, dtype=torch.bool)
        for i in torch.nonzero(informative)[:, 0].tolist():
            kept.append((groups[i], rewards[i * G : (i + 1) * G], correct[i * G : (i + 1) * G]))
        drawn += B
        generated += sum(len(c.token_ids) for c in flat)
        zero_spread += int((~algo.informative_groups(rewards, G)).sum())
        correct_count += int(correct.sum())
        all_rewards.append(rewards)
        lengths += [len(c.token_ids) for c in flat]
        truncated += sum(c.finish_reason == "length" for c in flat)
    kept = kept[:B]
    kept = kept[: len(kept) - len(kept) % distributed.world_size()]  # a short batch still splits evenly over ranks
    sampled_rewards = torch.cat(all_rewards)  # [drawn*G]
    metrics = {
        **_mean_dicts(reward_metrics),
        "reward/mean": sampled_rewards.mean().item(),
        "reward/correct_frac": correct_count / (drawn * G),
        "reward/zero_spread_group_frac": zero_spread / drawn,
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": max(lengths),
        "response_length/truncated_frac": truncated / len(lengths),
        "sampling/rounds": len(all_rewards),
        "sampling/kept_group_frac": len(kept) / drawn,
        "sampling/kept_groups": len(kept),
        "perf/generated_tokens": generated,
    }
    for key in ("verifier/timeouts", "verifier/errors"):  # counts over all rounds, not means
        metrics[key] = sum(m[key] for m in reward_metrics)
    if not kept:
        metrics["skip_reason"] = "no informative group after max_gen_batches rounds"  # type: ignore[assignment]
        return None, metrics
    completions = [c for g, _, _ in kept for c in g]
    batch = RolloutBatch.from_completions(
        completions,
        rewards=torch.cat([rw for _, rw, _ in kept]).tolist(),
        correct=torch.cat([co for _, _, co in kept]).bool().tolist(),
        pad_id=engine.tokenizer.pad_token_id or 0,
    )
    metrics["batch/tokens"] = int(batch.response_mask.sum())
    return batch, metrics


def evaluate(
    engine: Engine, examples: list[Example], rewarder: Rewarder, max_new_tokens: int, tensor_parallel_size: int
) -> dict[str, float]:
    """Greedy accuracy on the held-out set; each engine decodes a strided share of it."""
    engines = distributed.world_size() // tensor_parallel_size
    mine = examples[distributed.rank() // tensor_parallel_size :: engines]
    texts = engine.greedy([e.prompt for e in mine], max_tokens=max_new_tokens)
    hits = sum(rewarder.outcomes(texts, [e.answer for e in mine]))
    correct = sum(distributed.all_gather_objects(hits)[::tensor_parallel_size])
    return {"eval/accuracy": correct / len(examples)}


def _max_model_len(model_path: str, examples: list[Example], max_new_tokens: int) -> int:
    """Longest prompt + max_new_tokens, within the model's context."""
    tok = AutoTokenizer.from_pretrained(model_path)
    longest = max(len(ids) for ids in tok([e.prompt for e in examples], add_special_tokens=True)["input_ids"])
    context = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", longest + max_new_tokens)
    return min(context, longest + max_new_tokens)


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = dicts[0].keys() if dicts else []
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in keys}
