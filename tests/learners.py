"""Learners for tests, built the way `rlvr train` builds its own: the recipe tree composed with overrides, validated,
its device settings resolved for this machine (rlvr.settings.for_run), then Learner.from_config."""

from __future__ import annotations

from typing import Any

from conftest import compose_config

from rlvr import settings
from rlvr.config import validate
from rlvr.learner import Learner
from rlvr.models import resolve_model_path

# What the learner tests fix (each test adds its own): no lr warmup or schedule, no weight decay, no token budget
# (rows only), sampling temperature 1 (the learner's logprobs are log_softmax of the plain logits)
BASE = ("trainer.warmup_steps=0", "trainer.lr_schedule=constant", "trainer.weight_decay=0.0",
        "trainer.micro_batch_tokens=0", "rollout.temperature=1.0")  # fmt: skip


def learner_config(*overrides: str, world_size: int = 1) -> Any:
    """The run config for `overrides` (after BASE), validated and resolved as rlvr train resolves it."""
    cfg = settings.for_this_machine(validate(compose_config(*BASE, *overrides)), world_size=world_size)
    return cfg


def make_learner(*overrides: str, world_size: int = 1, shard: bool | None = None) -> Learner:
    """A Learner from `overrides` (e.g. "model.dtype=float64", "trainer.micro_batch_rows=4", "algo.kl_coef=0.1")."""
    cfg = learner_config(*overrides, world_size=world_size)
    return Learner.from_config(cfg, resolve_model_path(cfg.model.path), shard=shard)


def lora_overrides(spec: Any) -> list[str]:
    """The overrides that give Learner.from_config the adapter of `spec`, an rlvr.lora.LoraSpec (None: no adapter)."""
    if spec is None:
        return []
    targets = [f"model.lora.target_modules=[{','.join(spec.target_modules)}]"] if spec.target_modules else []
    init = [f"model.lora.init={spec.init}"] if spec.init else []
    return [f"model.lora.rank={spec.rank}", f"model.lora.alpha={spec.alpha}", f"model.lora.dropout={spec.dropout}",
            f"trainer.seed={spec.seed}", *targets, *init]  # fmt: skip
