"""Steps 1-4 of the loop: draw prompts, sample G answers each, verify, refill.

Under torchrun every engine (one per rank, or per tensor_parallel_size ranks) samples its share of each round's
prompts and scores it; the shares are then gathered, so every rank holds the same round from there on.

Dynamic sampling keeps B informative groups, all sampled by the current policy. With algo.round_size=fixed every
round draws B prompts, so a step whose informative fraction is p needs about 1/p rounds; with adaptive, a round draws
enough prompts that its informative groups reach the number still needed with probability ~0.9 at the informative
fraction of recent steps (RoundSizer), so one engine call usually suffices and a second one is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlvr import algo, distributed, envs, multiturn, sample_log, thinking
from rlvr.config import AlgoConfig, Config, FilterMetric, RoundSize
from rlvr.data import PromptStream
from rlvr.metrics import split_lengths
from rlvr.rewards import Rewarder
from rlvr.types import Completion, RolloutBatch

Z_90 = 1.2816  # the standard normal's 90% quantile


@dataclass
class RoundSizer:
    """How many prompts a dynamic-sampling round draws (algo.round_size). `informative_frac` is the informative
    fraction of recent steps (an average over steps, halving the weight of each older step; None before the first),
    part of the checkpoint so that a resumed run sizes its rounds as the uninterrupted one."""

    adaptive: bool
    informative_frac: float | None = None

    @classmethod
    def for_config(cls, algo_cfg: AlgoConfig, informative_frac: float | None = None) -> RoundSizer:
        """Adaptive where the recipe asks for it (algo.round_size=adaptive with dynamic sampling), else B per round."""
        return cls(algo_cfg.dynamic_sampling and algo_cfg.round_size is RoundSize.adaptive, informative_frac)

    def prompts(self, need: int, prompts_per_step: int, budget: int) -> int:
        """Prompts for a round that still needs `need` informative groups, at most `budget`. Fixed: B. Adaptive: the
        least n with n p - z sqrt(n p (1 - p)) >= need at p = the recent informative fraction and z = Z_90, so that
        Binomial(n, p) >= need with probability ~0.9 (normal approximation); `need` when nothing is known yet."""
        if need <= 0 or budget <= 0:
            return 0
        if not self.adaptive:
            return min(prompts_per_step, budget)
        if self.informative_frac is None:
            return min(need, budget)
        p = min(max(self.informative_frac, 1e-3), 1.0)
        s = Z_90 * math.sqrt(p * (1.0 - p))
        root = (s + math.sqrt(s * s + 4.0 * p * need)) / (2.0 * p)  # sqrt(n) solving p n - s sqrt(n) - need = 0
        return min(budget, max(need, math.ceil(root * root - 1e-9)))

    def observe(self, informative: int, drawn: int) -> None:
        """One step's informative groups out of the groups drawn (all its rounds)."""
        if drawn:
            frac = informative / drawn
            self.informative_frac = frac if self.informative_frac is None else 0.5 * (self.informative_frac + frac)


def collect(
    engine: multiturn.Sampler, stream: PromptStream, rewarder: Rewarder, cfg: Config, step: int, sizer: RoundSizer | None = None
) -> tuple[RolloutBatch | None, dict[str, float], list[dict[str, Any]]]:
    """Roll out until B informative groups are kept (or the round cap): steps 1-4 of the loop.

    Without dynamic sampling this is one round of B prompts, all kept. With it, each round draws more
    prompts (`sizer`: B each, or adaptive); groups whose filter metric is identical across all G are dropped;
    the kept groups are trimmed to exactly B. After `max_gen_batches` rounds (or max_gen_batches x B prompts) the
    step trains on what was kept, and returns None (a skipped step) if nothing was. Also returns the first round's
    first logger.num_samples completions as sample records (rlvr.sample_log).
    """
    a, r = cfg.algo, cfg.rollout
    G, B = a.group_size, a.prompts_per_step
    tp = r.tensor_parallel_size
    index, engines = distributed.engine_index(tp)  # each engine samples its contiguous share of every round
    rounds = 1 if not a.dynamic_sampling else a.max_gen_batches
    sizer = RoundSizer.for_config(a) if sizer is None else sizer
    estimate = sizer.informative_frac  # what this step's rounds are sized from
    kept: list[tuple[list[Completion], torch.Tensor, torch.Tensor]] = []  # per group: completions, rewards, correct
    drawn = generated = zero_spread = informative_count = 0
    correct_count = 0
    reward_metrics: list[dict[str, float]] = []
    all_rewards: list[torch.Tensor] = []
    lengths: list[int] = []
    length_correct: list[bool] = []  # per sampled completion, beside lengths
    truncated = 0
    first_round: list[dict[str, Any]] = []
    sampled: list[Completion] = []  # every completion of every round (the tool and thinking metrics)
    splits: list[thinking.Split] = []  # what the verifier read of each, beside `sampled`
    tools_s, env_s = multiturn.tool_seconds(engine), multiturn.env_seconds(engine)
    for round_ in range(rounds):
        if len(kept) >= B or drawn >= rounds * B:
            break
        n = sizer.prompts(B - len(kept), B, rounds * B - drawn)
        n = min(-(-n // engines) * engines, rounds * B - drawn)  # whole shares: every engine samples n / engines prompts
        mine = slice(index * n // engines, (index + 1) * n // engines)
        examples = stream.take(n)  # the same n on every rank: the stream is seeded alike
        seeds = np.random.SeedSequence([cfg.trainer.seed, step, round_]).generate_state(n).tolist()
        local = engine.generate(
            [e.prompt_ids for e in examples[mine]],
            n=G,
            max_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seeds=[s & 0x7FFFFFFF for s in seeds[mine]],
            stop=r.stop,
            **multiturn.episode_args(engine, examples[mine]),  # rollout.env: each answer an episode of its own
        )
        scores = rewarder.score([c for g in local for c in g], [ex.answer for ex in examples[mine] for _ in range(G)],
                                [ex.think for ex in examples[mine] for _ in range(G)])  # fmt: skip
        # every rank gets every engine's groups, in prompt order: from here on all ranks hold the same round
        shares = distributed.all_gather_objects((local, scores))[::tp]
        groups = [g for part, _ in shares for g in part]
        rewards = torch.cat([s.rewards for _, s in shares])  # [n*G]
        correct = torch.cat([s.correct for _, s in shares])  # [n*G]
        reward_metrics += [s.metrics for _, s in shares]
        results = [res for _, s in shares for res in s.results]  # [n*G]
        splits += [sp for _, s in shares for sp in s.splits]
        flat = [c for g in groups for c in g]
        stream.record(examples, correct.view(n, G).bool().all(1).tolist())  # data.skip_solved's visit counts
        if round_ == 0:
            k = cfg.logger.num_samples
            shown = [ex for ex in examples for _ in range(G)][:k]
            first_round = sample_log.records("train", step, shown, flat[:k], results[:k], rewards[:k].tolist(),
                                          engine.tokenizer, rewarder)  # fmt: skip
        metric = correct if a.filter_metric is FilterMetric.correctness else rewards
        informative = algo.informative_groups(metric, G)  # [n]
        keep = informative if a.dynamic_sampling else torch.ones(n, dtype=torch.bool)  # [n]
        for i in torch.nonzero(keep)[:, 0].tolist():
            kept.append((groups[i], rewards[i * G : (i + 1) * G], correct[i * G : (i + 1) * G]))
        drawn += n
        informative_count += int(informative.sum())
        generated += sum(c.generated for c in flat)  # the model's tokens (tool outputs not counted)
        sampled += flat
        zero_spread += int((~algo.informative_groups(rewards, G)).sum())
        correct_count += int(correct.sum())
        all_rewards.append(rewards)
        lengths += [c.generated for c in flat]
        length_correct += correct.bool().tolist()
        truncated += sum(c.finish_reason == "length" for c in flat)
    sizer.observe(informative_count, drawn)
    kept = kept[:B]
    kept = kept[: len(kept) - len(kept) % distributed.world_size()]  # a short batch still splits evenly over ranks
    sampled_rewards = torch.cat(all_rewards)  # [drawn*G]
    metrics = {
        **mean_dicts(reward_metrics),
        "reward/mean": sampled_rewards.mean().item(),
        "reward/correct_frac": correct_count / (drawn * G),
        "reward/zero_spread_group_frac": zero_spread / drawn,
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": max(lengths),
        **split_lengths("response_length/", lengths, length_correct),
        "response_length/truncated_frac": truncated / len(lengths),
        **thinking.length_metrics("response_length/", [(c.model_ids, sp) for c, sp in zip(sampled, splits, strict=True)],
                                  lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)),
        "sampling/rounds": len(all_rewards),
        "sampling/generated_groups": drawn,
        "sampling/informative_groups": informative_count,
        "sampling/kept_group_frac": len(kept) / drawn,
        "sampling/kept_groups": len(kept),
        "perf/generated_tokens": generated,
    }
    if multiturn.uses_tools(engine):  # rollout.tools: calls per answer, failures, their time
        metrics.update(multiturn.metrics("tools/", sampled))
        metrics["timing/tools_s"] = multiturn.tool_seconds(engine) - tools_s
    if multiturn.uses_env(engine):  # rollout.env: turns, returns, successes, errors, the environments' time
        metrics.update(envs.metrics("env/", [c.episode for c in sampled if c.episode is not None],
                                    multiturn.env_seconds(engine) - env_s))  # fmt: skip
    if sizer.adaptive and estimate is not None:
        metrics["sampling/informative_frac_estimate"] = estimate
    for key in ("verifier/timeouts", "verifier/errors"):  # counts over all rounds, not means
        metrics[key] = sum(m[key] for m in reward_metrics)
    if not kept:
        metrics["skip_reason"] = "no informative group after max_gen_batches rounds"  # type: ignore[assignment]
        return None, metrics, first_round
    completions = [c for g, _, _ in kept for c in g]
    batch = RolloutBatch.from_completions(
        completions,
        rewards=torch.cat([rw for _, rw, _ in kept]).tolist(),
        correct=torch.cat([co for _, _, co in kept]).bool().tolist(),
        pad_id=engine.tokenizer.pad_token_id or 0,
    )
    metrics["batch/tokens"] = int(batch.response_mask.sum())
    return batch, metrics, first_round


def mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = dicts[0].keys() if dicts else []
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in keys}
