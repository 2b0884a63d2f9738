"""Every reasoning-gym dataset of the installed version, with its default options, through rlvr's path: generated into
Examples (the answer record encoded and checked by the task), prompted, and its own gold answers scored through the
gym verifier in a worker process (extraction from <answer> tags, the safety check, the dataset's scorer), as training
scores them. A new reasoning-gym version that breaks a dataset turns its own test red, named by the dataset.

Each dataset is one test; a module-wide worker pool scores them all (a worker imports reasoning-gym once)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from rlvr.config import ConfigError
from rlvr.tasks import gym
from rlvr.verifiers import Outcome
from rlvr.verifiers.gym import decode, encode
from rlvr.verifiers.pool import PoolStats, VerifierPool

NEEDS_OPTIONS = {"composite": "mixes other datasets: it needs data.options naming them"}
# datasets that store no gold answer (entry["answer"] is None): their scorers check a proposed solution's validity
NO_REFERENCE = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
# gold answers that the safety check refuses on purpose: an unevaluated Integral(...) is the reward hack it closes
REFUSED_GOLD = {"intermediate_integration": "Integral("}
SIZE, EVAL_SIZE = 2, 3  # small: a few datasets take seconds per entry (knight_swap, futoshiki)


@pytest.fixture(scope="module")
def pool():
    with VerifierPool("rlvr.verifiers.gym:verify", workers=1, timeout_s=60) as p:
        yield p


@pytest.mark.parametrize("name", gym.dataset_names())
def test_dataset_generates_and_scores_its_own_gold_answers(name: str, pool: VerifierPool) -> None:
    if name in NEEDS_OPTIONS:
        with pytest.raises(ConfigError, match=rf"data\.options: invalid options for {name}"):
            gym.examples(name, size=SIZE, eval_size=EVAL_SIZE, seed=0, options={})
        return
    train, held_out = gym.examples(name, size=SIZE, eval_size=EVAL_SIZE, seed=0, options={})
    examples = train + held_out
    assert len(held_out) == EVAL_SIZE and len(train) <= SIZE
    for e in examples:
        _, _, entry = decode(e.answer)
        assert e.prompt == gym.prompt(entry) and e.prompt.endswith(gym.ANSWER_INSTRUCTION)
        assert e.gold == (entry["answer"] if isinstance(entry["answer"], str) else gym.shown_gold(entry["answer"]))
    if name in NO_REFERENCE:
        assert all(decode(e.answer)[2]["answer"] is None for e in examples), f"{name} now stores gold answers"
        assert all(e.gold == gym.NO_GOLD for e in examples)
        return
    results, stats = pool.score([(f"Reasoning...\n<answer>{e.gold}</answer>", e.answer) for e in examples])
    assert stats == PoolStats(), name
    expected = [Outcome.INCORRECT if REFUSED_GOLD.get(name, "\0") in e.gold else Outcome.CORRECT for e in examples]
    assert results == expected, [(e.gold[:60], r) for e, r in zip(examples, results) if r is not Outcome.CORRECT]


def test_gsm_symbolic_entries_keep_their_fractions() -> None:
    """gsm_symbolic's metadata holds Fractions, which JSON cannot: the record carries them tagged and gives them back."""
    train, _ = gym.examples("gsm_symbolic", size=8, eval_size=2, seed=0, options={})
    found = []

    def walk(x):
        if isinstance(x, Fraction):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    for e in train:
        walk(decode(e.answer)[2])
    assert found and all(type(f) is Fraction for f in found)


def test_every_python_and_numpy_value_round_trips_through_the_answer_record() -> None:
    entry = {
        "question": "q", "answer": "a",
        "metadata": {
            "frac": Fraction(3, 7), "set": {1, 2}, "frozen": frozenset({"x"}), "tuple": ((1, 2), (3,)), "dec": Decimal("0.10"),
            "complex": 1 + 2j, "int_keys": {1: "one", (2, 3): "pair"}, "tag_like": {"__tuple__": [1]},
            "np_int": np.int64(5), "np_float": np.float32(0.5), "np_bool": np.bool_(True),
            "np_array": np.arange(6, dtype=np.int16).reshape(2, 3), "nested": [{"f": Fraction(1, 2)}, None, 1.5],
        },
    }  # fmt: skip
    name, options, back = decode(encode("demo", {"k": 1}, entry))
    assert (name, options) == ("demo", {"k": 1})
    meta, want = back["metadata"], entry["metadata"]
    for key in ("frac", "set", "frozen", "tuple", "dec", "complex", "int_keys", "tag_like", "nested"):
        assert meta[key] == want[key] and type(meta[key]) is type(want[key]), key
    for key in ("np_int", "np_float", "np_bool"):
        assert meta[key] == want[key] and meta[key].dtype == want[key].dtype and type(meta[key]) is type(want[key]), key
    assert np.array_equal(meta["np_array"], want["np_array"]) and meta["np_array"].dtype == np.int16
    with pytest.raises(TypeError, match="object cannot be stored"):
        encode("demo", {}, {"question": "q", "answer": object()})
