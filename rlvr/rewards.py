"""Completions -> rewards: the verifier (or the user's function) and weighted user terms, each run in
a pool of worker processes with a per-sample timeout, plus DAPO's overlong shaping. A verifier that is bounded by
construction (the arithmetic one: a length-capped regex and int()) runs in this process instead: no workers to start,
no pickling, microseconds per sample.

Thinking models (rlvr.thinking, reward.think): the verifier reads only the answer after a thinking completion's block
(`grade`); one whose block never closes has no answer (the "no answer" reward, counted in reward/unclosed_think_frac)
and is not sent to the verifier. A user function (reward.fn, reward.terms) gets the same answer text; one with a
`thoughts` parameter also gets the thoughts (None for an answer that did not think).

A sample whose verifier gave up (Outcome.TIMEOUT: its own work budget, or the pool's reward.timeout_s, ran out) gets
the reward.timed_out reward (null: reward.incorrect) and is counted in `verifier/timeouts` and `reward/timeout_frac`;
one whose verifier call raises gets the "no answer" reward and is counted in `verifier/errors`. The run goes on.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlvr import algo, console, thinking
from rlvr.config import AlgoConfig, CodeSandbox, ConfigError, RewardConfig, ThinkMode, VerifierName
from rlvr.types import Completion
from rlvr.verifiers import Outcome, Verdict
from rlvr.verifiers.pool import PoolStats, Result, Scored, VerifierPool, call_with_thoughts, load_function


class Verifier(NamedTuple):
    verify: str  # (completion, answer) -> Outcome, run in the worker pool
    extract: str  # completion -> the answer it read (in-process, bounded): for samples and warnings
    gold: str  # answer -> Outcome: the verdict on a perfect completion for this gold (rlvr.gold's start-up check)
    score: str | None = None  # (completion, answer) -> float in [0, 1]: partial credit (reward.partial)
    extractors: bool = False  # verify / score / extract take the reward.extract list (`extract=` / `extractors=`)
    in_process: bool = False  # bounded by construction: runs here, not in the worker pool (reward.workers ignored)
    judge: str | None = None  # (completion, answer, **reward.code) -> Verdict, run in the pool in place of verify/score
    gold_rows: int | None = None  # golds the start-up check scores at most (a seeded sample); None: rlvr.gold's MAX_ROWS
    gold_threads: int = 1  # threads for that check (a verifier that waits on a sandbox process)


VERIFIERS = {
    VerifierName.arithmetic: Verifier("rlvr.verifiers.arithmetic:verify", "rlvr.verifiers.arithmetic:extract",
                                      "rlvr.verifiers.arithmetic:check_gold", in_process=True),
    VerifierName.math: Verifier("rlvr.verifiers.math:verify", "rlvr.verifiers.math:extract_answer",
                                "rlvr.verifiers.math:check_gold", extractors=True),
    VerifierName.countdown: Verifier("rlvr.verifiers.countdown:verify", "rlvr.verifiers.countdown:extract_expression",
                                     "rlvr.verifiers.countdown:check_gold"),
    VerifierName.gym: Verifier("rlvr.verifiers.gym:verify", "rlvr.verifiers.gym:extract", "rlvr.verifiers.gym:check_gold",
                               score="rlvr.verifiers.gym:score", extractors=True),
    VerifierName.code: Verifier("rlvr.verifiers.code.verifier:verify", "rlvr.verifiers.code.verifier:extract",
                                "rlvr.verifiers.code.verifier:check_gold", score="rlvr.verifiers.code.verifier:score",
                                judge="rlvr.verifiers.code.verifier:judge", gold_rows=256,
                                gold_threads=4),
}


class Scores(NamedTuple):
    """What Rewarder.score gives for n completions."""

    rewards: torch.Tensor  # [n] the reward: the verifier's value, the user's terms, overlong shaping
    correct: torch.Tensor  # [n] 1.0 where the primary verifier said CORRECT, else 0.0
    metrics: dict[str, float]  # reward/* and verifier/* for the log
    results: list[Result]  # the primary verifier's outcome (or score) per completion
    splits: list[thinking.Split]  # what the verifier read of each completion (its answer), and its thoughts


class Rewarder:
    """Scores rollout batches; owns the verifier worker pools (start once, `close` at the end)."""

    def __init__(self, cfg: RewardConfig, algo_cfg: AlgoConfig, *, max_len: int, task_verifier: VerifierName):
        self.cfg, self.algo, self.max_len = cfg, algo_cfg, max_len
        verifier = task_verifier if cfg.verifier is VerifierName.task else cfg.verifier
        self.env_only = verifier is VerifierName.none and cfg.fn is None  # the environment's return is the reward
        # how this task's answers are checked, told to an environment's factory (rlvr.envs): reward.verifier=none still
        # names the task's verifier, which an environment such as math_retry uses itself
        named = task_verifier if cfg.verifier in (VerifierName.task, VerifierName.none) else cfg.verifier
        self.verifier_name = None if named is None else named.value
        self.gold_unchecked = "reward.verifier=none: the environment's return is the reward" if self.env_only else "reward.fn is a user function"
        spec = VERIFIERS[verifier] if cfg.fn is None and not self.env_only else None
        name = cfg.fn if spec is None else verifier.value
        if cfg.partial and (spec is None or spec.score is None):
            raise ConfigError(f"reward.partial=true needs a verifier that gives partial credit (gym, with data=gym); this "
                              f"run's verifier is {name}")  # fmt: skip
        if cfg.extract is not None and (spec is None or not spec.extractors):
            raise ConfigError(f"reward.extract chooses where the math and gym verifiers find the answer; this run's "
                              f"verifier is {name}: set reward.extract=null")  # fmt: skip
        self.think, self.think_tags = cfg.think is ThinkMode.auto, (cfg.think_tags[0], cfg.think_tags[1])
        primary: str | Callable = str(cfg.fn) if spec is None else str(spec.score) if cfg.partial else spec.verify
        if spec is None and not self.env_only:  # a user function with a `thoughts` parameter gets them too
            primary = _with_thoughts(str(cfg.fn), "reward.fn")
        self.details: tuple[str, ...] = ()  # the judge's details, counted in reward/detail/<detail>
        if spec is not None and spec.judge is not None:
            primary = functools.partial(load_function(spec.judge), **_code_options(cfg))
            self.details = importlib.import_module(spec.judge.partition(":")[0]).DETAILS
        self.extract_fn: Callable[[str], str | None] | None = None if spec is None else load_function(spec.extract)
        if spec is not None and cfg.extract is not None:  # the answer extractors (the order breaks ties)
            extract = tuple(e.value for e in cfg.extract)
            primary = functools.partial(load_function(str(primary)), extract=extract)  # pickled to the workers
            self.extract_fn = functools.partial(load_function(spec.extract), extractors=extract)
        self.partial = cfg.partial
        timed_out = cfg.incorrect if cfg.timed_out is None else cfg.timed_out  # reward.timed_out null: as incorrect
        self._values = {Outcome.CORRECT: cfg.correct, Outcome.INCORRECT: cfg.incorrect, Outcome.NO_ANSWER: cfg.no_answer,
                        Outcome.TIMEOUT: timed_out}  # fmt: skip
        # the gold self-check keeps each verifier's own answer form (boxed, answer tag) whatever reward.extract says
        self._gold = None if spec is None else spec.gold
        self.gold_options = {} if spec is None or spec.gold_rows is None else {"cap": spec.gold_rows, "threads": spec.gold_threads}
        # A bad import path fails here, before any model loads.
        self.primary = None if self.env_only else _pool("reward.fn", primary, cfg, in_process=spec is not None and spec.in_process)
        self.terms = [(t.fn, t.weight, _pool(f"reward.terms[{i}].fn", _with_thoughts(t.fn, f"reward.terms[{i}].fn"), cfg))
                      for i, t in enumerate(cfg.terms)]  # fmt: skip
        self.pools = [p for p in [self.primary] if p is not None] + [pool for _, _, pool in self.terms]
        for pool in self.pools:  # the workers import their functions while the models load; the first score waits
            pool.start(wait=False)

    def _unpack(self, scored: list[Scored]) -> tuple[list[Result], dict[str, float]]:
        """A judge's Verdicts as the results the rest of rlvr reads (the outcome; its score with reward.partial) and
        their details as metrics: the share of each detail, and the asserts judged inside the sandbox."""
        if not self.details:
            return [s.outcome if isinstance(s, Verdict) else s for s in scored], {}
        verdicts = [s if isinstance(s, Verdict) else None for s in scored]
        n = max(len(scored), 1)
        metrics = {f"reward/detail/{d}": sum(v is not None and v.detail == d for v in verdicts) / n for d in self.details}
        metrics["reward/detail/inner_checks"] = float(sum(v.inner_checks for v in verdicts if v is not None))
        results: list[Result] = [s if v is None else v.score if self.partial else v.outcome  # type: ignore[misc]
                                 for s, v in zip(scored, verdicts)]  # fmt: skip
        return results, metrics

    def value(self, result: Result) -> float:
        """An Outcome through the reward table; a float score as it is."""
        return self._values[result] if isinstance(result, Outcome) else result

    def is_correct(self, result: Result) -> bool:
        """CORRECT for an Outcome; a positive score from a user function; a full score (1.0) with partial credit."""
        if isinstance(result, Outcome):
            return result is Outcome.CORRECT
        return result >= 1.0 if self.partial else result > 0

    def answered_right(self, completion: Completion, result: Result) -> bool:
        """Whether an answer counts as correct: its episode's success with reward.verifier=none (rlvr.envs), else the
        verifier's result (is_correct)."""
        if self.env_only:
            return completion.episode is not None and completion.episode.success
        return self.is_correct(result)

    def env_results(self, completions: list[Completion]) -> list[Result]:
        """With reward.verifier=none: each episode's return, as the result the rest of rlvr reads (no verifier ran)."""
        return [0.0 if c.episode is None else c.episode.returned for c in completions]

    def gold_check(self) -> Callable[[str], Outcome | None] | None:
        """The verifier's `check_gold` (answer -> the verdict on a perfect completion for it), run in this process by
        rlvr.gold; None for a user reward.fn, whose answers rlvr cannot write."""
        return None if self._gold is None else load_function(self._gold)

    def grade(self, completions: list[Completion], states: list[thinking.State] | None = None) -> list[thinking.Split]:
        """What the verifier reads of each completion (rlvr.thinking: its answer; None when its block never closed) and
        its thoughts, given where each started (its prompt's thinking state; None: no prompt opened a block)."""
        states = states or [thinking.State.ABSENT] * len(completions)
        return [thinking.answer_text(c.text, s, self.think_tags, self.think, c.think_opened_at) for c, s in zip(completions, states, strict=True)]

    def judge(self, texts: list[str | None], answers: list[str], thoughts: list[str | None] | None = None) -> tuple[list[Result], list[str | None]]:
        """The primary verifier's results alone (evaluation), and each answer's detail (one of `details`; None for a
        verifier without details, or an answer its worker did not judge). A text None (a thinking answer whose block
        never closed) is NO_ANSWER, unjudged."""
        scored = self._primary(texts, answers, thoughts)
        return self._unpack(scored)[0], [s.detail if isinstance(s, Verdict) else None for s in scored]

    def extract(self, text: str | None) -> str | None:
        """The answer the verifier reads in an answer text (None: none found, or a user function that does not say)."""
        return None if self.extract_fn is None or text is None else self.extract_fn(text)

    def score(self, completions: list[Completion], answers: list[str], states: list[thinking.State] | None = None) -> Scores:
        """Rewards, correctness, metrics, the primary verifier's results and what it read, for completions (whose prompts
        left them in `states`: rlvr.thinking) and their ground truths."""
        splits = self.grade(completions, states)
        texts, thoughts = [s.answer for s in splits], [s.thoughts for s in splits]
        stats = PoolStats()
        scored: list[Scored] = list(self.env_results(completions)) if self.env_only else self._primary(texts, answers, thoughts, stats)
        results, detail_metrics = self._unpack(scored)
        rewards = torch.tensor([self.value(r) for r in results])  # [n]
        correct = torch.tensor([float(self.answered_right(c, r)) for c, r in zip(completions, results, strict=True)])  # [n]
        if not self.env_only:  # an episode's return adds to the verifier's reward (rlvr.envs)
            rewards = rewards + torch.tensor([0.0 if c.episode is None else c.episode.returned for c in completions])
        # a timeout is every TIMEOUT result: the pool's own (stats.timeouts) and a verifier's that gave up by itself
        timeouts = sum(r is Outcome.TIMEOUT for r in results)
        n = max(len(results), 1)
        metrics = {
            "verifier/timeouts": float(timeouts),
            "verifier/errors": float(stats.errors),
            "reward/no_answer_frac": sum(r is Outcome.NO_ANSWER for r in results) / n,
            "reward/timeout_frac": timeouts / n,
            "reward/unclosed_think_frac": sum(s.unclosed for s in splits) / n,
            **detail_metrics,
        }
        for name, weight, pool in self.terms:
            term_scored, term_stats = _score(pool, texts, answers, thoughts)
            term_results = [r.outcome if isinstance(r, Verdict) else r for r in term_scored]
            term = torch.tensor([self.value(r) for r in term_results])  # [n]
            rewards = rewards + weight * term
            metrics[f"reward/term/{name}"] = term.mean().item()
            metrics["verifier/timeouts"] += sum(r is Outcome.TIMEOUT for r in term_results)
            metrics["verifier/errors"] += term_stats.errors
        if self.algo.overlong_shaping:
            lengths = torch.tensor([c.generated for c in completions], dtype=torch.float32)  # [n] (tool outputs not counted)
            penalty = algo.overlong_penalty(
                lengths, max_len=self.max_len, buffer=self.algo.overlong_buffer_frac * self.max_len,
                factor=self.algo.overlong_factor,
            )  # [n]
            rewards = rewards + penalty
            metrics["reward/overlong_penalty"] = penalty.mean().item()
        return Scores(rewards, correct, metrics, results, splits)

    def _primary(self, texts: list[str | None], answers: list[str], thoughts: list[str | None] | None,
                 stats: PoolStats | None = None) -> list[Scored]:  # fmt: skip
        if self.primary is None:  # reward.verifier=none: nothing to judge (judge's callers read the episodes)
            return [Outcome.NO_ANSWER] * len(texts)
        scored, pool_stats = _score(self.primary, texts, answers, thoughts)
        if stats is not None:
            stats.timeouts, stats.errors = pool_stats.timeouts, pool_stats.errors
        return scored

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def _code_options(cfg: RewardConfig) -> dict:
    """The code verifier's options from reward.code; checks its sandbox first (refusing to start without one unless
    reward.code.sandbox=none, which warns)."""
    from rlvr.verifiers import code

    c = cfg.code
    if c.sandbox is CodeSandbox.none:
        console.warn("rlvr: warning: reward.code.sandbox=none: the model's programs run WITHOUT a sandbox, with your "
                     "rights (only CPU, memory and process limits hold). Use it only where bubblewrap cannot run.")  # fmt: skip
    else:
        try:
            code.check_sandbox()
        except code.SandboxError as e:
            raise ConfigError(f"reward.verifier=code needs a working sandbox: {e}. (reward.code.sandbox=none runs "
                              f"without one, with your rights.)") from None  # fmt: skip
    return {"time_limit_s": c.time_limit_s, "memory_mb": c.memory_mb, "max_wall_s": max(cfg.timeout_s - 0.5, cfg.timeout_s * 0.9),
            "sandbox": c.sandbox is CodeSandbox.bwrap}  # fmt: skip


def _with_thoughts(path: str, key: str) -> str | Callable:
    """A user function by import path; one that takes a `thoughts` argument as the pool calls it with them (a third
    item of each sample). A bad path is left for _pool to name."""
    try:
        takes = "thoughts" in inspect.signature(load_function(path)).parameters
    except (ValueError, TypeError):
        return path
    return functools.partial(call_with_thoughts, path) if takes else path


def _score(pool: VerifierPool, texts: list[str | None], answers: list[str],
           thoughts: list[str | None] | None) -> tuple[list[Scored], PoolStats]:  # fmt: skip
    """The pool's results for the texts that have an answer; NO_ANSWER, unscored, where the text is None (a thinking
    answer whose block never closed). A pool of a function that takes thoughts gets them as each sample's third item."""
    keep = [i for i, t in enumerate(texts) if t is not None]
    with_thoughts = isinstance(pool.fn, functools.partial) and pool.fn.func is call_with_thoughts
    items = [(texts[i], answers[i], *((thoughts[i] if thoughts else None,) if with_thoughts else ())) for i in keep]
    scored, stats = pool.score(items) if items else ([], PoolStats())  # type: ignore[arg-type]
    out: list[Scored] = [Outcome.NO_ANSWER] * len(texts)
    for i, result in zip(keep, scored, strict=True):
        out[i] = result
    return out, stats


def _pool(key: str, fn: str | Callable, cfg: RewardConfig, in_process: bool = False) -> VerifierPool:
    try:
        return VerifierPool(fn, workers=0 if in_process else cfg.workers, timeout_s=cfg.timeout_s)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None

