"""rlvr.algo and the micro-batch plan: the behaviours the mutation runs (mutmut 3.8.1 over the pure core, issues 26 and 43)
found untested.

Each test names the contract it pins: error messages, dtypes of normalizers and metrics, empty-input defaults,
strict/non-strict boundaries of the clip statistics, and the micro-batch split order.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlvr import algo
from rlvr.algo import (
    aggregate,
    as_floats,
    engine_ratio,
    group_advantages,
    importance_ratio,
    informative_groups,
    kl_penalty,
    metric_units,
    overlong_penalty,
    policy_loss,
    policy_loss_terms,
    rollout_correction_weights,
)
from rlvr.batching import micro_batches, split_to

F64 = torch.float64


def _terms(logp: list[list[float]], adv: list[float], mask: list[list[float]] | None = None, dtype=F64, **kw):
    lp = torch.tensor(logp, dtype=dtype)
    m = torch.ones_like(lp) if mask is None else torch.tensor(mask, dtype=dtype)
    base = dict(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean")
    base.update(kw)
    return policy_loss_terms(lp, torch.zeros_like(lp), torch.tensor(adv, dtype=dtype), m, **base)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: kl_penalty(x, x, "k4"), "unknown kl_estimator 'k4'; valid choices: k1, k2, k3"),
        (lambda x: importance_ratio(x, x, x, "seq"), "unknown ratio 'seq'; valid choices: token, sequence, sequence_token"),
        (lambda x: aggregate(x, x, "mean"),
         "unknown aggregation 'mean'; valid choices: seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"),
        (lambda x: rollout_correction_weights(x, "tis", 2.0),
         "unknown rollout_correction 'tis'; valid choices: none, token_truncated"),
        (lambda x: aggregate(x, x, "seq_mean_token_sum_norm"), "aggregation 'seq_mean_token_sum_norm' requires max_len"),
        (lambda x: policy_loss_terms(x, x, x[:, 0], x, ratio="token", clip_low=0.2, clip_high=0.2,
                                     aggregation="token_mean", kl_coef=0.1), "kl_coef > 0 requires ref_logprobs"),
        (lambda x: policy_loss_terms(x, x, x[:, 0], x, ratio="token", clip_low=0.2, clip_high=0.2,
                                     aggregation="token_mean", rollout_correction="token_truncated"),
         "rollout_correction 'token_truncated' requires engine_logprobs"),
        (lambda x: policy_loss_terms(x, x, x[:, 0], x, ratio="token", clip_low=0.2, clip_high=0.2,
                                     aggregation="token_mean", objective="ppo"),
         "unknown objective 'ppo'; valid choices: clip, cispo, sapo, gmpo"),
        (lambda x: algo.advantages(x[0], 3, "grpo"),
         "unknown advantage 'grpo'; valid choices: group_norm, group_center, rloo, reinforce_pp"),
    ],
)
def test_error_messages_name_the_option_the_value_and_the_choices(call, message: str) -> None:
    with pytest.raises(ValueError) as err:
        call(torch.ones(2, 3, dtype=F64))
    assert str(err.value) == message


@pytest.mark.parametrize("fn", [group_advantages, informative_groups])
def test_group_functions_reject_group_size_zero_and_2d_input(fn) -> None:
    kw = {"scale_by_std": True} if fn is group_advantages else {}
    with pytest.raises(ValueError, match="divisible by group_size"):
        fn(torch.ones(4), 0, **kw)
    with pytest.raises(ValueError, match="divisible by group_size"):
        fn(torch.ones(2, 2), 2, **kw)  # 4 elements, divisible, but not 1-D


# ---------------------------------------------------------------- advantages and shaping


def test_integer_rewards_and_groups_of_two() -> None:
    adv = group_advantages(torch.tensor([1, 0, 0, 0]), 2, scale_by_std=True)  # int rewards: as the default float dtype
    assert adv.dtype == torch.get_default_dtype()
    s = 1 / math.sqrt(2)  # std of (1, 0) with Bessel's correction; A = +-0.5 / s
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_advantage_modes_pass_eps_on() -> None:
    """eps is the std's offset for group_norm and for reinforce_pp's batch normalisation alike."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    s = torch.tensor([1.0, 0.0]).std().item()  # of a group (1, 0): 1/sqrt(2)
    torch.testing.assert_close(algo.advantages(r, 2, "group_norm", eps=1.0),
                               torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=F64) / (s + 1.0))  # fmt: skip
    torch.testing.assert_close(algo.advantages(r, 2, "reinforce_pp", eps=1.0), (r - 0.25) / (r.std() + 1.0))


def test_reinforce_pp_normalises_two_responses() -> None:
    """Only a single response has no spread (A = 0); two already do: +-0.5 / std(0, 1)."""
    a = algo.batch_advantages(torch.tensor([0.0, 1.0], dtype=F64))
    torch.testing.assert_close(a, torch.tensor([-0.5, 0.5], dtype=F64) / (1 / math.sqrt(2) + 1e-6))
    assert algo.batch_advantages(torch.tensor([3.0], dtype=F64)).tolist() == [0.0]


def test_overlong_penalty_accepts_a_buffer_of_one() -> None:
    pen = overlong_penalty(torch.tensor([9, 10, 11]), max_len=10, buffer=1)
    torch.testing.assert_close(pen, torch.tensor([0.0, -1.0, -1.0]))


def test_engine_ratio_clamps_the_log_ratio_at_minus_twenty() -> None:
    r = engine_ratio(torch.tensor([-25.0], dtype=F64), torch.tensor([0.0], dtype=F64))
    assert r.item() == pytest.approx(math.exp(-20.0), rel=1e-12)


# ---------------------------------------------------------------- normalizers and units


def test_count_is_a_clamped_scalar_in_the_dtype_and_on_the_device_of_like() -> None:
    n = algo._count(3, torch.zeros(1, dtype=F64, device="meta"))
    assert (n.dtype, n.device.type, n.shape) == (F64, "meta", torch.Size([]))
    assert algo._count(0.0, torch.zeros(1, dtype=F64)).item() == 1.0


def test_sequence_ratio_of_a_one_token_row_is_that_tokens_ratio() -> None:
    logp = torch.tensor([[0.3, 0.0]], dtype=F64)
    r = importance_ratio(logp, torch.zeros_like(logp), torch.tensor([[1.0, 0.0]]), "sequence")
    torch.testing.assert_close(r, torch.full((1, 2), math.exp(0.3), dtype=F64))


def test_metric_units_are_tokens_or_nonempty_sequences() -> None:
    mask = torch.tensor([[1, 0], [0, 0], [1, 1]])
    assert torch.equal(metric_units(mask, "token"), mask.bool())
    for ratio in ("sequence", "sequence_token"):
        assert torch.equal(metric_units(mask, ratio), torch.tensor([True, False, True]))


def test_sequence_ratio_metrics_with_one_token_per_row() -> None:
    _, m = _terms([[0.0]], [1.0], ratio="sequence")  # T = 1: the ratio's one column
    assert m["ratio_mean"].item() == 1.0


# ---------------------------------------------------------------- policy loss options


def test_rollout_correction_cap_defaults_to_two() -> None:
    lp = torch.zeros(1, 1, dtype=F64)
    loss, _ = policy_loss(lp, lp, torch.tensor([1.0], dtype=F64), torch.ones(1, 1), ratio="token", clip_low=0.2,
                          clip_high=0.2, aggregation="token_mean", rollout_correction="token_truncated",
                          engine_logprobs=torch.full((1, 1), -math.log(2.5), dtype=F64))  # pi_old/pi_engine = 2.5
    assert loss.item() == pytest.approx(-2.0)  # -A * r * min(2.5, cap=2)


def test_dual_clip_accepts_c_between_one_and_two_and_leaves_positive_advantages() -> None:
    loss, m = _terms([[0.0]], [0.5], clip_ratio_c=1.5)  # A = 0.5 > 0: the dual clip does not apply
    assert loss.item() == pytest.approx(-0.5)
    assert m["dual_clip_frac"].item() == 0.0


def test_advantages_take_the_logprobs_dtype() -> None:
    lp = torch.zeros(1, 2, dtype=torch.float32)
    loss, _ = policy_loss_terms(lp, lp, torch.tensor([1.0], dtype=F64), torch.ones(1, 2), ratio="token",
                                clip_low=0.2, clip_high=0.2, aggregation="token_mean")
    assert loss.dtype == torch.float32


def test_the_dual_clip_keeps_the_logprobs_dtype() -> None:
    lp = torch.zeros(1, 2, dtype=torch.float32)
    loss, _ = policy_loss_terms(lp, lp, torch.tensor([-1.0], dtype=F64), torch.ones(1, 2), ratio="token",
                                clip_low=0.2, clip_high=0.2, aggregation="token_mean", clip_ratio_c=3.0)  # fmt: skip
    assert loss.dtype == torch.float32


# ---------------------------------------------------------------- objectives


def _one_token(objective: str, log_r: float, adv: float, **kw):
    """policy_loss_terms' loss of one response of one token with log-ratio log_r and advantage adv."""
    lp = torch.tensor([[log_r]], dtype=F64)
    return policy_loss_terms(lp, torch.zeros_like(lp), torch.tensor([adv], dtype=F64), torch.ones_like(lp),
                             ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean",
                             objective=objective, **kw)[0].item()  # fmt: skip


def test_sapo_temperatures_reach_the_gate() -> None:
    """At r = 1 the SAPO loss is -2A / tau, tau = sapo_tau_pos for A > 0 and sapo_tau_neg otherwise; surrogate's own
    defaults are policy_loss_terms' (1.0, 1.05)."""
    assert _one_token("sapo", 0.0, 1.0, sapo_tau_pos=2.0) == pytest.approx(-1.0, rel=1e-12)
    assert _one_token("sapo", 0.0, -1.0, sapo_tau_neg=4.0) == pytest.approx(0.5, rel=1e-12)
    lp, mask = torch.zeros(2, 1, dtype=F64), torch.ones(2, 1, dtype=F64)
    loss, _, _ = algo.surrogate(lp, lp, torch.tensor([1.0, -1.0], dtype=F64), mask, objective="sapo", ratio="token",
                                clip_low=0.2, clip_high=0.2)  # fmt: skip
    torch.testing.assert_close(loss, torch.tensor([[-2.0], [2.0 / 1.05]], dtype=F64), rtol=1e-12, atol=0)


def test_gmpo_of_a_one_token_response_is_its_clipped_ratio() -> None:
    """The geometric mean over one token is that token's ratio: l = -A r inside the band (e^-0.2, e^0.2)."""
    assert _one_token("gmpo", math.log(1.1), 1.0) == pytest.approx(-1.1, rel=1e-12)
    assert _one_token("gmpo", math.log(2.0), 1.0) == pytest.approx(-math.exp(0.2), rel=1e-12)  # clipped for A > 0


def test_clip_statistics_are_strict_and_need_a_signed_advantage() -> None:
    # ratio exactly at the bound is not clipped (clip_low = clip_high = 0: the bounds are 1)
    _, m = _terms([[0.0, 0.0]], [-1.0], clip_low=0.0, clip_high=0.0)
    assert m["clip_frac_low"].item() == 0.0
    _, m = _terms([[0.0, 0.0]], [1.0], clip_low=0.0, clip_high=0.0)
    assert m["clip_frac_high"].item() == 0.0
    # far outside the bounds, but with A = 0 or 0 < A < 1 on the low side, A = 0 on the high side: not counted
    _, m = _terms([[math.log(0.5)], [math.log(0.5)]], [0.0, 0.5])
    assert m["clip_frac_low"].item() == 0.0
    _, m = _terms([[math.log(2.0)]], [0.0])
    assert m["clip_frac_high"].item() == 0.0


def test_dual_clip_fraction_counts_negative_advantages_whose_loss_exceeds_the_cap() -> None:
    # r = 0.5 < 1 - clip_low: its loss |A| * 0.8 stays under c * |A| = 1.2 |A|
    _, m = _terms([[math.log(0.5)]], [-1.0], clip_ratio_c=1.2)
    assert m["dual_clip_frac"].item() == 0.0
    # r = 1 with c below 1 + clip_low and 1 + clip_high: no cap reached
    _, m = _terms([[0.0]], [-1.0], clip_ratio_c=1.1, clip_low=0.2, clip_high=0.5)
    assert m["dual_clip_frac"].item() == 0.0
    # r exactly c: at the cap, not above it
    r = torch.exp(torch.tensor(0.5, dtype=F64)).item()
    _, m = _terms([[0.5]], [-1.0], clip_ratio_c=r)
    assert m["dual_clip_frac"].item() == 0.0
    _, m = _terms([[0.6]], [-1.0], clip_ratio_c=r)
    assert m["dual_clip_frac"].item() == 1.0


def test_rollout_capped_fraction_is_strict() -> None:
    lp = torch.zeros(1, 1, dtype=F64)
    engine = torch.full((1, 1), -0.5, dtype=F64)
    cap = torch.exp(torch.tensor(0.5, dtype=F64)).item()
    _, m = policy_loss_terms(lp, lp, torch.tensor([1.0], dtype=F64), torch.ones(1, 1), ratio="token", clip_low=0.2,
                             clip_high=0.2, aggregation="token_mean", rollout_correction="token_truncated",
                             engine_logprobs=engine, rollout_correction_cap=cap)
    assert m["rollout_capped_frac"].item() == 0.0


def test_metrics_of_an_empty_call_are_float64_defaults() -> None:
    lp = torch.zeros(1, 2, dtype=torch.float32)
    _, m = policy_loss_terms(lp, lp, torch.tensor([1.0]), torch.zeros(1, 2), ratio="token", clip_low=0.2,
                             clip_high=0.2, aggregation="token_mean", ref_logprobs=lp, kl_coef=0.1,
                             clip_ratio_c=3.0, rollout_correction="token_truncated", engine_logprobs=lp)
    assert all(v.dtype == F64 for v in m.values()), {k: v.dtype for k, v in m.items()}
    floats = as_floats(m)
    for key in ("ratio_mean", "ratio_min", "ratio_max", "rollout_ratio_mean", "rollout_ratio_max"):
        assert floats[key] == 1.0, key
    for key in ("clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "rollout_capped_frac", "kl"):
        assert floats[key] == 0.0, key


def test_metrics_of_float32_inputs_are_float64() -> None:
    lp = torch.tensor([[0.1, -0.2]], dtype=torch.float32)
    _, m = policy_loss_terms(lp, torch.zeros_like(lp), torch.tensor([1.0]), torch.ones(1, 2), ratio="token",
                             clip_low=0.2, clip_high=0.2, aggregation="token_mean", ref_logprobs=torch.zeros_like(lp),
                             kl_coef=0.1)
    assert all(v.dtype == F64 for v in m.values()), {k: v.dtype for k, v in m.items()}


def test_as_floats_of_no_metrics() -> None:
    assert as_floats({}) == {}


# ---------------------------------------------------------------- micro-batch plan


def test_split_to_halves_the_largest_in_padded_tokens_by_its_longest_row() -> None:
    lengths = [10, 5, 5, 5, 5]
    plan = micro_batches(lengths, max_rows=3, max_tokens=20)
    assert plan == [[0, 1], [2, 3, 4]]  # padded: 2 x 10 = 20 and 3 x 5 = 15
    assert split_to(plan, lengths, 3) == [[0], [1], [2, 3, 4]]


# ---------------------------------------------------------------- micro-batch metrics


def test_combine_metrics_sums_weights_and_takes_extremes() -> None:
    """pg_loss is summed, kl weighted by the token share, any other metric by the unit share; ratio_max and
    rollout_ratio_max are maxima, ratio_min a maximum of the negated values (the learner negates it back)."""

    def t(x: float) -> torch.Tensor:
        return torch.tensor(x, dtype=F64)

    first = {"pg_loss": t(1.0), "kl": t(2.0), "clip_frac": t(0.5), "ratio_max": t(1.5), "ratio_min": t(0.75),
             "rollout_ratio_max": t(1.0)}  # fmt: skip
    second = {"pg_loss": t(3.0), "kl": t(4.0), "clip_frac": t(0.125), "ratio_max": t(1.25), "ratio_min": t(0.5),
              "rollout_ratio_max": t(2.0)}  # fmt: skip
    sums, extremes = algo.combine_metrics([
        (first, {"tokens": t(0.25), "units": t(0.75)}),
        (second, {"tokens": t(0.75), "units": t(0.25)}),
    ])  # fmt: skip
    assert {k: v.item() for k, v in sums.items()} == {"pg_loss": 4.0, "kl": 3.5, "clip_frac": 0.40625}
    assert {k: v.item() for k, v in extremes.items()} == {"ratio_max": 1.5, "ratio_min": -0.5, "rollout_ratio_max": 2.0}
    assert all(v.dim() == 0 for v in (*sums.values(), *extremes.values()))
    assert algo.combine_metrics([]) == ({}, {})
