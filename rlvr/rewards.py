"""Completions -> rewards: the verifier (or the user's function) and weighted user terms, each run in
a pool of worker processes with a per-sample timeout, plus DAPO's overlong shaping. A verifier that is bounded by
construction (the arithmetic one: a length-capped regex and int()) runs in this process instead: no workers to start,
no pickling, microseconds per sample.

A sample whose verifier call times out or raises gets the "no answer" reward and is counted
(`verifier/timeouts`, `verifier/errors`); the run goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlvr import algo
from rlvr.config import AlgoConfig, ConfigError, RewardConfig, VerifierName
from rlvr.types import Completion
from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import Result, VerifierPool, load_function


class Verifier(NamedTuple):
    verify: str  # (completion, answer) -> Outcome, run in the worker pool
    extract: str  # completion -> the answer it read (in-process, bounded): for samples and warnings
    score: str | None = None  # (completion, answer) -> float in [0, 1]: partial credit (reward.partial)
    extractors: bool = False  # verify / score / extract take the reward.extract list (`extract=` / `extractors=`)
    in_process: bool = False  # bounded by construction: runs here, not in the worker pool (reward.workers ignored)


VERIFIERS = {
    VerifierName.arithmetic: Verifier("rlvr.verifiers.arithmetic:verify", "rlvr.verifiers.arithmetic:extract",
                                      in_process=True),
    VerifierName.math: Verifier("rlvr.verifiers.math:verify", "rlvr.verifiers.math:extract_answer", extractors=True),
    VerifierName.countdown: Verifier("rlvr.verifiers.countdown:verify", "rlvr.verifiers.countdown:extract_expression"),
    VerifierName.gym: Verifier("rlvr.verifiers.gym:verify", "rlvr.verifiers.gym:extract", "rlvr.verifiers.gym:score", True),
}


class Rewarder:
    """Scores rollout batches; owns the verifier worker pools (start once, `close` at the end)."""

    def __init__(self, cfg: RewardConfig, algo_cfg: AlgoConfig, *, max_len: int, task_verifier: VerifierName):
        self.cfg, self.algo, self.max_len = cfg, algo_cfg, max_len
        verifier = task_verifier if cfg.verifier is VerifierName.task else cfg.verifier
        spec = VERIFIERS[verifier] if cfg.fn is None else None
        name = cfg.fn if spec is None else verifier.value
        if cfg.partial and (spec is None or spec.score is None):
            raise ConfigError(f"reward.partial=true needs a verifier that gives partial credit (gym, with data=gym); this "
                              f"run's verifier is {name}")  # fmt: skip
        if cfg.extract is not None and (spec is None or not spec.extractors):
            raise ConfigError(f"reward.extract chooses where the math and gym verifiers find the answer; this run's "
                              f"verifier is {name}: set reward.extract=null")  # fmt: skip
        primary: str | Callable = str(cfg.fn) if spec is None else str(spec.score) if cfg.partial else spec.verify
        self.extract_fn: Callable[[str], str | None] | None = None if spec is None else load_function(spec.extract)
        if spec is not None and cfg.extract is not None:  # the answer extractors, in order
            extract = tuple(e.value for e in cfg.extract)
            primary = functools.partial(load_function(str(primary)), extract=extract)  # pickled to the workers
            self.extract_fn = functools.partial(load_function(spec.extract), extractors=extract)
        self.partial = cfg.partial
        # A bad import path fails here, before any model loads.
        self.primary = _pool("reward.fn", primary, cfg, in_process=spec is not None and spec.in_process)
        self.terms = [(t.fn, t.weight, _pool(f"reward.terms[{i}].fn", t.fn, cfg)) for i, t in enumerate(cfg.terms)]
        self.pools = [self.primary] + [pool for _, _, pool in self.terms]
        for pool in self.pools:  # the workers import their functions while the models load; the first score waits
            pool.start(wait=False)

    def value(self, result: Result) -> float:
        """An Outcome through the reward table; a float score as it is."""
        if isinstance(result, Outcome):
            return {Outcome.CORRECT: self.cfg.correct, Outcome.INCORRECT: self.cfg.incorrect,
                    Outcome.NO_ANSWER: self.cfg.no_answer}[result]
        return result

    def is_correct(self, result: Result) -> bool:
        """CORRECT for an Outcome; a positive score from a user function; a full score (1.0) with partial credit."""
        if isinstance(result, Outcome):
            return result is Outcome.CORRECT
        return result >= 1.0 if self.partial else result > 0

    def judge(self, texts: list[str], answers: list[str]) -> list[Result]:
        """The primary verifier's results alone (evaluation)."""
        return self.primary.score(list(zip(texts, answers)))[0]

    def extract(self, text: str) -> str | None:
        """The answer the verifier reads in a completion (None: none found, or a user function that does not say)."""
        return None if self.extract_fn is None else self.extract_fn(text)

    def score(
        self, completions: list[Completion], answers: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], list[Result]]:
        """(rewards [n], correct [n] in {0, 1}, metrics, the primary verifier's results) for completions and their
        ground truths."""
        pairs = [(c.text, a) for c, a in zip(completions, answers)]
        results, stats = self.primary.score(pairs)
        rewards = torch.tensor([self.value(r) for r in results])  # [n]
        correct = torch.tensor([float(self.is_correct(r)) for r in results])  # [n]
        metrics = {
            "verifier/timeouts": float(stats.timeouts),
            "verifier/errors": float(stats.errors),
            "reward/no_answer_frac": sum(r is Outcome.NO_ANSWER for r in results) / max(len(results), 1),
        }
        for name, weight, pool in self.terms:
            term_results, term_stats = pool.score(pairs)
            term = torch.tensor([self.value(r) for r in term_results])  # [n]
            rewards = rewards + weight * term
            metrics[f"reward/term/{name}"] = term.mean().item()
            metrics["verifier/timeouts"] += term_stats.timeouts
            metrics["verifier/errors"] += term_stats.errors
        if self.algo.overlong_shaping:
            lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)  # [n]
            penalty = algo.overlong_penalty(
                lengths, max_len=self.max_len, buffer=self.algo.overlong_buffer_frac * self.max_len,
                factor=self.algo.overlong_factor,
            )  # [n]
            rewards = rewards + penalty
            metrics["reward/overlong_penalty"] = penalty.mean().item()
        return rewards, correct, metrics, results

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def _pool(key: str, fn: str | Callable, cfg: RewardConfig, in_process: bool = False) -> VerifierPool:
    try:
        return VerifierPool(fn, workers=0 if in_process else cfg.workers, timeout_s=cfg.timeout_s)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None

