"""The config schema, the recipe files and the CLI's config errors (no model is loaded here)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from conftest import compose_config
from omegaconf import open_dict

from rlvr.cli import check_overrides
from rlvr.config import RECIPES, AlgoConfig, ConfigError, validate

RECIPE_NAMES = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "gmpo"]

# docs/DESIGN.md, "Recipes": the values each recipe must state.
TABLE = {
    "grpo": dict(advantage="group_norm", ratio="token", clip_low=0.2, clip_high=0.2,
                 aggregation="seq_mean_token_mean", kl_coef=0.04, dynamic_sampling=False, overlong_shaping=False),
    "dr_grpo": dict(advantage="group_center", ratio="token", clip_low=0.2, clip_high=0.2,
                    aggregation="seq_mean_token_sum_norm", kl_coef=0.0, dynamic_sampling=False, overlong_shaping=False),
    "dapo": dict(advantage="group_norm", ratio="token", clip_low=0.2, clip_high=0.28,
                 aggregation="token_mean", kl_coef=0.0, dynamic_sampling=True, overlong_shaping=True),
    "gspo": dict(advantage="group_norm", ratio="sequence", clip_low=3e-4, clip_high=4e-4,
                 aggregation="seq_mean_token_mean", kl_coef=0.0, dynamic_sampling=False, overlong_shaping=False),
    # the objectives of docs/guide/recipes.md: each paper's defaults
    "cispo": dict(objective="cispo", advantage="group_norm", ratio="token", clip_low=1.0, clip_high=4.0,
                  aggregation="token_mean", kl_coef=0.0, dynamic_sampling=True, overlong_shaping=True),
    "sapo": dict(objective="sapo", advantage="group_norm", ratio="token", sapo_tau_pos=1.0, sapo_tau_neg=1.05,
                 aggregation="seq_mean_token_mean", kl_coef=0.0, dynamic_sampling=False, overlong_shaping=False),
    "gmpo": dict(objective="gmpo", advantage="group_norm", ratio="token", clip_low=0.4, clip_high=0.4,
                 aggregation="seq_mean_token_mean", kl_coef=0.0, dynamic_sampling=False, overlong_shaping=False),
}
for _name in ("grpo", "dr_grpo", "dapo", "gspo"):
    TABLE[_name]["objective"] = "clip"


compose_cfg = compose_config


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_states_every_algorithm_field(name):
    stated = yaml.safe_load((Path(RECIPES) / "recipe" / f"{name}.yaml").read_text())
    assert set(stated) == {"algo"}
    assert set(stated["algo"]) == {f.name for f in fields(AlgoConfig)}


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_matches_design_table(name):
    cfg = validate(compose_cfg(f"recipe={name}"))
    for key, expected in TABLE[name].items():
        value = getattr(cfg.algo, key)
        assert getattr(value, "value", value) == pytest.approx(expected), (name, key, value)
    # several optimizer updates per rollout batch, or the clip is inert (ratio identically 1)
    assert cfg.algo.prompts_per_step // cfg.algo.prompts_per_minibatch * cfg.algo.epochs > 1


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["recipe=cispo", "algo.clip_ratio_c=3.0"], "algo.clip_ratio_c"),
        (["recipe=gmpo", "algo.ratio=sequence"], "algo.ratio=token"),
        (["recipe=sapo", "algo.sapo_tau_neg=0"], "algo.sapo_tau_pos and algo.sapo_tau_neg"),
        (["recipe=grpo", "algo.clip_low=1.5"], "algo.clip_low"),
        (["recipe=grpo", "algo.objective=ppo"], "clip, cispo, sapo, gmpo"),
        (["recipe=grpo", "algo.advantage=loo"], "group_norm, group_center, rloo, reinforce_pp"),
    ],
)
def test_objective_and_advantage_misuse_is_a_config_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose_cfg(*overrides))


@pytest.mark.parametrize("advantage", ["rloo", "reinforce_pp"])
@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_baselines_combine_with_every_recipe(recipe, advantage):
    assert validate(compose_cfg(f"recipe={recipe}", f"algo.advantage={advantage}")).algo.advantage.value == advantage


def test_missing_recipe_field_is_an_error():
    raw = compose_cfg()
    with open_dict(raw):
        del raw.algo["clip_high"]
    with pytest.raises(ConfigError, match="algo.clip_high"):
        validate(raw)


def test_invalid_enum_names_key_and_choices():
    with pytest.raises(ConfigError, match=r"algo.ratio.*token, sequence, sequence_token"):
        validate(compose_cfg("algo.ratio=tokn"))


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        validate(compose_cfg("trainer.max_steps=abc"))


def test_unknown_key_suggests_the_right_one():
    message = check_overrides(["algo.clip_hgh=0.3"])
    assert message is not None and "algo.clip_hgh" in message and "Did you mean 'algo.clip_high'" in message
    assert "algo.clip_low" in message  # lists the valid keys of the section
    assert check_overrides(["algo.clip_high=0.3", "recipe=grpo", "--cfg", "job", "hydra.run.dir=x"]) is None


@pytest.mark.parametrize(
    "override, key",
    [
        ("algo.overlong_buffer_frac=1.5", "algo.overlong_buffer_frac"),
        ("algo.prompts_per_minibatch=7", "algo.prompts_per_minibatch"),
        ("algo.clip_ratio_c=0.5", "algo.clip_ratio_c"),
        ("algo.group_size=0", "algo.group_size"),
        ("algo.group_size=1", "every advantage is 0"),  # nothing can be learned: a config error, not a silent run
        ("data.prompt_template=no_placeholder", "data.prompt_template"),
        ("reward.extract=[]", "reward.extract"),
        ("reward.extract=[boxed,nope]", "reward.extract"),
        ("data.format=html", "data.format"),
        ("logger.num_samples=0", "logger.num_samples"),
    ],
)
def test_cross_field_checks_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        validate(compose_cfg(override))


def test_cli_unknown_recipe_lists_choices(tmp_path):
    """Fails at composition, before anything heavy loads: checked by the modules imported (-X importtime lists them
    all), not by a wall-clock bound that a loaded machine could break."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlvr", "train", "recipe=nope"], cwd=tmp_path,
                            env=os.environ, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "recipe/nope" in result.stderr
    for name in RECIPE_NAMES:
        assert name in result.stderr
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported and not imported & {"torch", "vllm", "transformers"}


def test_cli_typo_fails_fast_with_suggestion(rlvr_cli, tmp_path):
    result = rlvr_cli("train", "algo.clip_hgh=0.3", cwd=tmp_path)
    assert result.returncode == 2
    assert "algo.clip_hgh" in result.stderr and "algo.clip_high" in result.stderr


def test_cli_bad_enum_fails_before_model_load(rlvr_cli, tmp_path):
    result = rlvr_cli("train", "algo.aggregation=mean", f"trainer.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "algo.aggregation" in result.stderr and "token_mean" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written for a run that never started


def test_cli_prints_composed_config(rlvr_cli, tmp_path):
    result = rlvr_cli("train", "recipe=gspo", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0
    algo = yaml.safe_load(result.stdout)["algo"]
    assert algo["ratio"] == "sequence" and algo["clip_low"] == pytest.approx(3e-4)


def test_cli_help_lists_groups(rlvr_cli, tmp_path):
    result = rlvr_cli("train", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "recipe: cispo, dapo, dr_grpo, gmpo, grpo, gspo, sapo" in result.stdout
    assert "logger: console, wandb" in result.stdout


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_every_recipe_starts_on_1_2_4_8_and_16_ranks(recipe):
    """The torchrun commands of docs/guide/scaling.md: each engine samples whole groups, each rank trains on an equal share of rows."""
    from rlvr.ranks import check_world

    cfg = validate(compose_config(f"recipe={recipe}"))
    for world in (1, 2, 4, 8, 16):
        check_world(cfg, world)
    assert cfg.algo.prompts_per_minibatch * cfg.algo.group_size % 16 == 0


def test_a_world_that_does_not_split_says_what_to_set():
    from rlvr.ranks import check_world

    cfg = validate(compose_config("algo.group_size=6", "algo.prompts_per_minibatch=2", "algo.prompts_per_step=24"))
    check_world(cfg, 4)  # 2 x 6 = 12 rows: 3 per rank
    with pytest.raises(ConfigError, match=r"2 x 6 = 12 rows does not split evenly over the ranks; set algo\.prompts_per_minibatch=4 \(a multiple of 4"):
        check_world(cfg, 8)  # 8 / gcd(6, 8) = 4 prompts make 24 rows, 3 per rank
    with pytest.raises(ConfigError, match=r"algo\.prompts_per_step \(12\) must be a multiple of 8: .* set algo\.prompts_per_step=16"):
        check_world(validate(compose_config("algo.group_size=8", "algo.prompts_per_minibatch=2", "algo.prompts_per_step=12")), 8)
    with pytest.raises(ConfigError, match=r"rollout\.tensor_parallel_size \(3\) must divide the number of ranks \(8\)"):
        check_world(validate(compose_config("rollout.tensor_parallel_size=3")), 8)


def test_the_rows_of_a_short_last_minibatch_are_trimmed_to_split():
    from rlvr.trainer import splittable_groups

    assert [splittable_groups(g, 8, 16) for g in (0, 1, 2, 3, 4)] == [0, 0, 2, 2, 4]  # 8 rows cannot go to 16 ranks
    assert [splittable_groups(g, 8, 2) for g in (1, 3)] == [1, 3]
    assert splittable_groups(5, 6, 4) == 4  # 5 x 6 = 30 rows: 4 groups (24 rows) split over 4 ranks
