"""rlvr.evaluation's arithmetic: unbiased pass@k against exact rationals, the k reported, and the summary's values on
hand-built answers. (`rlvr eval` on real runs: tests/test_eval_command.py.)"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from rlvr.evaluation import Scored, k_values, pass_at_k, summarize

EPS = float(np.finfo(np.float64).eps)


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic (math.comb is 0 when k > n - c)."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16, 100, 1024])
def test_pass_at_k_matches_exact_rationals(n):
    # the product form multiplies at most n factors, each rounded once: |error| <= ~n * eps64 relative to the product
    for c in sorted({0, 1, n // 3, n // 2, n - 1, n} - {-1}):
        for k in sorted({1, 2, 3, n // 2, n - 1, n} & set(range(1, n + 1))):
            want = float(exact_pass_at_k(n, c, k))
            assert pass_at_k(n, c, k) == pytest.approx(want, rel=0, abs=4 * n * EPS), (n, c, k)


def test_pass_at_k_special_values():
    assert pass_at_k(8, 0, 4) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8, abs=4 * 8 * EPS)  # pass@1 is the fraction correct
    assert pass_at_k(8, 5, 4) == 1.0  # only 3 wrong: every 4 answers hold a correct one
    # n = 2000: C(2000, 1000) overflows float64, the product form does not
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="n=4, c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(8) == [1, 2, 4, 8]
    assert k_values(10) == [1, 2, 4, 8, 10]
    assert k_values(3) == [1, 2, 3]


def answer(correct: bool, tokens: int, *, no_answer: bool = False, timeout: bool = False, truncated: bool = False) -> Scored:
    return Scored(correct=correct, no_answer=no_answer, timeout=timeout, tokens=tokens, truncated=truncated)


def test_summary_of_greedy_and_sampled_answers():
    greedy = [answer(True, 4), answer(False, 6, timeout=True, truncated=True), answer(False, 2, no_answer=True),
              answer(True, 8)]  # fmt: skip
    # three prompts x n=4 samples with 0, 1 and 4 correct; the verifier gave up on two of the first prompt's
    sampled = [
        [answer(False, 5, timeout=True)] * 2 + [answer(False, 5)] * 2,
        [answer(True, 3), answer(False, 7), answer(False, 7, truncated=True), answer(False, 1, no_answer=True)],
        [answer(True, 2)] * 4,
    ]
    m = summarize(greedy, sampled)
    assert m["eval/accuracy"] == 0.5
    assert m["eval/no_answer_frac"] == 0.25 and m["eval/truncated_frac"] == 0.25 and m["eval/timeout_frac"] == 0.25
    assert m["eval/response_length"] == 5.0
    assert m["eval/response_length_p50"] == 5.0  # median of 2, 4, 6, 8
    assert m["eval/response_length_p95"] == pytest.approx(2 + 0.95 * 3 * 2)  # linear: rank 2.85 between 6 and 8
    assert m["eval/response_length_correct_mean"] == 6.0 and m["eval/response_length_incorrect_mean"] == 4.0
    assert m["eval/mean@4"] == pytest.approx(5 / 12)
    per_prompt = {k: [float(exact_pass_at_k(4, c, k)) for c in (0, 1, 4)] for k in (1, 2, 4)}
    for k in (1, 2, 4):
        assert m[f"eval/pass@{k}"] == pytest.approx(sum(per_prompt[k]) / 3, abs=16 * EPS)
    assert m["eval/pass@1"] == pytest.approx(m["eval/mean@4"], abs=16 * EPS)  # pass@1 is mean@n
    assert m["eval/pass@2"] == pytest.approx((0 + 0.5 + 1) / 3)  # c=1 of 4: 1 - C(3,2)/C(4,2) = 1/2
    assert m["eval/sampled_no_answer_frac"] == 1 / 12 and m["eval/sampled_truncated_frac"] == 1 / 12
    assert m["eval/sampled_timeout_frac"] == 2 / 12
    assert m["eval/sampled_response_length"] == pytest.approx((20 + 18 + 8) / 12)
    assert m["eval/sampled_response_length_correct_mean"] == pytest.approx((3 + 8) / 5)
    assert set(m) >= {"eval/sampled_response_length_p50", "eval/sampled_response_length_p95"}


def test_the_verifiers_details_are_split_for_greedy_and_sampled_answers():
    greedy = [Scored(True, False, False, 3, False, "passed"), Scored(False, False, False, 3, False, "timeout"),
              Scored(False, True, False, 3, False, "no_code"), Scored(False, False, False, 3, False, "timeout")]  # fmt: skip
    sampled = [[Scored(False, False, False, 2, False, "wrong_answer"), Scored(True, False, False, 2, False, "passed")]]
    m = summarize(greedy, sampled, ("passed", "wrong_answer", "no_code", "timeout", "memory_limit"))
    assert {k: v for k, v in m.items() if "detail/" in k} == {
        "eval/detail/passed": 0.25, "eval/detail/wrong_answer": 0.0, "eval/detail/no_code": 0.25,
        "eval/detail/timeout": 0.5, "eval/detail/memory_limit": 0.0,
        "eval/sampled_detail/passed": 0.5, "eval/sampled_detail/wrong_answer": 0.5, "eval/sampled_detail/no_code": 0.0,
        "eval/sampled_detail/timeout": 0.0, "eval/sampled_detail/memory_limit": 0.0}  # fmt: skip
    assert not [k for k in summarize(greedy, sampled) if "detail" in k]  # a verifier without details: none


def test_greedy_only_has_no_sampled_metrics():
    m = summarize([answer(True, 3), answer(True, 5)], [])
    assert m["eval/accuracy"] == 1.0 and "eval/response_length_incorrect_mean" not in m
    assert not [k for k in m if "pass@" in k or "mean@" in k or "sampled" in k]


# ---- evaluate() split over engines, with fakes of the engine and the verifier (our own gathering logic only) ----


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class FakeEngine:
    """Answers are a function of the prompt (greedy) or of the prompt and the seed (sampled): whichever engine gets a
    prompt, it answers the same."""

    tokenizer = FakeTokenizer()

    def greedy(self, prompts, *, max_tokens, stop):
        return [self._answer(p[0], 0) for p in prompts]

    def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop):
        return [[self._answer(p[0], seed + j) for j in range(n)] for p, seed in zip(prompts, seeds)]

    @staticmethod
    def _answer(x: int, draw: int):
        from rlvr.types import Completion

        value = x + (draw % 3 == 1)  # right unless the draw says otherwise
        tokens = [x % 5 + draw % 4 + 1] * (1 + x % 4)
        return Completion([x], tokens, str(value), "length" if x % 7 == 0 else "stop", [])


class FakeRewarder:
    details = ("passed", "wrong_answer")  # a verifier that names why (as the code verifier's judge does)
    env_only = False  # a verifier judges (reward.verifier is not none)

    def grade(self, completions, states):
        from rlvr.thinking import Split

        return [Split(None, c.text) for c in completions]  # nothing thinks here

    def judge(self, texts, answers, thoughts=None):
        from rlvr.verifiers import Outcome

        right = [t == a for t, a in zip(texts, answers)]
        return ([Outcome.CORRECT if r else Outcome.INCORRECT for r in right],
                ["passed" if r else "wrong_answer" for r in right])  # fmt: skip

    def is_correct(self, result):
        from rlvr.verifiers import Outcome

        return result is Outcome.CORRECT

    def answered_right(self, completion, result):
        return self.is_correct(result)

    def value(self, result):
        return float(self.is_correct(result))

    def extract(self, text):
        return text


class Gathered(Exception):
    """Raised by the first pass's all_gather: carries this rank's share."""


def test_evaluation_over_engines_equals_one_engine(monkeypatch):
    """Four ranks as 4 engines (tp 1) and as 2 engines (tp 2): the same metrics, and every row in the set's order."""
    from conftest import compose_config

    from rlvr import distributed, evaluation
    from rlvr.config import validate
    from rlvr.types import Example

    examples = [Example(id=f"q{i}", prompt=str(i), answer=str(i), prompt_ids=(i,)) for i in range(23)]
    cfg = validate(compose_config("eval.n=3"))

    def run(rank: int, world: int, tp: int, shares: list | None):
        cfg.rollout.tensor_parallel_size = tp
        monkeypatch.setattr(distributed, "engine_index", lambda t: (rank // t, world // t))

        def gather(obj):
            if shares is None:
                raise Gathered(obj)
            return shares

        monkeypatch.setattr(distributed, "all_gather_objects", gather)
        return evaluation.evaluate(FakeEngine(), examples, FakeRewarder(), cfg, 5, every_row=True)

    with pytest.raises(Gathered) as one:
        run(0, 1, 1, None)
    want_metrics, want_rows = run(0, 1, 1, [one.value.args[0]])
    assert [r["id"] for r in want_rows[:5]] == ["q0"] * 4 + ["q1"] and want_metrics["eval/pass@2"] > 0
    for world, tp in ((4, 1), (4, 2)):
        shares = []
        for rank in range(world):
            try:
                run(rank, world, tp, None)
            except Gathered as g:
                shares.append(g.args[0])
        metrics, rows = run(0, world, tp, shares)
        assert metrics == want_metrics and rows == want_rows, (world, tp)
    assert want_metrics["eval/detail/passed"] == want_metrics["eval/accuracy"] > 0
    assert want_metrics["eval/sampled_detail/wrong_answer"] == pytest.approx(1 - want_metrics["eval/mean@3"])
