"""CISPO, SAPO, GMPO, RLOO and REINFORCE++ in rlvr.algo against float64 transcriptions of their papers' equations,
written here in plain Python floats (math, no torch), so that no line of the code under test computes an expected value.

Values and autograd gradients at ratio 1, at and across the clip edges, for both signs of the advantage, under the
paper's aggregation and the other ones; then the micro-batch invariance the four older recipes have. Tolerances: each
expected value is a handful of float64 operations away from the code's (relative error ~1e-15), so rtol 1e-12.
"""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
import torch
from test_algo import assert_micro_batches_match

from rlvr.algo import AGGREGATIONS, advantages, batch_advantages, policy_loss, rloo_advantages

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-15)


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ---------------------------------------------------------------- advantages


def _rloo_reference(rewards: list[float], g: int) -> list[float]:
    """RLOO (Kool et al. 2019; Ahmadian et al., arXiv 2402.14740): A_i = R_i - (1/(G-1)) sum_{j in group, j != i} R_j."""
    out = []
    for i, r in enumerate(rewards):
        group = range(i // g * g, i // g * g + g)
        out.append(r - sum(rewards[j] for j in group if j != i) / (g - 1))
    return out


def test_rloo_matches_leave_one_out_transcription() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 6.0, 3.0]
    got = rloo_advantages(t(rewards), 4)
    torch.testing.assert_close(got, t(_rloo_reference(rewards, 4)), **TOL)
    assert got[0].item() == pytest.approx(2 / 3, rel=1e-15)  # 1 - (0 + 0 + 1)/3
    # G = 3 and G = 2 (where A_i = R_i - R_other)
    torch.testing.assert_close(rloo_advantages(t([1.0, 2.0, 6.0]), 3), t(_rloo_reference([1.0, 2.0, 6.0], 3)), **TOL)
    torch.testing.assert_close(rloo_advantages(t([1.0, 0.0, 3.0, 5.0]), 2), t([1.0, -1.0, -2.0, 2.0]), **TOL)
    # integer rewards and the dispatch by name give the same; one sample per group has no baseline: 0, not NaN
    torch.testing.assert_close(advantages(torch.tensor([1, 0, 0, 1]), 2, "rloo").to(F64), t([1.0, -1.0, -1.0, 1.0]))
    assert torch.equal(rloo_advantages(t([3.0, -1.0]), 1), torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(t([1.0, 0.0, 1.0]), 2)


def test_reinforce_pp_normalises_over_the_whole_batch_not_the_group() -> None:
    """REINFORCE++ (arXiv 2501.03262), advantage normalisation: (A - mean_batch) / std_batch over the global batch."""
    rewards = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # groups of 4 with different means: a per-group norm differs
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)  # stdev: Bessel's correction, as group_norm
    expected = [(r - mean) / (std + 1e-6) for r in rewards]
    torch.testing.assert_close(batch_advantages(t(rewards)), t(expected), **TOL)
    torch.testing.assert_close(advantages(t(rewards), 4, "reinforce_pp"), t(expected), **TOL)
    assert advantages(t(rewards), 4, "reinforce_pp")[4].item() > 0  # an all-2 group is above the batch mean: not 0
    assert torch.equal(batch_advantages(t([5.0])), torch.zeros(1, dtype=F64))
    assert torch.equal(batch_advantages(t([2.0, 2.0])), torch.zeros(2, dtype=F64))


def test_advantage_dispatch_keeps_group_modes_and_lists_choices() -> None:
    rewards = t([1.0, 0.0, 0.0, 0.0, 2.0, 1.0])
    s = statistics.stdev([1.0, 0.0, 0.0])
    torch.testing.assert_close(advantages(rewards, 3, "group_norm")[:3], t([2 / 3, -1 / 3, -1 / 3]) / (s + 1e-6), **TOL)
    torch.testing.assert_close(advantages(rewards, 3, "group_center")[3:], t([-1.0, 1.0, 0.0]), **TOL)
    with pytest.raises(ValueError, match="group_norm, group_center, rloo, reinforce_pp"):
        advantages(rewards, 3, "loo")


# ---------------------------------------------------------------- the objectives, transcribed

OLD = -1.3  # log pi_old of every token: the log pi that CISPO's loss multiplies is then log r - 1.3, not log r


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _cispo_token(r: float, a: float, lo: float, hi: float) -> tuple[float, float]:
    """MiniMax-M1 (arXiv 2506.13585) eqs. 4-5, one token: J = sg(clip(r, 1-eps_low, 1+eps_high)) A log pi.
    Returns (loss = -J, d loss / d log pi): the stop-gradient weight is a constant, so the derivative is -clip(r) A."""
    w = min(max(r, 1 - lo), 1 + hi)
    logp = math.log(r) + OLD
    return -w * a * logp, -w * a


def _sapo_token(r: float, a: float, tau_pos: float, tau_neg: float) -> tuple[float, float]:
    """SAPO (arXiv 2511.20347) eqs. 5-6, one token: J = f(r) A, f(r) = sigma(tau (r - 1)) 4/tau, tau by the sign of A.
    d f / d log pi = sigma'(tau (r-1)) tau r 4/tau = 4 p (1 - p) r."""
    tau = tau_pos if a > 0 else tau_neg
    p = _sigmoid(tau * (r - 1))
    return -p * 4 / tau * a, -4 * p * (1 - p) * r * a


def _gmpo_sequence(ratios: list[float], a: float, lo: float, hi: float) -> tuple[float, list[float]]:
    """GMPO (arXiv 2507.20673), one response: J = A * (prod_t min(r_t^s, clip(r_t^s, .))^(1/|o|))^s with s = sgn(A):
    each token's log-ratio is clipped to [-lo, hi] on the side that caps the objective (A > 0: above; A < 0: below),
    the clipped token then has no gradient. Returns (loss = -J, d loss / d log pi_t for each token)."""
    s = (a > 0) - (a < 0)
    logs, grads_on = [], []
    for r in ratios:
        x = math.log(r)
        clipped = (s > 0 and x > hi) or (s < 0 and x < -lo)
        logs.append(min(max(x, -lo), hi) if clipped else x)
        grads_on.append(0.0 if clipped else 1.0)
    n = len(ratios)
    geo = math.exp(sum(logs) / n)
    return -a * geo, [-a * geo * on / n for on in grads_on]


# ratios at 1, at the edges, just inside and outside them, and far out (clip_low 0.2, clip_high 0.28 for CISPO's test)
EDGE_RATIOS = [1.0, 0.8, 1.28, 0.8 - 1e-3, 0.8 + 1e-3, 1.28 - 1e-3, 1.28 + 1e-3, 0.3, 2.5]
ROWS_A = [1.5, -0.7]  # both signs


def _logp_grid(ratios: list[list[float]]) -> torch.Tensor:
    return torch.log(t(ratios)) + OLD  # [N, T]


def _weights(lengths: list[int], aggregation: str, n_seq: int) -> list[float]:
    """Per-token weight of each row in the aggregated loss (the DESIGN's formulas)."""
    if aggregation == "seq_mean_token_mean":
        return [1 / (n_seq * n) if n else 0.0 for n in lengths]
    if aggregation == "token_mean":
        return [1 / sum(lengths)] * len(lengths)
    return [1 / (n_seq * 9)] * len(lengths)  # seq_mean_token_sum_norm with max_len 9


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("objective", ["cispo", "sapo"])
def test_token_objectives_match_transcription(objective: str, aggregation: str) -> None:
    lo, hi, tau_pos, tau_neg = 0.2, 0.28, 1.0, 1.05
    ratios = [EDGE_RATIOS, EDGE_RATIOS]
    lengths = [9, 7]  # the second row's last two tokens are padding
    mask = t([[1.0] * 9, [1.0] * 7 + [0.0] * 2])
    logp = _logp_grid(ratios).requires_grad_(True)
    old = torch.full_like(logp, OLD)
    loss, m = policy_loss(logp, old, t(ROWS_A), mask, objective=objective, ratio="token", clip_low=lo, clip_high=hi,
                          aggregation=aggregation, max_len=9, sapo_tau_pos=tau_pos, sapo_tau_neg=tau_neg)  # fmt: skip
    loss.backward()
    weights = _weights(lengths, aggregation, 2)
    value, grad = 0.0, [[0.0] * 9 for _ in ratios]
    for i, (row, a) in enumerate(zip(ratios, ROWS_A)):
        for j, r in enumerate(row[: lengths[i]]):
            lv, g = _cispo_token(r, a, lo, hi) if objective == "cispo" else _sapo_token(r, a, tau_pos, tau_neg)
            value += weights[i] * lv
            grad[i][j] = weights[i] * g
    assert loss.item() == pytest.approx(value, rel=1e-12)
    assert m["pg_loss"] == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(logp.grad, t(grad), **TOL)


def test_cispo_keeps_every_tokens_gradient_and_equals_the_policy_gradient_at_ratio_one() -> None:
    # beyond the band the PPO clip zeroes a token's gradient; CISPO's stays, weighted by the truncated ratio
    r = t([[2.5, 0.3]])
    for a in (1.0, -1.0):
        logp = (torch.log(r) + OLD).requires_grad_(True)
        kw = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean")
        policy_loss(logp, torch.full_like(logp, OLD), t([a]), torch.ones(1, 2), objective="cispo", **kw)[0].backward()
        torch.testing.assert_close(logp.grad, t([[-1.28 * a, -0.8 * a]]) / 2, **TOL)
        assert (logp.grad != 0).all()
    # ratio 1: the gradient of every objective is the on-policy policy gradient -A d log pi (clip's included)
    logp = torch.full((2, 3), OLD, dtype=F64)
    for objective in ("clip", "cispo", "sapo", "gmpo"):
        w = logp.clone().requires_grad_(True)
        policy_loss(w, logp, t([0.5, -2.0]), torch.ones(2, 3), objective=objective, ratio="token", clip_low=0.2,
                    clip_high=0.28, aggregation="token_mean")[0].backward()  # fmt: skip
        torch.testing.assert_close(w.grad, t([[-0.5] * 3, [2.0] * 3]) / 6, **TOL)


def test_sapo_value_at_ratio_one_and_the_sharper_negative_gate() -> None:
    # f(1) = sigma(0) 4/tau = 2/tau: the loss at ratio 1 is -2A/tau, tau by A's sign
    logp = torch.full((2, 1), OLD, dtype=F64)
    loss, _ = policy_loss(logp, logp, t([1.0, -1.0]), torch.ones(2, 1), objective="sapo", ratio="token", clip_low=0.2,
                          clip_high=0.2, aggregation="token_mean", sapo_tau_pos=1.0, sapo_tau_neg=1.05)  # fmt: skip
    assert loss.item() == pytest.approx((-2 / 1.0 + 2 / 1.05) / 2, rel=1e-14)
    # the gate's weight 4 p (1 - p) decays away from r = 1, faster for the larger tau
    grads = []
    for tau in (1.0, 4.0):
        w = (torch.log(t([[1.6]])) + OLD).requires_grad_(True)
        policy_loss(w, torch.full_like(w, OLD), t([-1.0]), torch.ones(1, 1), objective="sapo", ratio="token",
                    clip_low=0.2, clip_high=0.2, aggregation="token_mean", sapo_tau_neg=tau)[0].backward()  # fmt: skip
        grads.append(w.grad.item())
    assert 0 < grads[1] < grads[0] < 1.6


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gmpo_matches_transcription(aggregation: str) -> None:
    lo, hi = 0.4, 0.3  # asymmetric, so that clipping the log-ratio itself (not sgn(A) log r) is what is checked
    e_lo, e_hi = math.exp(-lo), math.exp(hi)
    row = [1.0, e_lo, e_hi, e_lo * 0.999, e_lo * 1.001, e_hi * 0.999, e_hi * 1.001, 0.3, 2.5]
    ratios = [row, row, row[::-1]]
    adv = [1.5, -0.7, 0.0]  # A = 0: loss and gradient exactly 0
    lengths = [9, 6, 9]
    mask = t([[1.0] * 9, [1.0] * 6 + [0.0] * 3, [1.0] * 9])
    logp = _logp_grid(ratios).requires_grad_(True)
    loss, m = policy_loss(logp, torch.full_like(logp, OLD), t(adv), mask, objective="gmpo", ratio="token",
                          clip_low=lo, clip_high=hi, aggregation=aggregation, max_len=9)  # fmt: skip
    loss.backward()
    weights = _weights(lengths, aggregation, 3)
    value, grad = 0.0, [[0.0] * 9 for _ in ratios]
    for i, (r, a) in enumerate(zip(ratios, adv)):
        seq_loss, seq_grad = _gmpo_sequence(r[: lengths[i]], a, lo, hi)
        value += weights[i] * lengths[i] * seq_loss  # the response's value on each of its tokens, aggregated
        for j, g in enumerate(seq_grad):
            grad[i][j] = weights[i] * lengths[i] * g
    assert loss.item() == pytest.approx(value, rel=1e-12)
    assert m["pg_loss"] == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(logp.grad, t(grad), **TOL)
    assert logp.grad[2].abs().sum() == 0  # A = 0
    # the clipped tokens carry no gradient: A > 0 above e^hi, A < 0 below e^-lo
    assert logp.grad[0, 6] == 0 and logp.grad[0, 8] == 0 and logp.grad[0, 7] != 0
    assert logp.grad[1, 3] == 0 and logp.grad[1, 4] != 0
    # clip metrics count the log-space band (e^-lo, e^hi)
    assert m["clip_frac_high"] == pytest.approx(2 / 24) and m["clip_frac_low"] == pytest.approx(1 / 24)


def test_gmpo_is_the_geometric_mean_not_the_arithmetic() -> None:
    r = [1.2, 0.9, 1.1]  # inside the band: l = -A (prod r)^(1/3)
    logp = _logp_grid([r])
    loss, _ = policy_loss(logp, torch.full_like(logp, OLD), t([1.0]), torch.ones(1, 3), objective="gmpo", ratio="token",
                          clip_low=0.4, clip_high=0.4, aggregation="seq_mean_token_mean")  # fmt: skip
    assert loss.item() == pytest.approx(-((1.2 * 0.9 * 1.1) ** (1 / 3)), rel=1e-13)
    assert abs(loss.item() + statistics.fmean(r)) > 1e-4


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"objective": "ppo"}, "clip, cispo, sapo, gmpo"),
        ({"objective": "gmpo", "ratio": "sequence"}, "gmpo"),
        ({"objective": "cispo", "clip_ratio_c": 3.0}, "clip_ratio_c"),
    ],
)
def test_objective_misuse_is_an_error(kw: dict, match: str) -> None:
    base = dict(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean")
    base.update(kw)
    x = torch.zeros(2, 4, dtype=F64)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, t([1.0, -1.0]), torch.ones(2, 4), **base)


# ---------------------------------------------------------------- invariance and empty rows

N, T = 8, 5
LENGTHS = [5, 3, 1, 4, 2, 5, 3, 0]  # uneven, one overlong-filtered row
OBJECTIVE_CASES = [
    (objective, aggregation, extra)
    for objective, aggregation in itertools.product(["cispo", "sapo", "gmpo"], AGGREGATIONS)
    for extra in ({}, {"kl_coef": 0.1})
] + [("cispo", "token_mean", {"ratio": "sequence"}), ("sapo", "seq_mean_token_mean", {"ratio": "sequence_token"})]


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=gen, dtype=F64) * 3  # [N, T]
    noise = torch.randn(N, T, generator=gen, dtype=F64) + torch.randn(N, 1, generator=gen, dtype=F64)
    old = logp + 0.3 * noise  # [N, T]
    ref = logp + 0.3 * torch.randn(N, T, generator=gen, dtype=F64)
    adv = torch.randn(N, generator=gen, dtype=F64)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).to(F64)  # [N, T]
    return logp, old, ref, adv, mask


@pytest.mark.parametrize(("objective", "aggregation", "extra"), OBJECTIVE_CASES)
def test_micro_batches_reproduce_full_batch_gradient(objective: str, aggregation: str, extra: dict) -> None:
    kw = dict(ratio="token", objective=objective, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_len=T)
    kw.update(extra)
    grad = assert_micro_batches_match(_batch(), kw, (1, 2, 3, N), rtol=1e-10, atol=1e-14)
    assert torch.equal(grad[7], torch.zeros(T, dtype=F64))  # the empty row
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("recipe", ["cispo", "sapo", "gmpo"])
def test_recipe_options_reach_the_loss(recipe: str) -> None:
    """The learner's loss options carry the recipe's objective and gate temperatures into policy_loss unchanged."""
    from conftest import compose_config

    from rlvr.config import validate
    from rlvr.learner import loss_options

    cfg = validate(compose_config(f"recipe={recipe}"))
    options = loss_options(cfg)
    assert options.objective == recipe
    assert (options.sapo_tau_pos, options.sapo_tau_neg) == (cfg.algo.sapo_tau_pos, cfg.algo.sapo_tau_neg) == (1.0, 1.05)
    logp, old, ref, adv, mask = _batch()
    loss, _ = policy_loss(logp, old, adv, mask, ref_logprobs=ref, engine_logprobs=old, **options.kwargs())  # weights 1
    direct, _ = policy_loss(logp, old, adv, mask, objective=recipe, ratio="token", clip_low=cfg.algo.clip_low,
                            clip_high=cfg.algo.clip_high, aggregation=cfg.algo.aggregation.value, max_len=options.max_len,
                            rollout_correction="none")  # fmt: skip
    assert loss.item() == direct.item()
