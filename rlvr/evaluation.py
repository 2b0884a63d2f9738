"""Evaluation on held-out prompts: greedy accuracy and, over eval.n sampled answers per prompt, mean@n and unbiased
pass@k; response lengths (mean, p50, p95; correct vs incorrect), truncation, no-answer and verifier-timeout rates;
for a verifier with details (code), the share of each detail (`eval/detail/<detail>`, `eval/sampled_detail/<detail>`),
as training steps split `reward/detail/<detail>`.

Training's evaluations (trainer.eval_every) and `rlvr eval` (rlvr.eval_command) run this same `evaluate`, so evaluating a
checkpoint reproduces the eval/accuracy its run logged at that step. Under torchrun each engine takes a strided share
of the prompts; the per-prompt results are gathered back into the set's order before anything is summarized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr import distributed, envs, multiturn, sample_log
from rlvr.config import Config
from rlvr.envs import EpisodeRecord
from rlvr.metrics import split_lengths
from rlvr.rewards import Rewarder
from rlvr.types import Completion, Example
from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import Result


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of P(at least one of k answers is correct) from n answers of which c are correct
    (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) so that no binomial
    coefficient is ever formed (they overflow float64 past n ~ 1000)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct answer
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def k_values(n: int) -> list[int]:
    """The k reported for n answers per prompt: 1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


@dataclass(frozen=True)
class Scored:
    """One answer as the summary needs it."""

    correct: bool
    no_answer: bool
    timeout: bool  # the verifier gave up (Outcome.TIMEOUT): neither the model's answer nor its absence was judged
    tokens: int  # the model's own (tool outputs not counted)
    truncated: bool
    detail: str | None = None  # the verifier's detail (code: passed, wrong_answer, timeout, ...); None without one
    calls: int = 0  # tool calls (rollout.tools)
    failed_calls: int = 0  # of them: error, timeout, limit
    unclosed: bool = False  # a thinking answer whose block never closed: no answer (rlvr.thinking)
    episode: EpisodeRecord | None = None  # its environment's episode (rollout.env)


def length_stats(prefix: str, scored: list[Scored]) -> dict[str, float]:
    """Mean, median and 95th percentile (linear interpolation) of the answers' lengths in tokens; the mean over correct
    and over incorrect answers."""
    tokens = np.array([s.tokens for s in scored], dtype=np.float64)
    return {prefix: float(tokens.mean()), f"{prefix}_p50": float(np.percentile(tokens, 50)),
            f"{prefix}_p95": float(np.percentile(tokens, 95)),
            **split_lengths(f"{prefix}_", [s.tokens for s in scored], [s.correct for s in scored])}  # fmt: skip


def rates(prefix: str, scored: list[Scored], details: tuple[str, ...] = ()) -> dict[str, float]:
    """The shares of answers without a readable answer, whose thinking block never closed, whose verifier gave up, and
    cut off at the token limit; and of each of the verifier's `details` (`<prefix>detail/<detail>`)."""
    return {
        f"{prefix}no_answer_frac": sum(s.no_answer for s in scored) / len(scored),
        f"{prefix}unclosed_think_frac": sum(s.unclosed for s in scored) / len(scored),
        f"{prefix}timeout_frac": sum(s.timeout for s in scored) / len(scored),
        f"{prefix}truncated_frac": sum(s.truncated for s in scored) / len(scored),
        **{f"{prefix}detail/{d}": sum(s.detail == d for s in scored) / len(scored) for d in details},
    }


def tool_rates(prefix: str, scored: list[Scored]) -> dict[str, float]:
    """Tool calls per answer and the share of calls that failed (rollout.tools)."""
    calls = sum(s.calls for s in scored)
    return {f"{prefix}tool_calls_per_answer": calls / len(scored),
            f"{prefix}tool_failed_call_frac": sum(s.failed_calls for s in scored) / max(calls, 1)}  # fmt: skip


def env_rates(prefix: str, scored: list[Scored]) -> dict[str, float]:
    """The episodes' turns, returns, successes and errors (rollout.env), as training's env/* (rlvr.envs.metrics)."""
    records = [s.episode for s in scored if s.episode is not None]
    return {k: v for k, v in envs.metrics(prefix, records, 0.0).items() if not k.endswith("step_s")}


def summarize(
    greedy: list[Scored], sampled: list[list[Scored]], details: tuple[str, ...] = (), tools: bool = False
) -> dict[str, float]:
    """The eval/* metrics of a held-out set: `greedy` has one answer per prompt; `sampled` n per prompt, or is empty;
    `details`: the verifier's details, whose shares are split out (rates); with `tools`, the tool-call rates too; with
    episodes (rollout.env), their rates (`eval/env_*`)."""
    episodes = any(s.episode is not None for s in greedy)
    metrics = {
        "eval/accuracy": sum(s.correct for s in greedy) / len(greedy),
        **rates("eval/", greedy, details),
        **length_stats("eval/response_length", greedy),
        **(tool_rates("eval/", greedy) if tools else {}),
        **(env_rates("eval/env_", greedy) if episodes else {}),
    }
    if sampled:
        n = len(sampled[0])
        correct = [sum(s.correct for s in answers) for answers in sampled]  # c per prompt
        metrics[f"eval/mean@{n}"] = sum(correct) / (n * len(sampled))
        for k in k_values(n):
            metrics[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(sampled)
        flat = [s for answers in sampled for s in answers]
        metrics.update(rates("eval/sampled_", flat, details))
        metrics.update(length_stats("eval/sampled_response_length", flat))
        metrics.update(tool_rates("eval/sampled_", flat) if tools else {})
        metrics.update(env_rates("eval/sampled_env_", flat) if episodes else {})
    return metrics


def evaluate(
    engine: multiturn.Sampler, examples: list[Example], rewarder: Rewarder, cfg: Config, step: int | None, *, every_row: bool = False
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The eval/* metrics of `examples` (summarize), and sample records (rlvr.sample_log): with `every_row`, one per
    answer, greedy and sampled, in the set's order; else the first logger.num_samples greedy answers.

    Sampled answers use one seed per prompt, derived from (eval.seed, the prompt's place in the set): the same at
    every step and on any number of engines, so evaluations differ only by the model.
    """
    e, r = cfg.eval, cfg.rollout
    index, engines = distributed.engine_index(r.tensor_parallel_size)
    places = list(range(index, len(examples), engines))
    mine = [examples[i] for i in places]
    prompts = [x.prompt_ids for x in mine]
    episodes = multiturn.episode_args(engine, mine)  # rollout.env: each answer an episode
    greedy = engine.greedy(prompts, max_tokens=r.max_new_tokens, stop=r.stop, **episodes)
    sampled: list[list[Completion]] = []
    if e.n:
        seeds = [int(np.random.SeedSequence([e.seed, i]).generate_state(1)[0]) & 0x7FFFFFFF for i in places]
        sampled = engine.generate(prompts, n=e.n, max_tokens=r.max_new_tokens, temperature=e.temperature,
                                  top_p=e.top_p, seeds=seeds, stop=r.stop, **episodes)  # fmt: skip
    flat = greedy + [c for answers in sampled for c in answers]
    answers = [x.answer for x in mine] + [x.answer for x in mine for _ in range(e.n)]
    splits = rewarder.grade(flat, [x.think for x in mine] + [x.think for x in mine for _ in range(e.n)])  # rlvr.thinking
    results, details = rewarder.judge([s.answer for s in splits], answers, [s.thoughts for s in splits])
    if rewarder.env_only:  # reward.verifier=none: the episodes' returns, no verifier
        results = rewarder.env_results(flat)
    scored = [Scored(rewarder.answered_right(c, res), res is Outcome.NO_ANSWER, res is Outcome.TIMEOUT, c.generated,
                     c.finish_reason == "length", detail, len(c.calls), sum(call.status != "ok" for call in c.calls),
                     split.unclosed, c.episode)
              for c, res, detail, split in zip(flat, results, details, splits)]  # fmt: skip
    local = {"places": places, "greedy": scored[: len(mine)],
             "sampled": [scored[len(mine) + i * e.n : len(mine) + (i + 1) * e.n] for i in range(len(mine))]}  # fmt: skip
    if every_row:
        local["rows"] = _records(step, mine, flat, results, e.n, engine, rewarder)
    shares = distributed.all_gather_objects(local)[:: r.tensor_parallel_size]  # one share per engine
    order = np.argsort([p for share in shares for p in share["places"]], kind="stable")

    def in_order(key: str) -> list[Any]:
        joined = [x for share in shares for x in share[key]]
        return [joined[i] for i in order]

    metrics = summarize(in_order("greedy"), in_order("sampled") if e.n else [], rewarder.details, tools=multiturn.uses_tools(engine))
    if every_row:
        return metrics, [row for rows in in_order("rows") for row in rows]
    n = cfg.logger.num_samples
    rows = sample_log.records("eval", step, mine[:n], greedy[:n], results[:n], [rewarder.value(x) for x in results[:n]],
                           engine.tokenizer, rewarder)  # fmt: skip
    return metrics, rows


def _records(
    step: int | None, examples: list[Example], flat: list[Completion], results: list[Result], n: int, engine: multiturn.Sampler,
    rewarder: Rewarder,
) -> list[list[dict[str, Any]]]:
    """Per prompt: its greedy answer's record ("eval") and its n sampled answers' ("eval_sampled", with "sample")."""
    m = len(examples)
    out = []
    for i, example in enumerate(examples):
        picks = [i] + [m + i * n + j for j in range(n)]
        rows = sample_log.records("eval", step, [example] * len(picks), [flat[p] for p in picks], [results[p] for p in picks],
                               [rewarder.value(results[p]) for p in picks], engine.tokenizer, rewarder)  # fmt: skip
        for j, row in enumerate(rows[1:]):
            row.update(kind="eval_sampled", sample=j)
        out.append(rows)
    return out
