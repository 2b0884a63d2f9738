"""Any reasoning-gym dataset as a task: `data=gym data.name=chain_sum` (+ the dataset's own data.options).

reasoning-gym (`pip install reasoning-gym`) generates procedural problems offline and scores answers
with each dataset's own `score_answer`. Training entries come from `data.seed`, held-out entries from
`data.seed + EVAL_SEED_OFFSET` (its generators seed item i with seed + i, so the offset keeps the two
index ranges apart); a training entry whose question also appears in the held-out set is dropped, so
`len(train) = size - dropped`.

Each Example's `answer` is compact JSON that carries everything the scorer needs in a worker process
(rlvr.verifiers.gym's `encode` / `decode`): {"dataset": name, "options": {...}, "entry": {question, answer, metadata}}.
Values JSON has no form for (tuples, which arc_agi and rearc compare; gsm_symbolic's Fractions; sets, numpy scalars)
travel tagged, e.g. {"__tuple__": [...]}, and come back as they were. Its `gold` is the entry's answer alone, for
people. The prompt is the question plus `ANSWER_INSTRUCTION`, reasoning-gym's own convention (its default system
prompt asks for `<answer>answer here</answer>`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any

from rlvr.config import ConfigError
from rlvr.types import Example
from rlvr.verifiers.gym import dataset, decode, encode, shown

ANSWER_INSTRUCTION = (
    "Give your final answer in the format <answer>answer here</answer>, "
    "with only the final answer inside the tags."
)
EVAL_SEED_OFFSET = 1_000_000_007  # far beyond any training size: held-out seeds never meet training seeds
_RESERVED = ("size", "seed")  # set from data.size / data.eval_size / data.seed, never from data.options
# the gold shown for datasets that store none (boxnet, graph_color, rush_hour, ...: their scorers check a solution)
NO_GOLD = "(none stored: the dataset's scorer checks the answer)"
_CHECKED_ENTRIES = 8  # held-out entries whose oracle answer is scored as the task made them and as a worker will


def examples(
    name: str, *, size: int, eval_size: int, seed: int, options: Mapping[str, Any] | None
) -> tuple[list[Example], list[Example]]:
    """(training, held-out) Examples of reasoning-gym dataset `name`, generated with `options`.

    `options` (None = none) are fields of the dataset's config dataclass. Deterministic in all arguments.
    Training holds `size` entries minus those whose question is also held out (count them as
    `size - len(training)`). ConfigError names `data.name` or `data.options` when the dataset does not
    exist, the options are wrong, or generation fails.
    """
    options = dict(options or {})
    config_cls = _config_class(name)
    _check_options(name, config_cls, options)
    generator, held_out = _generate(name, eval_size, seed + EVAL_SEED_OFFSET, options)
    _, training = _generate(name, size, seed, options)
    _check_scorer(name, options, generator, held_out[:_CHECKED_ENTRIES])
    held_out_questions = {entry["question"] for entry in held_out}
    train = [
        Example(id=f"{name}-train-{i}", prompt=prompt(entry), answer=_encode(name, options, entry), gold=shown_gold(entry["answer"]))
        for i, entry in enumerate(training)
        if entry["question"] not in held_out_questions
    ]
    evals = [
        Example(id=f"{name}-eval-{i}", prompt=prompt(entry), answer=_encode(name, options, entry), gold=shown_gold(entry["answer"]))
        for i, entry in enumerate(held_out)
    ]
    return train, evals


def shown_gold(answer: Any) -> str:
    """An entry's gold answer as samples.jsonl, wandb and the report show it."""
    return NO_GOLD if answer is None else shown(answer)


def prompt(entry: Mapping[str, Any]) -> str:
    """The dataset's question, then the answer-format instruction."""
    return f"{entry['question'].rstrip()}\n\n{ANSWER_INSTRUCTION}"


def dataset_names() -> list[str]:
    """Every registered reasoning-gym dataset name."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _config_class(name: str) -> type:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ConfigError("data.task=gym needs reasoning-gym: pip install reasoning-gym") from None
    if name not in DATASETS:
        names = sorted(DATASETS)
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(f"data.name: no reasoning-gym dataset {name!r}.{hint} Valid names: {', '.join(names)}")
    return DATASETS[name][1]


def _check_options(name: str, config_cls: type, options: dict[str, Any]) -> None:
    reserved = [k for k in _RESERVED if k in options]
    if reserved:
        raise ConfigError(f"data.options: {', '.join(reserved)} comes from data.size / data.eval_size / data.seed")
    valid = [f.name for f in dataclasses.fields(config_cls) if f.name not in _RESERVED]
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"data.options: {name} has no option {key!r}.{hint} Its options: {', '.join(valid) or '(none)'}")
    try:
        json.dumps(options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"data.options: must be plain YAML values (numbers, strings, lists, maps): {e}") from None


def _generate(name: str, n: int, seed: int, options: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """The dataset object and its n entries."""
    import reasoning_gym

    try:
        generator = reasoning_gym.create_dataset(name, size=n, seed=seed, **options)
    except Exception as e:  # the config's validate() asserts, or a TypeError deeper in
        raise ConfigError(f"data.options: invalid options for {name} {options}: {type(e).__name__}: {e}") from None
    try:
        return generator, [generator[i] for i in range(n)]
    except Exception as e:
        raise ConfigError(f"data.options: generating {name} with {options} failed: {type(e).__name__}: {e}") from None


def _encode(name: str, options: dict[str, Any], entry: dict[str, Any]) -> str:
    try:
        return encode(name, options, entry)
    except (TypeError, ValueError) as e:  # no dataset of reasoning-gym 0.1.25 does this (tests/test_gym_catalogue.py)
        raise ConfigError(f"data.name: a {name} entry cannot be stored as an answer record: {e}") from None


def _check_scorer(name: str, options: dict[str, Any], generator: Any, entries: list[dict[str, Any]]) -> None:
    """The oracle answer must score the same in a worker (a size-1 instance, the entry after a JSON round trip)
    as on the generating instance with the original entry."""
    scorer = dataset(name, json.dumps(options, sort_keys=True))
    for entry in entries:
        _, _, stored = decode(_encode(name, options, entry))
        here, there = generator.score_answer(entry["answer"], entry), scorer.score_answer(entry["answer"], stored)
        if here != there:
            raise ConfigError(
                f"data.name: {name}'s scorer gives the reference answer {here} here but {there} in a verifier worker "
                "(its entries do not survive JSON, or it depends on the generated data); it cannot be used"
            )
