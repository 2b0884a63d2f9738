"""The reward pipeline: verifier pool + user terms + overlong shaping, and its start-up errors."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_config

from rlvr.config import ConfigError, VerifierName, validate
from rlvr.rewards import Rewarder
from rlvr.types import Completion
from rlvr.verifiers import Outcome


def make_cfg(*overrides: str):
    return validate(compose_config(*overrides))


def completion(text: str, n_tokens: int) -> Completion:
    return Completion(prompt_ids=[1], token_ids=[5] * n_tokens, text=text, finish_reason="stop",
                      engine_logprobs=[0.0] * n_tokens)


def test_verifier_terms_and_overlong_shaping_add_up():
    cfg = make_cfg("recipe=dapo", "reward.workers=1", "reward.incorrect=-1.0",
                   "+reward.terms=[{fn: 'user_rewards:length_score', weight: 0.5}]")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    try:
        # max_len 8, buffer 0.2 * 8 = 1.6: 7 tokens is inside the buffer, 8 is at the limit
        batch = [completion("46", 3), completion("45", 7), completion("x", 8)]
        rewards, correct, m, _, _ = rewarder.score(batch, ["46", "46", "46"])
    finally:
        rewarder.close()
    length_term = torch.tensor([1.0, 1.0, 1 / 2])  # user_rewards.length_score: 1 / (1 + |len diff|)
    verifier = torch.tensor([1.0, -1.0, 0.0])  # correct, incorrect, no answer
    overlong = torch.tensor([0.0, (6.4 - 7) / 1.6, -1.0])
    torch.testing.assert_close(rewards, verifier + 0.5 * length_term + overlong)
    assert correct.tolist() == [1.0, 0.0, 0.0]
    assert m["reward/term/user_rewards:length_score"] == pytest.approx(length_term.mean().item())
    assert m["verifier/timeouts"] == 0 and m["verifier/errors"] == 0


def test_user_function_replaces_the_verifier():
    cfg = make_cfg("reward.fn=user_rewards:exact", "reward.workers=0")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    results, details = rewarder.judge(["7", " 7 ", "8"], ["7", "7", "7"])
    assert [rewarder.is_correct(r) for r in results] == [True, True, False] and details == [None] * 3


@pytest.mark.parametrize("path, reason", [("no_such_module:fn", "not found"), ("user_rewards:nope", "no attribute"),
                                          ("user_rewards", "package.module:function")])
def test_bad_reward_path_is_a_config_error(path, reason):
    cfg = make_cfg(f"reward.fn={path}")
    with pytest.raises(ConfigError, match=reason) as e:
        Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    assert "reward.fn" in str(e.value) and path in str(e.value)


def test_cli_bad_reward_path_fails_before_model_load(rlvr_cli, tmp_path):
    result = rlvr_cli("train", "reward.fn=no_such_module:fn", f"trainer.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "reward.fn" in result.stderr and "no_such_module" in result.stderr
    log = (tmp_path / "out" / "rlvr.log").read_text()  # the libraries' output: no model or engine was started
    assert "[rlvr] rlvr train: config error: " in log and "Loading" not in log


def test_arithmetic_verifier_runs_in_process_and_the_others_in_workers():
    # bounded by construction (a length-capped regex and int()): no worker processes, whatever reward.workers says;
    # the math verifier and user functions keep the pool (their timeouts need a process to kill)
    cfg = make_cfg("reward.workers=2")
    cases = [(VerifierName.arithmetic, None, 0), (VerifierName.math, None, 2), (VerifierName.arithmetic, "user_rewards:exact", 2)]
    for verifier, fn, workers in cases:
        cfg.reward.fn = fn
        rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=verifier)
        try:
            assert len(rewarder.primary._workers) == workers  # launched (not yet waited for) at construction
            texts = ["7", "-12", "x"] if verifier is VerifierName.arithmetic else [r"\boxed{7}", r"\boxed{-12}", "x"]
            results, _ = rewarder.judge(texts, ["7", "12", "7"])
            assert [rewarder.is_correct(r) for r in results] == [True, False, False]
        finally:
            rewarder.close()


@pytest.mark.parametrize("timed_out, expected", [("-0.5", -0.5), ("null", -1.0)])
def test_a_verifier_that_gives_up_is_scored_by_reward_timed_out_and_counted(timed_out, expected):
    # a fake verifier that returns Outcome.TIMEOUT itself on "slow" (its work budget ran out), as verifier and as a term;
    # reward.timed_out=null falls back to reward.incorrect
    fake = "user_rewards:fake_verifier_gives_up"
    cfg = make_cfg("recipe=grpo", f"reward.fn={fake}", "reward.workers=0", "reward.incorrect=-1.0",
                   f"reward.timed_out={timed_out}", f"+reward.terms=[{{fn: '{fake}', weight: 0.5}}]")  # fmt: skip
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    try:
        batch = [completion(text, 2) for text in ("7", "slow", "8", "slow")]
        rewards, correct, m, results, _ = rewarder.score(batch, ["7"] * 4)
    finally:
        rewarder.close()
    assert results == [Outcome.CORRECT, Outcome.TIMEOUT, Outcome.INCORRECT, Outcome.TIMEOUT]
    torch.testing.assert_close(rewards, 1.5 * torch.tensor([1.0, expected, -1.0, expected]))  # verifier + 0.5 term
    assert correct.tolist() == [1.0, 0.0, 0.0, 0.0] and not rewarder.is_correct(Outcome.TIMEOUT)
    assert m["verifier/timeouts"] == 4 and m["verifier/errors"] == 0  # 2 of the verifier's, 2 of the term's
    assert m["reward/timeout_frac"] == 0.5 and m["reward/no_answer_frac"] == 0.0


def test_a_pool_timeout_is_a_timeout_counted_once():
    # the pool kills the stuck call (reward.timeout_s) and returns Outcome.TIMEOUT: counted once, not as no answer
    cfg = make_cfg("recipe=grpo", "reward.fn=user_rewards:hang_on_hang", "reward.workers=1", "reward.timeout_s=0.5",
                   "reward.no_answer=-2.0", "reward.timed_out=-0.25")  # fmt: skip
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    try:
        rewards, _, m, results, _ = rewarder.score([completion("hang", 2), completion("7", 2)], ["hang", "7"])
    finally:
        rewarder.close()
    assert results == [Outcome.TIMEOUT, Outcome.CORRECT] and rewards.tolist() == [-0.25, 1.0]
    assert m["verifier/timeouts"] == 1 and m["reward/timeout_frac"] == 0.5 and m["reward/no_answer_frac"] == 0.0
