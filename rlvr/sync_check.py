"""Sync integrity: after every weight push, the engine must compute what the learner computes.

A push that does not take (dropped, an adapter not applied, an engine woken from sleep without its weights, the
previous step's weights sent again) leaves the engine sampling from a policy the learner no longer has, and nothing
else shows it until the metrics drift. So after every push both score one fixed probe: a token sequence (the first
prompts of the data, up to PROBE_TOKENS and within the engine's context) whose logprobs the engine computes as prompt
logprobs (rlvr.rollout.Engine.prompt_logprobs: its weights and its adapter, temperature 1) and the learner by its own
forward (rlvr.learner.Learner.sequence_logprobs). A prefill of ~100 tokens and one short forward: ~1% of a step on
the built-in model on 2 CPU cores (docs/measured/main_job.md).

The two need not agree exactly (a bf16 engine beside an fp32 learner, other kernels). What they may differ by is
measured at start-up, where both hold the same weights (model.path's; with model.lora.init, after the starting
adapter's push): the baseline, the mean |gap| over the probe's tokens. After a push the mean gap must stay within
max(FACTOR x baseline, FLOOR), and the engine must not compute bit for bit what it did before the push while the
learner's logprobs moved (an update too small to pass the tolerance still changes them: a stale engine is seen at the
first push that did not take, bf16 or not). Either way the run stops (SyncError) before any step trains on the
engine's rollouts. A baseline past START_LIMIT stops the run at start-up: the engine and the learner disagree before
any training.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rlvr import distributed
from rlvr.run_state import RunStopped

PROBE_TOKENS = 128  # the probe's length (at most), from the first prompts of the data
FACTOR = 4.0  # the mean gap a push may leave, as a multiple of the start-up one (kernel noise drifts as the weights move)
FLOOR = 1e-3  # nats: the tolerance's least value (fp32 engine and learner differ by ~1e-6 on the built-in model)
# nats: a start-up gap past this is a disagreement, not noise. Measured on SmolLM2-135M-Instruct on 2 CPU cores (a bf16
# learner): 0.066 (max 0.22) beside a bf16 engine, 0.037 (max 0.16) beside an fp32 one; a mis-loaded model is nats off
START_LIMIT = 0.5
EXIT_CODE = 4  # the shell's exit status for a failed check


class SyncError(RunStopped):
    """The engine does not compute what the learner computes after a push (or at start-up)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=EXIT_CODE)


def probe_ids(prompts: Sequence[Sequence[int]], max_len: int) -> list[int]:
    """The probe: the prompts' token ids one after another, cut to PROBE_TOKENS and to `max_len` (the engine's
    context less the one token it generates)."""
    ids = [t for p in prompts for t in p][: min(PROBE_TOKENS, max_len)]
    if len(ids) < 2:
        raise ValueError(f"the sync probe needs at least 2 tokens, got {len(ids)} (prompts of {[len(p) for p in prompts]} tokens)")
    return ids


class SyncCheck:
    """The probe, the start-up baseline, and both sides' probe logprobs at the last check."""

    def __init__(self, engine, learner, probe: list[int]) -> None:  # type: ignore[no-untyped-def]
        """Measure the baseline: `engine` and `learner` must hold the same policy now. SyncError if they disagree."""
        self.engine, self.learner, self.probe = engine, learner, probe
        self.last = learner.sequence_logprobs(probe).double()  # [P - 1] the learner's, at the last check
        self.last_engine = self._engine_logprobs()  # [P - 1] the engine's
        self.baseline = self._gap(self.last_engine, self.last)[0]
        if self.baseline > START_LIMIT:
            raise SyncError(
                f"at start-up, before any training, the engine's logprobs differ from the learner's by {self.baseline:.3g} "
                f"nats a token on average (> {START_LIMIT:g}) on a probe of {len(probe)} tokens of the data: they do not "
                "compute the same model (a checkpoint vLLM loads differently from transformers? a dtype the model was not "
                "trained in?)"
            )
        self.tolerance = max(FACTOR * self.baseline, FLOOR)

    def _engine_logprobs(self) -> torch.Tensor:
        return torch.tensor(self.engine.prompt_logprobs(self.probe), dtype=torch.float64)  # [P - 1]

    def _gap(self, engine: torch.Tensor, learner: torch.Tensor) -> tuple[float, float]:
        """Mean and max |engine - learner| over the probe's tokens, the largest over the ranks (each has its engine)."""
        diff = (engine - learner).abs()  # [P - 1]
        mean, peak = distributed.all_reduce_max(torch.stack([diff.mean(), diff.max()])).tolist()
        return mean, peak

    def after_push(self, where: str) -> dict[str, float]:
        """Check the engine against the learner after a push (`where`: "step 5", for the message); the sync/* metrics
        and timing/sync_check_s. A collective. SyncError when the mean gap passes the tolerance, or when the engine
        computes bit for bit what it did at the last check while the learner's logprobs moved (the same weights give
        the same prefill: a push that did not take, seen however small the update; a bf16 engine whose weights no
        update changed would need every weight's move to stay within its rounding)."""
        start = time.perf_counter()
        learner, engine = self.learner.sequence_logprobs(self.probe).double(), self._engine_logprobs()  # [P - 1] each
        moved = float((learner - self.last).abs().mean())  # how far this push had to move the engine
        frozen = distributed.any_true(torch.equal(engine, self.last_engine) and not torch.equal(learner, self.last))
        previous, self.last, self.last_engine = self.last, learner, engine
        gap, peak = self._gap(engine, learner)
        if gap > self.tolerance or frozen:
            stale = frozen or self._gap(engine, previous)[0] <= self.tolerance < moved  # (collectives: every rank is here)
            said = "It still computes the policy from before this push: the push did not take. " if stale else ""
            raise SyncError(
                f"{where}: after the weight push the engine's logprobs differ from the learner's by {gap:.3g} nats a token "
                f"on average (max {peak:.3g}) on a probe of {len(self.probe)} tokens of the data, where the update moved "
                f"the learner's by {moved:.3g}; the tolerance is {self.tolerance:.3g} ({FACTOR:g} x their {self.baseline:.2g} "
                f"at start-up, at least {FLOOR:g}). {said}The engine is not sampling from the policy just trained, so the "
                "run stops before a step trains on its rollouts; the checkpoints written so far are good "
                "(trainer.resume=auto pushes the weights into a new engine)."
            )
        return {"sync/gap": gap, "sync/gap_max": peak, "sync/moved": moved, "timing/sync_check_s": time.perf_counter() - start}
