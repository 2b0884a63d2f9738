"""Rollout collection and DAPO dynamic sampling, with a scripted fake engine and verifier.

FakeEngine stands in for vLLM here because these tests are about our refill logic (rounds,
trimming, the cap, the skip), not about sampling; the real engine is tested in test_rollout.py.
"""

from __future__ import annotations

import math

import pytest
from conftest import compose_config

from rlvr.collect import Z_90, RoundSizer, collect
from rlvr.config import validate
from rlvr.data import PromptStream
from rlvr.rewards import Rewarder
from rlvr.types import Completion, Example
from rlvr.verifiers import Outcome

G, B = 4, 3


class FakeEngine:
    """Returns, for prompt ids (k,), G completions whose texts come from a script keyed by k."""

    def __init__(self, script: dict[int, list[str]]) -> None:
        self.script = script
        self.calls = 0

        class _Tok:
            pad_token_id = 0

            @staticmethod
            def decode(ids, skip_special_tokens):
                return " ".join(map(str, ids))

        self.tokenizer = _Tok()

    def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop):
        self.calls += 1
        assert n == G and len(seeds) == len(prompts) and stop == []
        return [
            [
                Completion(prompt_ids=[5, 6], token_ids=[7] * len(text) + [1], text=text,
                           finish_reason="stop", engine_logprobs=[-0.5] * (len(text) + 1))
                for text in self.script[p[0]]
            ]
            for p in prompts
        ]


def scripted_verify(text: str, answer: str) -> Outcome:
    if text == "boom":
        raise RuntimeError("verifier crashed")
    return Outcome.CORRECT if text == "ok" else Outcome.INCORRECT


MIXED, ALL_OK, ALL_BAD = ["ok", "no", "no", "ok"], ["ok"] * 4, ["no"] * 4


def run_collect(stream, engine, cfg):
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=None)
    return collect(engine, stream, rewarder, cfg, step=1)


def make_cfg(dynamic: bool, max_gen_batches: int = 3, round_size: str = "fixed"):
    return validate(compose_config(
        "recipe=dapo", f"algo.group_size={G}", f"algo.prompts_per_step={B}", "algo.prompts_per_minibatch=1",
        f"algo.dynamic_sampling={dynamic}", f"algo.max_gen_batches={max_gen_batches}", f"algo.round_size={round_size}",
        "algo.overlong_shaping=false", "reward.fn=test_collect:scripted_verify", "reward.workers=0",
    ))


def stream_of(kinds: list[list[str]]) -> tuple[PromptStream, FakeEngine]:
    examples = [Example(id=str(k), prompt=f"p{k}", answer="", prompt_ids=(k,)) for k in range(len(kinds))]
    stream = PromptStream(examples, seed=0)
    stream._order = list(range(len(kinds)))  # scripted order: prompt k is drawn k-th
    return stream, FakeEngine(dict(enumerate(kinds)))


def test_without_dynamic_sampling_one_round_keeps_everything():
    stream, engine = stream_of([ALL_OK, MIXED, ALL_BAD])
    batch, m, _ = run_collect(stream, engine, make_cfg(dynamic=False))
    assert engine.calls == 1 and m["sampling/rounds"] == 1
    assert batch is not None and batch.num_rows == B * G
    assert batch.rewards.tolist() == [1.0] * 4 + [1.0, 0.0, 0.0, 1.0] + [0.0] * 4
    assert m["reward/zero_spread_group_frac"] == pytest.approx(2 / 3)


def test_refill_until_b_informative_groups_then_trim():
    # round 1 keeps 1 of 3, round 2 keeps 3 more -> 4 kept, trimmed to B = 3
    stream, engine = stream_of([ALL_OK, MIXED, ALL_BAD, MIXED, MIXED, MIXED, ALL_OK, ALL_OK, ALL_OK])
    batch, m, _ = run_collect(stream, engine, make_cfg(dynamic=True))
    assert engine.calls == 2 and m["sampling/rounds"] == 2
    assert batch is not None and batch.num_rows == B * G
    assert batch.correct.tolist() == [1.0, 0.0, 0.0, 1.0] * 3
    assert m["sampling/kept_groups"] == 3 and m["sampling/kept_group_frac"] == pytest.approx(3 / 6)


def test_cap_reached_trains_on_what_was_kept():
    stream, engine = stream_of([MIXED, ALL_OK, ALL_BAD] + [ALL_OK] * 6)
    batch, m, _ = run_collect(stream, engine, make_cfg(dynamic=True, max_gen_batches=3))
    assert engine.calls == 3
    assert batch is not None and batch.num_rows == 1 * G


def test_nothing_kept_skips_the_step_without_raising():
    stream, engine = stream_of([ALL_OK, ALL_BAD, ALL_OK] * 2)
    batch, m, _ = run_collect(stream, engine, make_cfg(dynamic=True, max_gen_batches=2))
    assert batch is None and engine.calls == 2
    assert "no informative group" in m["skip_reason"]


def test_a_crashing_verifier_costs_one_sample():
    stream, engine = stream_of([["ok", "boom", "no", "ok"], MIXED, MIXED])
    batch, m, _ = run_collect(stream, engine, make_cfg(dynamic=False))
    assert batch is not None
    assert batch.rewards[:4].tolist() == [1.0, 0.0, 0.0, 1.0]  # the crash scored as "no answer"
    assert m["verifier/errors"] == 1.0


def test_first_round_samples_are_recorded():
    stream, engine = stream_of([["ok", "boom", "no", "ok"], MIXED, MIXED])
    cfg = make_cfg(dynamic=False)
    _, m, rows = run_collect(stream, engine, cfg)
    assert len(rows) == min(cfg.logger.num_samples, B * G)
    assert [r["outcome"] for r in rows[:4]] == ["correct", "no_answer", "incorrect", "correct"]
    assert rows[0]["prompt"] == "0" and rows[0]["completion"] == "7 7 1" and rows[0]["kind"] == "train"
    assert rows[0]["extracted"] is None  # a user function does not say which answer it read
    assert m["reward/no_answer_frac"] == pytest.approx(1 / 12)


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(Binomial(n, p) >= k) in float64 (each term through log-gamma, so that large n does not overflow)."""
    log = lambda i: math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)  # noqa: E731
    return sum(math.exp(log(i)) for i in range(k, n + 1))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("need", [4, 64, 256])
def test_adaptive_round_is_the_least_n_that_reaches_the_need_with_z90_margin(p, need):
    sizer = RoundSizer(adaptive=True, informative_frac=p)
    n = sizer.prompts(need, prompts_per_step=64, budget=10**6)
    margin = lambda m: m * p - Z_90 * math.sqrt(m * p * (1 - p)) - need  # noqa: E731
    assert margin(n) >= 0 > margin(n - 1)  # the least such n
    # the normal approximation is what it claims: one round reaches the need with probability ~0.9 (exact binomial)
    assert 0.84 <= binomial_tail(n, p, need) <= 0.99


def test_round_sizes_fixed_first_step_and_budget():
    assert RoundSizer(adaptive=False, informative_frac=0.2).prompts(10, prompts_per_step=64, budget=200) == 64
    assert RoundSizer(adaptive=False).prompts(10, prompts_per_step=64, budget=30) == 30
    assert RoundSizer(adaptive=True).prompts(64, prompts_per_step=64, budget=192) == 64  # nothing known yet: need
    assert RoundSizer(adaptive=True, informative_frac=1.0).prompts(64, prompts_per_step=64, budget=192) == 64
    assert RoundSizer(adaptive=True, informative_frac=0.01).prompts(64, prompts_per_step=64, budget=192) == 192


def test_informative_fraction_halves_the_weight_of_older_steps():
    sizer = RoundSizer(adaptive=True)
    sizer.observe(informative=3, drawn=4)
    assert sizer.informative_frac == 0.75  # the first step as it is
    sizer.observe(informative=1, drawn=4)
    assert sizer.informative_frac == 0.5 * (0.75 + 0.25)


def test_adaptive_round_draws_for_the_expected_yield_in_one_call():
    # half the groups informative -> the least n with n/2 - z sqrt(n)/2 >= 3 is 11, capped by the budget 3 x B = 9
    kinds = [MIXED, ALL_OK] * 4 + [MIXED] + [ALL_BAD] * 9
    stream, engine = stream_of(kinds)
    cfg = make_cfg(dynamic=True, round_size="adaptive")
    sizer = RoundSizer(adaptive=True, informative_frac=0.5)
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=None)
    batch, m, _ = collect(engine, stream, rewarder, cfg, step=1, sizer=sizer)
    assert engine.calls == 1 and m["sampling/rounds"] == 1 and m["sampling/generated_groups"] == 9
    assert m["sampling/informative_groups"] == 5 and m["sampling/kept_groups"] == B
    assert m["sampling/informative_frac_estimate"] == 0.5  # what the round was sized from
    assert batch is not None and batch.correct.tolist() == [1.0, 0.0, 0.0, 1.0] * B
    assert sizer.informative_frac == 0.5 * (0.5 + 5 / 9)


def test_adaptive_second_round_draws_for_what_is_still_needed():
    # sized from 0.9: round 1 draws the least n with 0.9 n - z sqrt(0.09 n) >= 3 (n = 5) and finds 1 informative group;
    # round 2 needs 2 more: n = 3 (0.9 * 3 - 1.28 * 0.52 = 2.03 >= 2); both within the budget of 9
    kinds = [MIXED] + [ALL_OK] * 4 + [MIXED, MIXED, ALL_OK] + [ALL_BAD] * 4
    stream, engine = stream_of(kinds)
    cfg = make_cfg(dynamic=True, round_size="adaptive")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=None)
    batch, m, _ = collect(engine, stream, rewarder, cfg, step=1, sizer=RoundSizer(adaptive=True, informative_frac=0.9))
    assert engine.calls == 2 and m["sampling/generated_groups"] == 5 + 3
    assert batch is not None and batch.num_rows == B * G


def test_collect_counts_all_correct_groups_for_skip_solved():
    stream, engine = stream_of([ALL_OK, MIXED, ALL_BAD])
    stream.skip_solved = 1
    run_collect(stream, engine, make_cfg(dynamic=False))
    assert stream.solved_streak == {0: 1}  # only the group whose every sample was correct


@pytest.mark.parametrize("index", [0, 1])
def test_adaptive_rounds_draw_whole_shares_per_engine(monkeypatch, index):
    """Two engines (torchrun, one per rank): an adaptive round of 5 prompts becomes 6, and each engine samples its own
    3, contiguous: rank 0 prompts 0-2, rank 1 prompts 3-5. A stand-in for the all-gather returns this rank's share
    twice (the other rank's would come from its own engine); the test is about the split, not the contents."""
    from rlvr import collect as collect_module

    monkeypatch.setattr(collect_module.distributed, "engine_index", lambda tp: (index, 2))
    monkeypatch.setattr(collect_module.distributed, "all_gather_objects", lambda obj: [obj, obj])
    stream, engine = stream_of([MIXED] * 12)
    drawn: list[list[int]] = []
    generate = engine.generate
    engine.generate = lambda prompts, **kw: drawn.append([p[0] for p in prompts]) or generate(prompts, **kw)
    cfg = make_cfg(dynamic=True, round_size="adaptive")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=cfg.rollout.max_new_tokens, task_verifier=None)
    sizer = RoundSizer(adaptive=True, informative_frac=0.9)
    assert sizer.prompts(B, B, 3 * B) == 5  # what one engine alone would draw
    collect(engine, stream, rewarder, cfg, step=1, sizer=sizer)
    assert drawn[0] == [3 * index, 3 * index + 1, 3 * index + 2]
