"""The start-up checks that depend on the number of ranks (torchrun's world): every rank gets whole engines, whole
groups and an equal share of each mini-batch. Start-up, `rlvr eval` and `rlvr plan` ask the same functions."""

from __future__ import annotations

import math

from rlvr.config import Config, ConfigError


def check_world(cfg: Config, world_size: int) -> None:
    """The start-up checks that depend on the number of ranks (torchrun's world), before anything loads."""
    problems = world_problems(cfg, world_size)
    if problems:
        raise ConfigError(problems[0])


def world_problems(cfg: Config, world_size: int) -> list[str]:
    """What stops a run on `world_size` ranks, each saying what to set (`rlvr plan` lists them before GPUs are rented):
    the world splits into whole engines, every engine gets whole groups of an equal share of each round, and every
    rank the same number of rows of each mini-batch (FSDP2's collectives run in lock-step)."""
    a, tp = cfg.algo, cfg.rollout.tensor_parallel_size
    if world_size % tp:
        return [_engines_problem(tp, world_size)]
    problems = []
    engines = world_size // tp
    if a.prompts_per_step % engines:
        fit = -(-a.prompts_per_step // engines) * engines
        problems.append(
            f"with {world_size} ranks ({engines} engines), algo.prompts_per_step ({a.prompts_per_step}) must be a "
            f"multiple of {engines}: each engine samples whole groups of an equal share; set algo.prompts_per_step={fit}"
        )
    rows = a.prompts_per_minibatch * a.group_size
    if rows % world_size:
        step = world_size // math.gcd(a.group_size, world_size)  # prompts per mini-batch must be a multiple of this
        fit = -(-a.prompts_per_minibatch // step) * step
        problems.append(
            f"with {world_size} ranks, a mini-batch of algo.prompts_per_minibatch x algo.group_size = "
            f"{a.prompts_per_minibatch} x {a.group_size} = {rows} rows does not split evenly over the ranks; set "
            f"algo.prompts_per_minibatch={fit} (a multiple of {step}; algo.prompts_per_step must stay a multiple of it)"
        )
    return problems


def check_engines(tensor_parallel_size: int, ranks: int) -> None:
    """Each engine is tensor_parallel_size consecutive ranks: the world must split into whole engines."""
    if ranks % tensor_parallel_size:
        raise ConfigError(_engines_problem(tensor_parallel_size, ranks))


def _engines_problem(tensor_parallel_size: int, ranks: int) -> str:
    return (f"rollout.tensor_parallel_size ({tensor_parallel_size}) must divide the number of ranks ({ranks}); under a "
            "world of one, set rollout.tensor_parallel_size=1 or launch with torchrun")  # fmt: skip
