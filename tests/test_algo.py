"""rlvr.algo against hand-computed values, analytic gradients and the micro-batch invariance (float64)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlvr.algo import (
    AGGREGATIONS,
    RATIOS,
    aggregate,
    engine_ratio,
    entropy_from_logits,
    group_advantages,
    importance_ratio,
    informative_groups,
    kl_penalty,
    masked_mean,
    overlong_penalty,
    policy_loss,
    rollout_correction_weights,
)

F64 = torch.float64


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def grad_of(fn, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    fn(x).backward()
    assert x.grad is not None
    return x.grad


# ---------------------------------------------------------------- advantages and the group filter


def test_group_norm_advantages_hand_values() -> None:
    rewards = t([1, 0, 0, 1, 2, 2, 2, 2])  # second group: all equal -> zeros
    a = 0.5 / (3**-0.5 + 1e-6)  # centred +-0.5, Bessel std = sqrt(1/3)
    expected = t([a, -a, -a, a, 0, 0, 0, 0])
    torch.testing.assert_close(group_advantages(rewards, 4, scale_by_std=True), expected)
    # G = 3: centred [-2, -1, 3], std = sqrt(14 / 2)
    s = math.sqrt(7) + 1e-6
    torch.testing.assert_close(group_advantages(t([1, 2, 6]), 3, scale_by_std=True), t([-2 / s, -1 / s, 3 / s]))


def test_group_center_advantages_hand_values() -> None:
    rewards = t([1, 0, 0, 1, 2, 2, 2, 2, 1, 2, 6, 3])
    expected = t([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -2, -1, 3, 0])
    torch.testing.assert_close(group_advantages(rewards, 4, scale_by_std=False), expected)


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_group_size_one_gives_zero_not_nan(scale_by_std: bool) -> None:
    adv = group_advantages(t([3.0, -1.0, 0.5]), 1, scale_by_std=scale_by_std)
    assert torch.equal(adv, torch.zeros(3, dtype=F64))


def test_group_advantages_rejects_uneven_groups() -> None:
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(t([1, 0, 1]), 2, scale_by_std=True)


def test_informative_groups() -> None:
    scores = t([1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25])
    assert informative_groups(scores, 4).tolist() == [True, False, False, True]
    assert informative_groups(torch.tensor([1, 1, 0, 1]), 2).tolist() == [False, True]
    assert informative_groups(t([1, 0, 1]), 1).tolist() == [False, False, False]
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(t([1, 0, 1]), 2)


# ---------------------------------------------------------------- overlong shaping


def test_overlong_penalty_values() -> None:
    # max_len 20, buffer 4: shaping starts after 16 tokens
    lengths = torch.tensor([10, 16, 17, 18, 20, 21, 25])
    got = overlong_penalty(lengths, max_len=20, buffer=4, factor=0.5)
    torch.testing.assert_close(got, t([0, 0, -0.125, -0.25, -0.5, -0.5, -0.5]).to(got.dtype))
    # buffer == max_len is allowed: the ramp starts at 0
    got = overlong_penalty(t([0, 2, 4, 5]), max_len=4, buffer=4)
    torch.testing.assert_close(got, t([0, -0.5, -1, -1]))


@pytest.mark.parametrize("buffer", [0, -1, 21])
def test_overlong_penalty_rejects_bad_buffer(buffer: int) -> None:
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([5]), max_len=20, buffer=buffer)


# ---------------------------------------------------------------- KL estimators


def test_kl_estimator_values() -> None:
    logp, ref = t([-1.0, -2.0, -0.3]), t([-1.5, -1.0, -0.3])
    x = [-1.0 - -1.5, -2.0 - -1.0, 0.0]  # logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), t(x))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), t([0.5 * v * v for v in x]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), t([math.exp(-v) + v - 1 for v in x]))
    assert kl_penalty(logp, ref, "k3")[0].item() == pytest.approx(0.10653065971263342, rel=1e-12)


def test_kl_estimator_gradients() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 3, generator=gen, dtype=F64)
    ref = torch.randn(4, 3, generator=gen, dtype=F64)
    expected = {"k1": torch.ones_like(logp), "k2": logp - ref, "k3": 1 - torch.exp(ref - logp)}
    for est, analytic in expected.items():
        torch.testing.assert_close(grad_of(lambda x, e=est: kl_penalty(x, ref, e).sum(), logp), analytic)


@pytest.mark.parametrize("est", ["k1", "k3"])
def test_kl_estimators_are_unbiased(est: str) -> None:
    """Over tokens sampled from pi_theta, the mean of k1 and of k3 estimates KL(pi_theta || pi_ref) without bias
    (k2 does not: its mean is ~KL only for close distributions). Tolerance: 5 standard errors of the sample mean,
    so a wrong sign or a dropped term (k3 without its -1: off by 1; exp(-d): off by KL(ref||theta) - KL) fails."""
    gen = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(6, generator=gen, dtype=F64), torch.randn(6, generator=gen, dtype=F64)
    logp_all, logq_all = p_logits.log_softmax(0), q_logits.log_softmax(0)  # [V]
    kl = (logp_all.exp() * (logp_all - logq_all)).sum().item()
    tokens = torch.multinomial(logp_all.exp(), 200_000, replacement=True, generator=gen)  # [n] ~ pi_theta
    values = kl_penalty(logp_all[tokens][None], logq_all[tokens][None], est)[0]  # [n]
    standard_error = values.std().item() / math.sqrt(values.numel())
    assert kl > 0.1 and abs(values.mean().item() - kl) < 5 * standard_error


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_zero_at_reference(est: str) -> None:
    logp = torch.randn(3, 4, dtype=F64)
    assert torch.equal(kl_penalty(logp, logp.clone(), est), torch.zeros_like(logp))


def test_policy_loss_kl_term_value() -> None:
    # ratio 1 and A = 0: the loss is exactly kl_coef * token-mean k3
    logp, ref = t([[-1.0, -2.0, -5.0]]), t([[-1.5, -1.0, 0.0]])
    mask = t([[1, 1, 0]])
    loss, m = policy_loss(
        logp, logp, t([0.0]), mask, ratio="token", clip_low=0.2, clip_high=0.2,
        aggregation="token_mean", ref_logprobs=ref, kl_coef=0.1,
    )  # fmt: skip
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2, rel=1e-12)
    assert m["kl"] == pytest.approx(sum(k3) / 2, rel=1e-12)
    assert m["pg_loss"] == 0.0
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, logp, t([0.0]), mask, ratio="token", clip_low=0.2, clip_high=0.2,
                    aggregation="token_mean", kl_coef=0.1)  # fmt: skip


# ---------------------------------------------------------------- aggregation

LOSS = t([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
MASK = t([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])  # lengths 2, 4, 1; row sums 3, 26, 9


def test_aggregate_seq_mean_token_mean() -> None:
    # row means 1.5, 6.5, 9
    assert aggregate(LOSS, MASK, "seq_mean_token_mean").item() == pytest.approx(17 / 3, rel=1e-12)
    assert aggregate(LOSS, MASK, "seq_mean_token_mean", num_sequences=6).item() == pytest.approx(17 / 6, rel=1e-12)


def test_aggregate_seq_mean_token_sum_norm() -> None:
    assert aggregate(LOSS, MASK, "seq_mean_token_sum_norm", max_len=4).item() == pytest.approx(38 / 12, rel=1e-12)
    got = aggregate(LOSS, MASK, "seq_mean_token_sum_norm", max_len=8, num_sequences=6).item()
    assert got == pytest.approx(38 / 48, rel=1e-12)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(LOSS, MASK, "seq_mean_token_sum_norm")


def test_aggregate_token_mean() -> None:
    assert aggregate(LOSS, MASK, "token_mean").item() == pytest.approx(38 / 7, rel=1e-12)
    assert aggregate(LOSS, MASK.bool(), "token_mean", num_tokens=10).item() == pytest.approx(3.8, rel=1e-12)
    assert aggregate(LOSS, MASK, "token_mean", num_tokens=t(19.0)).item() == pytest.approx(2.0, rel=1e-12)


def test_aggregate_ignores_empty_rows_and_padding_values() -> None:
    loss = torch.cat([LOSS, t([[float("nan"), 1e300, -1, 7]])])  # [4, 4], last row fully masked
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=F64)])
    loss[0, 3] = float("inf")  # padding of row 0
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx(17 / 4, rel=1e-12)
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(38 / 7, rel=1e-12)
    empty = torch.zeros(2, 4, dtype=F64)
    for mode in AGGREGATIONS:
        assert aggregate(LOSS[:2], empty, mode, max_len=4).item() == 0.0


def test_masked_mean_and_entropy() -> None:
    assert masked_mean(LOSS, MASK).item() == pytest.approx(38 / 7, rel=1e-12)
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0
    logits = torch.randn(2, 3, 5, dtype=F64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
    assert entropy_from_logits(torch.zeros(1, 1, 4, dtype=F64)).item() == pytest.approx(math.log(4), rel=1e-12)


# ---------------------------------------------------------------- invalid option values


def _loss(**kw):
    base = dict(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=4)
    base.update(kw)
    x = torch.zeros(2, 4, dtype=F64)
    return policy_loss(x, x, t([1.0, -1.0]), torch.ones(2, 4), ref_logprobs=x, **base)


@pytest.mark.parametrize(
    ("kw", "choices"),
    [
        ({"ratio": "seq"}, "token, sequence, sequence_token"),
        ({"aggregation": "mean"}, "seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"),
        ({"kl_coef": 0.1, "kl_estimator": "k4"}, "k1, k2, k3"),
    ],
)
def test_invalid_choices_list_valid_ones(kw: dict, choices: str) -> None:
    with pytest.raises(ValueError, match=choices):
        _loss(**kw)


def test_dual_clip_requires_c_above_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _loss(clip_ratio_c=1.0)


# ---------------------------------------------------------------- token-level clipping


def test_token_clipping_gradients_and_metrics() -> None:
    # clip_low 0.2, clip_high 0.28: band [0.8, 1.28]
    r = t([[0.5, 1.0, 1.25, 1.3], [0.7, 0.85, 1.5, 0.79]])
    adv = t([1.0, -1.0])
    mask = torch.ones(2, 4, dtype=F64)
    kw = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean")
    old = torch.zeros(2, 4, dtype=F64)
    logp = torch.log(r).requires_grad_(True)
    loss, m = policy_loss(logp, old, adv, mask, **kw)
    # l = -min(rA, clip(r)A): row 0 -[0.5, 1, 1.25, 1.28], row 1 [0.8, 0.85, 1.5, 0.8]
    assert loss.item() == pytest.approx((-4.03 + 3.95) / 8, rel=1e-9)
    assert m["pg_loss"] == pytest.approx(loss.item(), rel=1e-12)
    loss.backward()
    # d(-A r)/dlogp = -A r where unclipped; exactly 0 where the clipped branch is active
    expected = t([[-0.5, -1.0, -1.25, 0.0], [0.0, 0.85, 1.5, 0.0]]) / 8
    torch.testing.assert_close(logp.grad, expected)
    assert logp.grad[0, 3].item() == 0.0 and logp.grad[1, 0].item() == 0.0 and logp.grad[1, 3].item() == 0.0
    assert m["clip_frac_low"] == 2 / 8 and m["clip_frac_high"] == 1 / 8 and m["clip_frac"] == 3 / 8
    assert m["ratio_min"] == pytest.approx(0.5) and m["ratio_max"] == pytest.approx(1.5)
    assert m["ratio_mean"] == pytest.approx(7.89 / 8)
    # padding is not counted in the metrics
    _, m = policy_loss(logp, old, adv, t([[1, 1, 1, 0], [1, 1, 0, 0]]), **kw)
    assert m["clip_frac_low"] == 1 / 5 and m["clip_frac_high"] == 0.0 and m["ratio_max"] == pytest.approx(1.25)


def test_rollout_correction_weights_each_token_by_truncated_ratio() -> None:
    # pi_old / pi_engine per token: 0.5, 1, 1.9, 2.5 | 4, 1, 0.25, (padding)
    engine = torch.log(t([[0.4, 0.3, 0.1, 0.2], [0.05, 0.5, 0.8, 0.9]]))
    old = engine + torch.log(t([[0.5, 1.0, 1.9, 2.5], [4.0, 1.0, 0.25, 7.0]]))
    mask = t([[1, 1, 1, 1], [1, 1, 1, 0]])
    ratio = engine_ratio(old, engine)
    w = rollout_correction_weights(ratio, "token_truncated", 2.0)
    torch.testing.assert_close(w[mask.bool()], t([0.5, 1.0, 1.9, 2.0, 2.0, 1.0, 0.25]), rtol=1e-12, atol=0)
    assert (rollout_correction_weights(ratio, "none", 2.0) == 1).all()
    with pytest.raises(ValueError, match="token_truncated"):
        rollout_correction_weights(ratio, "sequence", 2.0)
    assert engine_ratio(t([0.0]), t([-1e4])).item() == pytest.approx(math.exp(20.0))  # clamped, finite
    # the loss: each token's clipped surrogate times its (detached) weight; the KL term is not weighted
    g = torch.Generator().manual_seed(0)
    logp = (old + 0.3 * torch.randn(2, 4, generator=g, dtype=F64)).requires_grad_(True)
    ref = old - 0.2
    adv = t([0.7, -1.1])
    kw = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_coef=0.1, ref_logprobs=ref)
    loss, m = policy_loss(logp, old, adv, mask, engine_logprobs=engine, rollout_correction="token_truncated",
                          rollout_correction_cap=2.0, **kw)  # fmt: skip
    r = torch.exp(logp - old)
    pg = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.28))
    expected = ((pg * w.detach() + 0.1 * (torch.exp(ref - logp) - (ref - logp) - 1)) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)  # no gradient through the weight
    assert m["rollout_ratio_mean"] == pytest.approx((0.5 + 1 + 1.9 + 2.5 + 4 + 1 + 0.25) / 7, rel=1e-12)
    assert m["rollout_ratio_max"] == pytest.approx(4.0, rel=1e-12) and m["rollout_capped_frac"] == 2 / 7
    # without the correction the loss is the plain surrogate
    plain, _ = policy_loss(logp, old, adv, mask, engine_logprobs=engine, **kw)
    assert plain.item() == pytest.approx(((pg + 0.1 * (torch.exp(ref - logp) - (ref - logp) - 1)) * mask).sum().item() / 7, rel=1e-12)


def test_dual_clip_caps_negative_advantage_loss() -> None:
    r = t([[4.0, 2.0], [4.0, 1.0]])
    adv = t([-1.0, 1.0])
    logp = torch.log(r).requires_grad_(True)
    kw = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean", clip_ratio_c=3.0)
    loss, m = policy_loss(logp, torch.zeros(2, 2, dtype=F64), adv, torch.ones(2, 2), **kw)
    # row 0 (A<0): max(r, clip r) = [4, 2] capped at 3 -> [3, 2]; row 1 (A>0): -[1.28, 1]
    assert loss.item() == pytest.approx((3 + 2 - 1.28 - 1) / 4, rel=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, t([[0.0, 2.0], [0.0, -1.0]]) / 4)
    assert logp.grad[0, 0].item() == 0.0
    assert m["dual_clip_frac"] == 0.25 and m["clip_frac"] == 0.25


# ---------------------------------------------------------------- GSPO sequence ratios

GSPO_MASK = t([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])  # lengths 2, 4, 3
GSPO_KW = dict(clip_low=0.2, clip_high=0.28, aggregation="seq_mean_token_mean")


def _gspo_inputs(row_means: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """old = 0 and logp whose masked per-row mean is row_means (tokens spread unevenly around it)."""
    spread = t([[0.3, -0.3, 9.0, 9.0], [0.2, -0.1, 0.4, -0.5], [-0.2, 0.5, -0.3, 9.0]])  # masked rows sum to 0
    logp = (spread + t(row_means)[:, None]) * GSPO_MASK + 9.0 * (1 - GSPO_MASK)  # padding must not matter
    return logp, torch.zeros(3, 4, dtype=F64)


def test_sequence_ratio_is_length_normalised_mean() -> None:
    logp = t([[0.1, 0.3, 5.0]])
    s = importance_ratio(logp, torch.zeros_like(logp), t([[1, 1, 0]]), "sequence")
    torch.testing.assert_close(s, torch.full((1, 3), math.exp(0.2), dtype=F64))  # not exp(0.4)
    loss, _ = policy_loss(logp, torch.zeros_like(logp), t([1.0]), t([[1, 1, 0]]), ratio="sequence",
                          clip_low=0.9, clip_high=10.0, aggregation="seq_mean_token_mean")  # fmt: skip
    assert loss.item() == pytest.approx(-math.exp(0.2), rel=1e-12)


@pytest.mark.parametrize("ratio", ["sequence", "sequence_token"])
def test_gspo_gradient_matches_sequence_objective(ratio: str) -> None:
    # rows 0, 1 inside the band [0.8, 1.28]; row 2 is above it with A > 0 -> clipped
    logp, old = _gspo_inputs([0.1, -0.15, 0.4])
    adv = t([1.5, -0.7, 2.0])
    lengths = GSPO_MASK.sum(-1)
    s = torch.exp(t([0.1, -0.15, 0.4]))
    x = logp.clone().requires_grad_(True)
    loss, m = policy_loss(x, old, adv, GSPO_MASK, ratio=ratio, **GSPO_KW)
    # J = (1/N) sum_i min(s_i A_i, clip(s_i) A_i); loss = -J
    clipped = s.clamp(0.8, 1.28)
    expected_loss = -torch.minimum(s * adv, clipped * adv).sum() / 3
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-12)
    loss.backward()
    inside = t([1, 1, 0])
    expected = -(adv * s / lengths * inside)[:, None] * GSPO_MASK / 3
    torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=0)
    assert torch.equal(x.grad[2], torch.zeros(4, dtype=F64))
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac"] == pytest.approx(1 / 3)  # per sequence


def test_gspo_clipped_negative_advantage_has_zero_gradient() -> None:
    logp, old = _gspo_inputs([-0.5, -0.4, 0.05])  # s = 0.61, 0.67 below 0.8; row 2 inside
    adv = t([-1.0, -2.0, -1.0])
    for ratio in ("sequence", "sequence_token"):
        x = logp.clone().requires_grad_(True)
        loss, m = policy_loss(x, old, adv, GSPO_MASK, ratio=ratio, **GSPO_KW)
        loss.backward()
        assert torch.equal(x.grad[:2], torch.zeros(2, 4, dtype=F64))
        assert (x.grad[2, :3] > 0).all()
        assert m["clip_frac_low"] == pytest.approx(2 / 3) and m["clip_frac_high"] == 0.0


def test_sequence_token_equals_sequence_in_value() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 4, generator=gen, dtype=F64)
    old = logp + 0.2 * torch.randn(3, 4, generator=gen, dtype=F64)
    adv = t([1.0, -1.0, 0.5])
    for agg in AGGREGATIONS:
        kw = dict(clip_low=0.2, clip_high=0.28, aggregation=agg, max_len=4)
        a, ma = policy_loss(logp, old, adv, GSPO_MASK, ratio="sequence", **kw)
        b, mb = policy_loss(logp, old, adv, GSPO_MASK, ratio="sequence_token", **kw)
        assert a.item() == pytest.approx(b.item(), rel=1e-12)
        assert ma == pytest.approx(mb, rel=1e-12)


# ---------------------------------------------------------------- invariance and empty rows

N, T = 8, 5
LENGTHS = [5, 3, 1, 4, 2, 5, 3, 0]  # uneven, one overlong-filtered row
CASES = [(agg, ratio, {}) for agg, ratio in itertools.product(AGGREGATIONS, RATIOS)] + [
    ("token_mean", "token", {"kl_coef": 0.1, "clip_ratio_c": 3.0}),
    ("seq_mean_token_mean", "sequence", {"kl_coef": 0.05, "kl_estimator": "k2"}),
]


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=gen, dtype=F64) * 3  # [N, T]
    noise = torch.randn(N, T, generator=gen, dtype=F64) + torch.randn(N, 1, generator=gen, dtype=F64)
    old = logp + 0.3 * noise  # per-token and per-row offsets, so token and sequence ratios both get clipped
    ref = logp + 0.3 * torch.randn(N, T, generator=gen, dtype=F64)
    adv = torch.randn(N, generator=gen, dtype=F64)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).to(F64)  # [N, T]
    return logp, old, ref, adv, mask


def assert_micro_batches_match(batch: tuple, kw: dict, sizes: tuple[int, ...], rtol: float, atol: float) -> torch.Tensor:
    """policy_loss over micro-batches of each size (rows split in order, normalized by the whole batch's sequence and
    token counts, gradients accumulated) equals the full batch's loss and gradient; returns the full batch's gradient.
    The full batch's clip fraction is strictly inside (0, 1): the clip is exercised, not inert."""
    logp, old, ref, adv, mask = batch
    n = logp.shape[0]
    full_w = logp.clone().requires_grad_(True)
    full, m = policy_loss(full_w, old, adv, mask, ref_logprobs=ref, **kw)
    full.backward()
    assert 0 < m["clip_frac"] < 1
    n_tok = mask.sum().item()
    for size in sizes:
        w = logp.clone().requires_grad_(True)
        total = torch.zeros((), dtype=logp.dtype)
        for lo in range(0, n, size):
            rows = slice(lo, lo + size)
            loss, _ = policy_loss(w[rows], old[rows], adv[rows], mask[rows], ref_logprobs=ref[rows],
                                  num_sequences=n, num_tokens=n_tok, **kw)  # fmt: skip
            loss.backward()
            total += loss.detach()
        torch.testing.assert_close(w.grad, full_w.grad, rtol=rtol, atol=atol)
        torch.testing.assert_close(total, full.detach(), rtol=rtol, atol=atol)
    assert full_w.grad.abs().sum() > 0
    return full_w.grad


@pytest.mark.parametrize(("aggregation", "ratio", "extra"), CASES)
def test_micro_batches_reproduce_full_batch_gradient(aggregation: str, ratio: str, extra: dict) -> None:
    kw = dict(ratio=ratio, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_len=T, **extra)
    assert_micro_batches_match(_batch(), kw, (1, 2, N), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(("aggregation", "ratio"), list(itertools.product(AGGREGATIONS, RATIOS)))
def test_fully_masked_rows_are_finite_and_inert(aggregation: str, ratio: str) -> None:
    logp, old, ref, adv, mask = _batch(1)
    mask[2] = 0
    kw = dict(ratio=ratio, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_len=T)
    w = logp.clone().requires_grad_(True)
    loss, m = policy_loss(w, old, adv, mask, ref_logprobs=ref, kl_coef=0.1, **kw)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(w.grad).all()
    assert torch.equal(w.grad[2], torch.zeros(T, dtype=F64)) and torch.equal(w.grad[7], torch.zeros(T, dtype=F64))
    assert w.grad[0].abs().sum() > 0
    # a call whose rows are all masked: loss exactly 0, metrics finite
    w = logp[:2].clone().requires_grad_(True)
    loss, m = policy_loss(w, old[:2], adv[:2], torch.zeros(2, T), ref_logprobs=ref[:2], kl_coef=0.1, **kw)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(w.grad, torch.zeros(2, T, dtype=F64))
    assert all(math.isfinite(v) for v in m.values())


def test_loss_scale_multiplies_loss_only() -> None:
    logp, old, ref, adv, mask = _batch()
    kw = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean")
    a, ma = policy_loss(logp, old, adv, mask, **kw)
    b, mb = policy_loss(logp, old, adv, mask, loss_scale=2.0, **kw)
    assert b.item() == pytest.approx(2 * a.item(), rel=1e-12)
    assert mb["pg_loss"] == pytest.approx(ma["pg_loss"], rel=1e-12) == pytest.approx(a.item(), rel=1e-12)
