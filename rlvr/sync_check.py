"""Sync integrity: after every weight push, the engine must compute what the learner computes.

A push that does not take (dropped, an adapter not applied, an engine woken from sleep without its weights, the
previous step's weights sent again) leaves the engine sampling from a policy the learner no longer has, and nothing
else shows it until the metrics drift. So after every push both score one fixed probe: a token sequence (the first
prompts of the data, up to PROBE_TOKENS and within the engine's context) whose logprobs the engine computes as prompt
logprobs (rlvr.rollout.Engine.prompt_logprobs: its weights and its adapter, temperature 1) and the learner by its own
forward (rlvr.learner.Learner.sequence_logprobs). One prefill and one short forward: 0.9% of a step on the built-in
model on 2 CPU cores (docs/measured/weight_sync.md).

Two rules stop the run (SyncError, exit status 4) before any step trains on the engine's rollouts:
- the gap: the mean |engine - learner| over the probe's tokens past max(FACTOR x baseline, FLOOR), where the
  baseline is that gap at start-up, when both hold the same weights (model.path's; with model.lora.init, after the
  starting adapter's push). Kernel noise sets it: ~1e-6 nats with fp32 on both sides, 0.066 with bf16 on SmolLM2, so
  under bf16 this rule sees garbage weights and large drifts, not one small stale update. A non-finite gap always
  fails; a start-up baseline past START_LIMIT (or not finite) stops the run at start-up.
- a revisit: the engine computes bit for bit what it computed at an earlier check (a prefill of the same weights is
  deterministic) while the learner's logprobs differ from what they were then: the engine went back to weights it
  held before (a push dropped, the previous weights again, an adapter no longer applied: the base of start-up),
  however small the update. A push that left the engine between two policies (part of the weights) is seen by the
  gap rule alone.
The message tells the two apart: a revisit is a push that did not take; an engine whose logprobs moved but that
disagrees got the push and computes another policy from it (the settings that decide what each side computes are
named: trainer.precision, rollout.dtype and what a push sends, rlvr.settings.push_rule), or got part of the weights.
"""

from __future__ import annotations

import hashlib
import math
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
    """The probe, the start-up baseline, the learner's probe logprobs at the last check, and a fingerprint of both
    sides' at every check (the revisit rule)."""

    def __init__(self, engine, learner, probe: list[int], *, computes: str = "") -> None:  # type: ignore[no-untyped-def]
        """Measure the baseline: `engine` and `learner` must hold the same policy now. SyncError if they disagree.
        `computes`: what each side computes in and what a push sends (rlvr.settings.push_note), for the messages."""
        self.engine, self.learner, self.probe, self.computes = engine, learner, probe, computes
        self.last = learner.sequence_logprobs(probe).double()  # [P - 1] the learner's, at the last check
        engine_logprobs = self.last_engine = self._engine_logprobs()  # [P - 1] the engine's, at the last check
        self.seen = {_fingerprint(engine_logprobs): (_fingerprint(self.last), "start-up")}  # engine's -> learner's, where
        self.baseline = self._gap(engine_logprobs, self.last)[0]
        if not self.baseline <= START_LIMIT:  # (NaN included)
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
        """Mean and max |engine - learner| over the probe's tokens, the largest over the ranks (each has its engine); a
        NaN counts as infinitely far (a MAX reduction need not keep a NaN)."""
        diff = torch.nan_to_num((engine - learner).abs(), nan=math.inf)  # [P - 1]
        mean, peak = distributed.all_reduce_max(torch.stack([diff.mean(), diff.max()])).tolist()
        return mean, peak

    def after_push(self, where: str) -> dict[str, float]:
        """Check the engine against the learner after a push (`where`: "step 5", for the messages); the sync/* metrics
        and timing/sync_check_s. A collective. SyncError by either rule of the module docstring."""
        start = time.perf_counter()
        learner, engine = self.learner.sequence_logprobs(self.probe).double(), self._engine_logprobs()  # [P - 1] each
        moved = float((learner - self.last).abs().mean())  # how far this push had to move the engine
        before = self.seen.get(_fingerprint(engine))  # (the learner's fingerprint, where) if the engine was here before
        revisit = before is not None and before[0] != _fingerprint(learner)
        back_to = before[1] if before is not None and revisit else None  # (this rank's engine: the one its message names)
        revisited = distributed.any_true(revisit)
        engine_moved = float((engine - self.last_engine).abs().mean())  # how far the push moved this rank's engine
        self.last, self.last_engine = learner, engine
        self.seen[_fingerprint(engine)] = (_fingerprint(learner), where)
        gap, peak = self._gap(engine, learner)
        if not gap <= self.tolerance or revisited:
            if revisited:  # the engine went back to weights it held before: nothing of this push reached it
                said = (f"It computes bit for bit what it computed at the {back_to} check: " if back_to else
                        "On another rank it computes bit for bit what it computed at an earlier check: ") + "the push did not take. "  # fmt: skip
            else:  # it moved, so the push reached it, but what it computes from the weights it got is not the learner's
                said = (f"The push reached the engine (its logprobs moved by {engine_moved:.3g}), but it computes another "
                        f"policy than the learner{': ' + self.computes if self.computes else ''}; a push that replaced "
                        "only part of the weights looks the same. ")  # fmt: skip
            raise SyncError(
                f"{where}: after the weight push the engine's logprobs differ from the learner's by {gap:.3g} nats a token "
                f"on average (max {peak:.3g}) on a probe of {len(self.probe)} tokens of the data, where the update moved "
                f"the learner's by {moved:.3g}; the tolerance is {self.tolerance:.3g} ({FACTOR:g} x their {self.baseline:.2g} "
                f"at start-up, at least {FLOOR:g}). {said}The engine is not sampling from the policy just trained, so the "
                "run stops before a step trains on its rollouts; the checkpoints written so far are good "
                "(trainer.resume=auto pushes the weights into a new engine)."
            )
        return {"sync/gap": gap, "sync/gap_max": peak, "sync/moved": moved, "timing/sync_check_s": time.perf_counter() - start}


def _fingerprint(logprobs: torch.Tensor) -> bytes:
    """The logprobs' exact bits, hashed (a check's record costs 20 bytes, however long the run)."""
    return hashlib.sha1(logprobs.numpy().tobytes()).digest()
