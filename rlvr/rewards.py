"""Completions -> rewards: the verifier (or the user's function) and weighted user terms, each run in
a pool of worker processes with a per-sample timeout, plus DAPO's overlong shaping.

A sample whose verifier call times out or raises gets the "no answer" reward and is counted
(`verifier/timeouts`, `verifier/errors`); the run goes on.
"""

from __future__ import annotations

import torch

from rlvr import algo
from rlvr.config import AlgoConfig, ConfigError, RewardConfig, VerifierName
from rlvr.types import Completion
from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import Result, VerifierPool

VERIFIERS = {
    VerifierName.arithmetic: "rlvr.verifiers.arithmetic:verify",
    VerifierName.math: "rlvr.verifiers.math:verify",
    VerifierName.countdown: "rlvr.verifiers.countdown:verify",
}


class Rewarder:
    """Scores rollout batches; owns the verifier worker pools (start once, `close` at the end)."""

    def __init__(self, cfg: RewardConfig, algo_cfg: AlgoConfig, *, max_len: int, task_verifier: VerifierName):
        self.cfg, self.algo, self.max_len = cfg, algo_cfg, max_len
        verifier = task_verifier if cfg.verifier is VerifierName.task else cfg.verifier
        primary = cfg.fn if cfg.fn is not None else VERIFIERS[verifier]
        # A bad import path fails here, before any model loads.
        self.primary = _pool("reward.fn", primary, cfg)
        self.terms = [(t.fn, t.weight, _pool(f"reward.terms[{i}].fn", t.fn, cfg)) for i, t in enumerate(cfg.terms)]
        self.pools = [self.primary] + [pool for _, _, pool in self.terms]
        for pool in self.pools:
            pool.start()

    def value(self, result: Result) -> float:
        """An Outcome through the reward table; a float score as it is."""
        if isinstance(result, Outcome):
            return {Outcome.CORRECT: self.cfg.correct, Outcome.INCORRECT: self.cfg.incorrect,
                    Outcome.NO_ANSWER: self.cfg.no_answer}[result]
        return result

    def outcomes(self, texts: list[str], answers: list[str]) -> list[bool]:
        """Correct or not, by the primary verifier alone (evaluation)."""
        results, _ = self.primary.score(list(zip(texts, answers)))
        return [_is_correct(r) for r in results]

    def score(
        self, completions: list[Completion], answers: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(rewards [n], correct [n] in {0, 1}, metrics) for completions and their ground truths."""
        pairs = [(c.text, a) for c, a in zip(completions, answers)]
        results, stats = self.primary.score(pairs)
        rewards = torch.tensor([self.value(r) for r in results])  # [n]
        correct = torch.tensor([float(_is_correct(r)) for r in results])  # [n]
        metrics = {"verifier/timeouts": float(stats.timeouts), "verifier/errors": float(stats.errors)}
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
        return rewards, correct, metrics

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def _pool(key: str, fn: str, cfg: RewardConfig) -> VerifierPool:
    try:
        return VerifierPool(fn, workers=cfg.workers, timeout_s=cfg.timeout_s)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def _is_correct(result: Result) -> bool:
    """CORRECT for an Outcome; a positive score for a user function that returns numbers."""
    return result is Outcome.CORRECT if isinstance(result, Outcome) else result > 0
