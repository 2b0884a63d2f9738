"""rlvr.tasks.gym + rlvr.verifiers.gym: reasoning-gym datasets as a task and their own scorers as a verifier."""

from __future__ import annotations

import json
import time

import pytest
import reasoning_gym

from rlvr.config import ConfigError
from rlvr.tasks import gym
from rlvr.verifiers import Outcome
from rlvr.verifiers.gym import decode, encode, extract, is_safe, score, verify
from rlvr.verifiers.pool import PoolStats, VerifierPool

C, W, N = Outcome.CORRECT, Outcome.INCORRECT, Outcome.NO_ANSWER
ONE_DIGIT_PAIRS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # only 200 distinct questions


def _gold(example) -> str:
    return decode(example.answer)[2]["answer"]


def _question(example) -> str:
    return decode(example.answer)[2]["question"]


def test_same_seed_same_examples_and_another_seed_others() -> None:
    a = gym.examples("chain_sum", size=50, eval_size=20, seed=3, options={})
    assert a == gym.examples("chain_sum", size=50, eval_size=20, seed=3, options={})
    train, held_out = gym.examples("chain_sum", size=50, eval_size=20, seed=4, options={})
    assert [_question(e) for e in train] != [_question(e) for e in a[0]]
    assert len({e.id for e in train + held_out}) == 70


def test_training_and_held_out_come_from_their_seeds_and_share_no_question() -> None:
    size, eval_size, seed = 400, 150, 7
    train, held_out = gym.examples("chain_sum", size=size, eval_size=eval_size, seed=seed, options=ONE_DIGIT_PAIRS)
    raw_train = reasoning_gym.create_dataset("chain_sum", size=size, seed=seed, **ONE_DIGIT_PAIRS)
    raw_eval = reasoning_gym.create_dataset("chain_sum", size=eval_size, seed=seed + gym.EVAL_SEED_OFFSET, **ONE_DIGIT_PAIRS)
    eval_questions = [raw_eval[i]["question"] for i in range(eval_size)]
    assert [_question(e) for e in held_out] == eval_questions
    kept = [raw_train[i]["question"] for i in range(size) if raw_train[i]["question"] not in set(eval_questions)]
    assert [_question(e) for e in train] == kept
    assert not {_question(e) for e in train} & set(eval_questions)
    dropped = size - len(train)
    assert dropped > 100  # 150 held-out draws from 200 questions: most training draws collide
    assert all(e.prompt == _question(e) + "\n\n" + gym.ANSWER_INSTRUCTION for e in train + held_out)


def test_answers_are_json_and_round_trip_tuples() -> None:
    train, held_out = gym.examples("chain_sum", size=5, eval_size=5, seed=0, options={"max_terms": 3})
    for e in train + held_out:
        record = json.loads(e.answer)
        assert record["dataset"] == "chain_sum" and record["options"] == {"max_terms": 3}
        assert set(record["entry"]) >= {"question", "answer", "metadata"}
    entry = {"question": "q", "answer": "a", "metadata": {"grid": ((1, 2), (3, 4)), "xs": [1, (2,)], "t": (), "n": None}}
    assert decode(encode("rearc", {"k": [1]}, entry)) == ("rearc", {"k": [1]}, entry)
    with pytest.raises(ValueError, match="not a reasoning-gym answer"):
        decode("42")


def test_sizes_and_prompts() -> None:
    train, held_out = gym.examples("chain_sum", size=2000, eval_size=200, seed=0, options=None)  # ~0.2 s
    assert 1990 <= len(train) <= 2000 and len(held_out) == 200  # a few training questions repeat held-out ones
    assert all(e.prompt.endswith(gym.ANSWER_INSTRUCTION) and _question(e) in e.prompt for e in train[:50])


def test_reward_extract_may_read_other_forms() -> None:
    (example,), _ = gym.examples("chain_sum", size=1, eval_size=1, seed=5, options={})
    gold = _gold(example)
    lenient = ("answer_tag", "final_answer_phrase")
    assert verify(f"The answer is {gold}.", example.answer) is N  # the default reads only <answer> tags
    assert verify(f"The answer is {gold}.", example.answer, extract=lenient) is C
    assert score(f"The final answer is {gold}.", example.answer, extract=lenient) == 1.0
    assert extract(f"So the answer is: {gold}", extractors=lenient) == gold


def test_full_score_is_correct_and_a_partial_score_is_not() -> None:
    (example,), _ = gym.examples("chain_sum", size=1, eval_size=1, seed=5, options={})
    gold = _gold(example)
    assert verify(f"Adding up... <answer> {gold} </answer>", example.answer) is C
    assert score(f"<answer>{gold}</answer>", example.answer) == 1.0
    # reasoning-gym's chain_sum scorer gives len(gold) / len(answer) when the gold answer is inside it
    partial = f"<answer>x = {gold}</answer>"
    assert score(partial, example.answer) == pytest.approx(len(gold) / len(f"x = {gold}"))
    assert 0.0 < score(partial, example.answer) < 1.0
    assert verify(partial, example.answer) is W
    assert verify(f"<answer>{int(gold) + 1}</answer>", example.answer) is W


def test_no_tag_is_no_answer_and_the_last_tag_wins() -> None:
    (example,), _ = gym.examples("chain_sum", size=1, eval_size=1, seed=5, options={})
    gold = _gold(example)
    for text in [gold, f"The answer is {gold}.", f"<answer>{gold}", f"{gold}</answer>", "<answer>  </answer>", ""]:
        assert verify(text, example.answer) is N, text
        assert score(text, example.answer) == 0.0
    assert verify(f"<answer>{gold}</answer> no wait <answer>{gold}1</answer>", example.answer) is W
    assert verify(f"<answer>{gold}1</answer> no wait <answer>{gold}</answer>", example.answer) is C
    assert extract("<answer>a<answer>b</answer>") == "b"
    assert extract("<answer>early</answer>" + "x" * 20_000) is None  # only the last 20k characters are read
    start = time.perf_counter()
    extract("<answer>" * 50_000)
    assert time.perf_counter() - start < 5.0  # linear (two rfinds, ~1 ms); a backtracking regex would take minutes


def test_unknown_names_and_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"data\.name: no reasoning-gym dataset 'chain_sums'.*Did you mean: chain_sum"):
        gym.examples("chain_sums", size=1, eval_size=1, seed=0, options={})
    with pytest.raises(ConfigError, match=r"data\.options: chain_sum has no option 'max_term'.*Did you mean 'max_terms'"):
        gym.examples("chain_sum", size=1, eval_size=1, seed=0, options={"max_term": 2})
    with pytest.raises(ConfigError, match=r"data\.options: invalid options for chain_sum.*min_terms must be positive"):
        gym.examples("chain_sum", size=1, eval_size=1, seed=0, options={"min_terms": 0})
    with pytest.raises(ConfigError, match=r"data\.options: seed comes from"):
        gym.examples("chain_sum", size=1, eval_size=1, seed=0, options={"seed": 1})


def test_answers_that_would_run_code_never_reach_the_scorer(tmp_path) -> None:
    # countdown's own scorer hands the answer to sympy's parse_expr, which evals it
    (example,), _ = gym.examples("countdown", size=1, eval_size=1, seed=0, options={})
    marker = tmp_path / "ran"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch() or 0"
    assert verify(f"<answer>{payload}</answer>", example.answer) is W
    assert score(f"<answer>{payload}</answer>", example.answer) == 0.0
    assert not marker.exists()
    assert verify(f"<answer>{_gold(example)}</answer>", example.answer) is C
    for unsafe in ["open('x', 'w')", "().__class__", "[0] * 10**10", "9**9**9**9", "(lambda: 1)()", "x[0]", "f(x)"]:
        assert not is_safe(unsafe), unsafe
    for fine in ["-14282", "[1, 2, 3]", "['a', 'b']", "3*exp(x)/2 + sin(x) + C", "(94*4 - 61) - 6", "Mr. Smith", "x^2 -"]:
        assert is_safe(fine), fine


def test_answers_over_the_length_limit_never_reach_the_scorer() -> None:
    """An answer longer than MAX_ANSWER_CHARS scores 0 even where the dataset's own scorer would give it full marks
    (chain_sum reads the gold number with 10,000 leading zeros as the gold number): the limit, not the scorer, decided."""
    from rlvr.verifiers import gym as gym_verifier

    (example,), _ = gym.examples("chain_sum", size=1, eval_size=1, seed=0, options={})
    name, options, entry = decode(example.answer)
    gold = _gold(example)
    sign, digits = ("-", gold[1:]) if gold.startswith("-") else ("", gold)
    padded = sign + "0" * gym_verifier.MAX_ANSWER_CHARS + digits
    assert gym_verifier.dataset(name, json.dumps(options, sort_keys=True)).score_answer(padded, entry) == 1.0
    assert score(f"<answer>{padded}</answer>", example.answer) == 0.0
    assert score(f"<answer>{gold}</answer>", example.answer) == 1.0


def test_integration_answers_cannot_echo_the_integral() -> None:
    # the integration scorers differentiate the answer: `Integral(f, x)` would score 1.0 without any work
    (example,), _ = gym.examples("simple_integration", size=1, eval_size=1, seed=0, options={})
    metadata = decode(example.answer)[2]["metadata"]
    echo = f"<answer>Integral({metadata['integrand']}, {metadata['variable']})</answer>"
    assert verify(echo, example.answer) is W
    assert verify(f"<answer>{_gold(example)}</answer>", example.answer) is C


def test_verify_and_score_run_in_spawned_workers() -> None:
    chain, _ = gym.examples("chain_sum", size=4, eval_size=1, seed=1, options={"max_digits": 2})
    leg, _ = gym.examples("leg_counting", size=4, eval_size=1, seed=1, options={})
    pairs, expected = [], []
    for e in chain + leg:
        gold = _gold(e)
        pairs += [(f"<answer>{gold}</answer>", e.answer), (f"<answer>{gold}0</answer>", e.answer), (gold, e.answer)]
        expected += [C, W, N]
    with VerifierPool("rlvr.verifiers.gym:verify", workers=1, timeout_s=10) as pool:
        assert pool.score(pairs) == (expected, PoolStats())
    with VerifierPool("rlvr.verifiers.gym:score", workers=1, timeout_s=10) as pool:
        results, stats = pool.score(pairs)
    assert stats == PoolStats() and results[0::3] == [1.0] * 8 and results[2::3] == [0.0] * 8
