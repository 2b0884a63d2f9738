"""rlvr.gold, the self-check of the gold answers before any model loads: the seeded, capped sample, the share and the
error that names it, each verifier's verdict on its own gold, and the CLI stopping on a dataset with unreadable golds."""

from __future__ import annotations

import json

import pytest
from conftest import compose_config

from rlvr import gold
from rlvr.config import ConfigError, VerifierName, validate
from rlvr.rewards import Rewarder
from rlvr.types import Example
from rlvr.verifiers import Outcome, arithmetic, countdown, gym


def examples(n: int, bad: dict[int, str] | None = None) -> list[Example]:
    """n rows whose gold is "ok", except those `bad` gives another gold ("unreadable", "boom")."""
    return [Example(f"f.jsonl:{i}", "p", (bad or {}).get(i, "ok")) for i in range(1, n + 1)]


def fake_check_gold(answer: str) -> Outcome:
    """A fake verifier's verdict on its gold: "ok" reads, "boom" makes it raise, anything else is unreadable."""
    if answer == "boom":
        raise ValueError("cannot parse boom")
    return Outcome.CORRECT if answer == "ok" else Outcome.NO_ANSWER


def test_the_sample_is_seeded_capped_and_in_order():
    rows = examples(50)
    assert gold.sample(rows, seed=1, cap=50) == rows  # not more than the cap: every row
    picked = gold.sample(rows, seed=1, cap=10)
    assert picked == gold.sample(rows, seed=1, cap=10) and len(picked) == 10
    assert [rows.index(e) for e in picked] == sorted(rows.index(e) for e in picked)
    assert picked != gold.sample(rows, seed=2, cap=10)
    many = examples(gold.MAX_ROWS + 50, bad={3: "x"})
    result = gold.check(many, fake_check_gold, seed=0)
    assert result.checked == gold.MAX_ROWS and result.sampled
    assert result.correct == gold.MAX_ROWS - len(result.failures)


def test_the_share_counts_correct_golds_and_a_raising_check_is_a_failed_row():
    result = gold.check(examples(20, bad={4: "unreadable", 9: "boom"}), fake_check_gold, seed=0)
    assert (result.checked, result.correct, result.share, result.percent) == (20, 18, 0.9, "90.0%")
    assert result.failures == (("f.jsonl:4", "unreadable", "no_answer"),
                               ("f.jsonl:9", "boom", "error (ValueError: cannot parse boom)"))  # fmt: skip
    assert gold.check(examples(1000, bad={7: "x"}), fake_check_gold, 0).percent == "99.9%"  # rounded down, not 100%
    assert gold.check(examples(10_000, bad={7: "x"}), fake_check_gold, 0).percent == "99.9%"


def test_below_the_threshold_is_a_config_error_naming_the_share_rows_and_keys():
    rows = examples(40, bad={2: "unreadable", 5: "boom", 11: "x", 30: "y"})
    assert gold.require(rows, fake_check_gold, threshold=0.9, seed=0).share == 0.9  # at the threshold: passes
    with pytest.raises(ConfigError) as e:
        gold.require(rows, fake_check_gold, threshold=0.99, seed=0)
    message = str(e.value)
    assert message.startswith("reward.gold_check: 90.0% of 40 gold answers come back correct")
    assert "below the 99.0% required" in message and "4 fail" in message
    assert "f.jsonl:2: gold 'unreadable' -> no_answer" in message and "f.jsonl:5: gold 'boom' -> error" in message
    assert "f.jsonl:11: gold 'x'" in message and "f.jsonl:30" not in message  # three rows named
    for key in ("data.answer_key", "data.answer_extract", "reward.verifier", "reward.gold_check=0"):
        assert key in message


def test_the_start_up_note():
    rows = examples(10)
    assert gold.startup_note(rows, fake_check_gold, 0.99, seed=0) == "gold answers 100.0% readable"
    assert gold.startup_note(rows, None, 0.99, 0) == "gold answers not checked (reward.fn is a user function)"
    unreadable = examples(10, bad={1: "x"})
    assert gold.startup_note(unreadable, fake_check_gold, 0.0, 0) == "gold answers not checked (reward.gold_check=0)"
    note = gold.startup_note(examples(gold.MAX_ROWS + 1), fake_check_gold, 0.99, 0)
    assert note == "gold answers 100.0% readable (a sample of 10,000)"


def test_each_verifier_reads_its_own_gold():
    assert arithmetic.check_gold("046") is Outcome.CORRECT and arithmetic.check_gold("-7") is Outcome.CORRECT
    assert arithmetic.check_gold("forty-six") is Outcome.NO_ANSWER and arithmetic.check_gold("4.5") is Outcome.NO_ANSWER
    assert countdown.check_gold("target=24;numbers=3,5,7,1") is Outcome.CORRECT
    for bad in ("target=abc;numbers=1,2", "numbers=1,2", "24"):
        assert countdown.check_gold(bad) is Outcome.NO_ANSWER, bad
    from rlvr.tasks import gym as gym_task

    train, _ = gym_task.examples("gsm_symbolic", size=3, eval_size=1, seed=0, options=None)
    assert gym.check_gold(train[0].answer) is Outcome.CORRECT
    name, options, entry = gym.decode(train[0].answer)
    # reasoning-gym 0.1.25's gsm_symbolic scorer reads "-2" as 2 (r"\b-?\d+"): 2 of its 10,000 golds fail this way
    misread = gym.encode(name, options, {**entry, "answer": "-2"})
    none = gym.encode(name, options, {**entry, "answer": None})  # a dataset that stores no gold (boxnet, rush_hour)
    assert gym.check_gold(misread) is Outcome.INCORRECT and gym.check_gold(none) is None  # no gold to check
    assert gym.check_gold("not a record") is Outcome.NO_ANSWER


def test_the_built_in_arithmetic_task_and_a_gym_task_pass_at_100_percent():
    from rlvr.tasks import arithmetic as arithmetic_task
    from rlvr.tasks import gym as gym_task

    cfg = validate(compose_config("reward.workers=0"))
    cases = [(VerifierName.arithmetic, arithmetic_task.train_examples() + arithmetic_task.eval_examples(1000)),
             (VerifierName.gym, sum(gym_task.examples("chain_sum", size=300, eval_size=50, seed=0, options=None), []))]  # fmt: skip
    for verifier, rows in cases:
        rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=verifier)
        try:
            check = rewarder.gold_check()
            assert check is not None
            result = gold.require(rows, check, threshold=1.0, seed=0)
        finally:
            rewarder.close()
        assert result.percent == "100.0%" and result.checked == len(rows), verifier
        assert result.seconds < 5.0, verifier  # 10,000 arithmetic golds take ~0.02 s
    cfg.reward.fn = "user_rewards:exact"  # a user function: rlvr cannot write its perfect answers
    assert Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic).gold_check() is None


def test_unreadable_golds_stop_start_up_before_any_model_loads(rlvr_cli, tmp_path):
    """A dataset with 1 unreadable gold in 20 (5%), through the CLI: the ConfigError alone, naming the share, the row
    and the keys that fix it; no model was loaded."""
    rows = [{"prompt": f"{a:02d}+{a + 1:02d}=", "answer": f"target={2 * a + 1};numbers={a},{a + 1}"} for a in range(20)]
    rows[6]["answer"] = "target=abc;numbers=1,2"  # line 7
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = rlvr_cli("train", "data=file", f"data.path={data}", "data.eval_size=4", "reward.verifier=countdown",
                      "reward.workers=0", f"trainer.output_dir={out}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ""
    assert result.stderr.startswith("rlvr train: config error: reward.gold_check: 95.0% of 20 gold answers come back")
    for text in ("train.jsonl:7: gold 'target=abc;numbers=1,2' -> no_answer", "data.answer_key", "data.answer_extract",
                 "reward.verifier", "reward.gold_check=0"):  # fmt: skip
        assert text in result.stderr, (text, result.stderr[-2000:])
    log = (out / "rlvr.log").read_text()
    assert "[rlvr] rlvr train: config error: reward.gold_check" in log and "Loading" not in log


def test_math_golds_with_five_percent_unreduced_solutions_stop_with_examples():
    """data=file's default verifier: 19 answers and one whole GSM8K solution left unreduced (data.answer_extract=none
    where it needed hashes) in 20 rows: 95.0%, below 99%, and the error shows that row."""
    from rlvr.verifiers import math as math_verifier

    golds = [str(n) for n in range(19)] + ["Natalia sold 48/2 = 24 clips in May.\n#### 72"]
    examples = [Example(f"train.jsonl:{i + 1}", f"q{i}", g) for i, g in enumerate(golds)]
    with pytest.raises(ConfigError) as error:
        gold.require(examples, math_verifier.check_gold, 0.99, seed=0)
    message = str(error.value)
    assert message.startswith("reward.gold_check: 95.0% of 20 gold answers")
    assert "train.jsonl:20: gold 'Natalia sold 48/2" in message and "-> no_answer" in message
    assert "data.answer_extract" in message and "data.answer_key" in message and "reward.verifier" in message
    assert gold.require(examples[:19], math_verifier.check_gold, 0.99, seed=0).percent == "100.0%"


def test_rows_without_a_gold_are_left_out_of_the_share():
    """A check that says None (a reasoning-gym entry that stores no answer) is neither correct nor a failure."""
    examples = [Example(f"x:{i}", "q", str(i)) for i in range(4)]
    verdicts = {"0": Outcome.CORRECT, "1": None, "2": None, "3": Outcome.INCORRECT}
    result = gold.check(examples, verdicts.__getitem__, seed=0)
    assert (result.checked, result.correct, result.without_gold, result.percent) == (2, 1, 2, "50.0%")
    none = gold.startup_note(examples[1:3], verdicts.__getitem__, 0.99, seed=0)
    assert none == "gold answers not checked (the data stores none: its scorer checks a solution)"
