"""What the scripts build their learner from, the way `rlvr train` builds its own (not a script itself).

    from bench_config import run_config, build_learner, loss_options
    cfg = run_config("recipe=dapo", "model.path=/tmp/m", "trainer.lr=1e-6")  # composed, validated, resolved
    learner = build_learner(cfg)                                             # Learner.from_config
    learner.update(batch, advantages, mask, old, None, options=loss_options(cfg))

`run_config` composes the recipe tree with the overrides (Hydra's compose API, rlvr.config.compose_tree; where Hydra is
missing, as on a lent GPU machine that carries only omegaconf, a plain OmegaConf merge of the same files), validates it
(rlvr.config.validate) and resolves every `auto` for this machine (rlvr.settings.for_this_machine, which calls
settings.for_run as rlvr.startup does). A benchmark states only what it measures as overrides; every other setting is
the run's own, so a settings change reaches the benchmarks too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # rlvr from this checkout, even where it is not installed (a lent GPU machine)
    sys.path.insert(0, str(REPO))

RECIPES = REPO / "recipes"
UNUSED_OUTPUT = "trainer.output_dir=/tmp/unused"  # the schema wants one; nothing is written there


def composition() -> str:
    """How compose() composes here: "hydra", or "omegaconf (no hydra)"."""
    try:
        import hydra  # noqa: F401
    except ImportError:
        return "omegaconf (no hydra)"
    return "hydra"


def compose(overrides: list[str]) -> Any:
    """The raw config: recipes/config.yaml composed with `overrides` by Hydra's compose API, as `rlvr train` does; where
    Hydra is not installed, by merging the same files with OmegaConf (the root, then each default's file, or the one an
    override chooses: `# @package _global_` ones at the root, the others under their group), the overrides last."""
    if composition() != "hydra":
        import yaml
        from omegaconf import OmegaConf

        root = OmegaConf.load(RECIPES / "config.yaml")
        defaults = root.pop("defaults")
        merged = OmegaConf.create({k: v for k, v in root.items() if k != "hydra"})
        groups = {k.split("=", 1)[0]: k.split("=", 1)[1] for k in overrides if "=" in k and "." not in k.split("=", 1)[0]}
        for entry in defaults:
            if isinstance(entry, str) or any(str(k).startswith("override ") for k in entry):
                continue
            ((group, name),) = entry.items()
            path = RECIPES / group / f"{groups.get(group, name)}.yaml"
            part = OmegaConf.load(path)
            merged = OmegaConf.merge(merged, part if "@package _global_" in path.read_text() else {group: part})
        for o in overrides:
            key, value = o.split("=", 1)
            if "." in key:  # (a group choice was taken above)
                OmegaConf.update(merged, key, yaml.safe_load(value), force_add=True)  # typed as Hydra types them
        return merged
    from rlvr.config import compose_tree

    return compose_tree("config", list(overrides))


def run_config(*overrides: str, world_size: int = 1) -> Any:
    """The run's Config for `overrides`, validated, with every `auto` resolved for this machine as rlvr train resolves it."""
    from rlvr import settings
    from rlvr.config import validate

    return settings.for_this_machine(validate(compose([UNUSED_OUTPUT, *overrides])), world_size=world_size)


def build_learner(cfg: Any, *, shard: bool | None = None) -> Any:
    """rlvr.learner.Learner.from_config on the config's model, as rlvr.startup builds the run's learner."""
    from rlvr.learner import Learner
    from rlvr.models import resolve_model_path

    return Learner.from_config(cfg, resolve_model_path(cfg.model.path), shard=shard)


def loss_options(cfg: Any) -> Any:
    """The run's loss options (rlvr.algo.LossOptions), as rlvr.startup hands them to learner.update: rlvr.learner's."""
    from rlvr.learner import loss_options as run_loss_options

    return run_loss_options(cfg)


def settings_of(cfg: Any) -> Any:
    """The rlvr.settings.Settings a resolved config holds (each field read from its config key)."""
    from rlvr import settings

    def get(key: str) -> Any:
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        return getattr(node, "value", node)  # an enum's value (trainer.precision)

    return settings.Settings(**{field: get(key) for field, key in settings.Settings.KEYS.items()})
