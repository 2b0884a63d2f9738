"""Pure tensor math of RLVR (~470 lines, one job: the loss's contract, docs/DESIGN.md "The math"): advantages (group,
leave-one-out, batch-normalised), the dynamic-sampling filter, overlong reward shaping, importance ratios, the
policy-gradient objectives (PPO's clip, CISPO, SAPO, GMPO), the KL penalty and loss aggregation.

Notation: N = B*G responses, G consecutive rows per prompt group; T = padded response length;
mask[N, T] marks the tokens that count (0/1 or bool); |o_i| = mask[i].sum(). Values at padded positions
are selected out, never trusted, but should be finite so that gradients stay finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from rlvr.choices import Advantage, Aggregation, KLEstimator, Objective, Ratio, RolloutCorrection

# the string arguments' valid values (rlvr.choices defines each closed set once)
ADVANTAGES = tuple(a.value for a in Advantage)
OBJECTIVES = tuple(o.value for o in Objective)
RATIOS = tuple(r.value for r in Ratio)
AGGREGATIONS = tuple(a.value for a in Aggregation)
KL_ESTIMATORS = tuple(k.value for k in KLEstimator)
ROLLOUT_CORRECTIONS = tuple(c.value for c in RolloutCorrection)


def _invalid(name: str, value: object, choices: tuple[str, ...]) -> ValueError:
    return ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")


def _count(x: float | Tensor, like: Tensor) -> Tensor:
    """A normalizer as a 0-d tensor, clamped at 1 so that an empty batch gives 0, not NaN."""
    return torch.as_tensor(x, dtype=like.dtype, device=like.device).clamp(min=1)  # []


def group_advantages(rewards: Tensor, group_size: int, *, scale_by_std: bool, eps: float = 1e-6) -> Tensor:
    """Group-relative advantage of each response (rewards: [N], G = group_size consecutive rows per group).

    GRPO/DAPO/GSPO (scale_by_std=True): A_i = (R_i - mean_g R) / (std_g R + eps), std with Bessel's correction.
    Dr.GRPO (scale_by_std=False):       A_i = R_i - mean_g R.
    group_size == 1: the std is undefined and a lone sample has no group-relative signal, so A_i = 0 (not NaN).
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    adv = grouped - grouped.mean(dim=1, keepdim=True)  # [B, G]
    if scale_by_std and group_size > 1:
        adv = adv / (grouped.std(dim=1, keepdim=True) + eps)  # [B, G]
    return adv.reshape(-1)  # [N]


def advantages(rewards: Tensor, group_size: int, mode: str, *, eps: float = 1e-6) -> Tensor:
    """Each response's advantage (rewards: [N], G = group_size consecutive rows per group) -> [N], by `mode`:

    group_norm (GRPO, DAPO, GSPO):  (R_i - mean_g R) / (std_g R + eps)            (`group_advantages`)
    group_center (Dr.GRPO):         R_i - mean_g R                                 (`group_advantages`)
    rloo (RLOO; Kool et al. 2019, Ahmadian et al., arXiv 2402.14740):
                                    R_i - (1/(G-1)) sum_{j in g, j != i} R_j       (`rloo_advantages`)
    reinforce_pp (REINFORCE++, arXiv 2501.03262, "advantage normalization"):
                                    (R_i - mean_B R) / (std_B R + eps) over all N  (`batch_advantages`)
    """
    if mode in ("group_norm", "group_center"):
        return group_advantages(rewards, group_size, scale_by_std=mode == "group_norm", eps=eps)
    if mode == "rloo":
        return rloo_advantages(rewards, group_size)
    if mode == "reinforce_pp":
        return batch_advantages(rewards, eps=eps)
    raise _invalid("advantage", mode, ADVANTAGES)


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """rewards [N] -> [B, G] (floating point), with the shape checked."""
    if group_size < 1 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size; "
            f"got shape {tuple(rewards.shape)} and group_size={group_size}"
        )
    grouped = rewards.reshape(-1, group_size)  # [B, G]
    return grouped if grouped.is_floating_point() else grouped.to(torch.get_default_dtype())


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Leave-one-out baseline (RLOO): A_i = R_i - (1/(G-1)) sum_{j != i} R_j over the other responses of the same
    prompt (rewards: [N] -> [N]); equal to G/(G-1) (R_i - mean_g R). group_size == 1: no other sample, A_i = 0."""
    grouped = _grouped(rewards, group_size)  # [B, G]
    if group_size == 1:
        return torch.zeros_like(grouped).reshape(-1)  # [N]
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # [B, G]
    return (grouped - others).reshape(-1)  # [N]


def batch_advantages(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++'s global normalisation: A_i = (R_i - mean R) / (std R + eps) over the whole step's N responses
    (rewards: [N] -> [N]; std with Bessel's correction, as group_norm's). One response: A = 0 (not NaN)."""
    r = _grouped(rewards, 1).reshape(-1)  # [N]
    if r.numel() < 2:
        return torch.zeros_like(r)
    return (r - r.mean()) / (r.std() + eps)  # [N]


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """DAPO dynamic sampling: keep a group only if 0 < |{o_i correct}| < G, i.e. its scores [N] are not all
    (exactly) equal. Returns a bool per group: [N // group_size]."""
    if group_size < 1 or scores.ndim != 1 or scores.numel() % group_size:
        raise ValueError(
            f"scores must be 1-D with a length divisible by group_size; "
            f"got shape {tuple(scores.shape)} and group_size={group_size}"
        )
    grouped = scores.reshape(-1, group_size)  # [B, G]
    return (grouped != grouped[:, :1]).any(dim=1)  # [B]


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer: float, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment, added to the reward (lengths: [N] generated tokens, buffer = L_cache):

    R_len = 0                                          if |o| <= L_max - L_cache
          = ((L_max - L_cache) - |o|) / L_cache * factor  if L_max - L_cache < |o| <= L_max
          = -factor                                    if |o| > L_max
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"buffer must satisfy 0 < buffer <= max_len; got buffer={buffer}, max_len={max_len}")
    length = lengths if lengths.is_floating_point() else lengths.to(torch.get_default_dtype())  # [N]
    start = max_len - buffer
    inside = (start - length) / buffer * factor  # [N]
    beyond = torch.full_like(length, -factor)  # [N]
    return torch.where(length <= start, torch.zeros_like(length), torch.where(length <= max_len, inside, beyond))


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, "Approximating KL").

    With d = log pi_ref - log pi_theta:  k1 = -d,  k2 = d^2 / 2,  k3 = exp(d) - d - 1 (>= 0, unbiased; GRPO).
    logprobs, ref_logprobs: [N, T] -> [N, T].
    """
    d = ref_logprobs - logprobs  # [N, T]
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise _invalid("kl_estimator", estimator, KL_ESTIMATORS)


def importance_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Importance ratio pi_theta / pi_old, as [N, T] (inputs [N, T]).

    token (GRPO, DAPO):          r_it = exp(logp_it - old_it).
    sequence (GSPO):             s_i = exp((1/|o_i|) sum_t mask*(logp - old)), the length-normalised
                                 geometric mean, copied to every token; gradient flows through logp.
    sequence_token (GSPO-token): s_it = sg(s_i) * exp(logp_it - sg(logp_it)): s_i in value, per-token gradient.
    """
    keep = mask.bool()  # [N, T]
    log_r = torch.where(keep, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [N, T]
    if mode == "token":
        return torch.exp(log_r)  # [N, T]
    lengths = keep.sum(dim=-1, keepdim=True).to(logprobs.dtype).clamp(min=1)  # [N, 1]
    log_s = log_r.sum(dim=-1, keepdim=True) / lengths  # [N, 1]
    if mode == "sequence":
        return torch.exp(log_s).expand_as(logprobs)  # [N, T]
    if mode == "sequence_token":
        return torch.exp(log_s.detach() + log_r - log_r.detach())  # [N, T]
    raise _invalid("ratio", mode, RATIOS)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_len: int | None = None,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss [N, T] to a scalar; the normalizer spans the whole optimizer step.

    seq_mean_token_mean (GRPO, GSPO):   (1/N_seq) sum_i (1/|o_i|) sum_t mask*l
    seq_mean_token_sum_norm (Dr.GRPO):  (1/(N_seq * L_max)) sum_i sum_t mask*l
    token_mean (DAPO):                  sum_i sum_t mask*l / N_tok
    N_seq = num_sequences or the rows handed in; N_tok = num_tokens or mask.sum(). Passing the global counts
    to every micro-batch (and rank) makes the summed micro-batch losses equal the full-batch loss.
    A row with |o_i| = 0 contributes exactly 0.
    """
    keep = mask.bool()  # [N, T]
    masked = torch.where(keep, loss_mat, torch.zeros_like(loss_mat))  # [N, T]
    n_seq = _count(loss_mat.shape[0] if num_sequences is None else num_sequences, loss_mat)  # []
    if mode == "seq_mean_token_mean":
        lengths = keep.sum(dim=-1).to(loss_mat.dtype).clamp(min=1)  # [N]
        return (masked.sum(dim=-1) / lengths).sum() / n_seq
    if mode == "seq_mean_token_sum_norm":
        if max_len is None:
            raise ValueError("aggregation 'seq_mean_token_sum_norm' requires max_len")
        return masked.sum() / (n_seq * max_len)
    if mode == "token_mean":
        return masked.sum() / _count(keep.sum() if num_tokens is None else num_tokens, loss_mat)
    raise _invalid("aggregation", mode, AGGREGATIONS)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x [N, T] over the tokens mask [N, T] keeps; 0 when it keeps none."""
    keep = mask.bool()  # [N, T]
    return torch.where(keep, x, torch.zeros_like(x)).sum() / _count(keep.sum(), x)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position: H = logsumexp(z) - sum_v softmax(z)_v z_v. [N, T, V] -> [N, T]."""
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def rollout_correction_weights(ratio: Tensor, mode: str, cap: float) -> Tensor:
    """Per-token weights [N, T] that correct for the engine sampling from slightly other numbers than the learner's,
    from ratio = pi_old(o_t) / pi_engine(o_t) [N, T] (`engine_ratio`): the learner's probability of the sampled token
    under the weights that sampled it over the engine's own.

    none:            w = 1.
    token_truncated: w_t = min(ratio_t, cap) (truncated importance sampling, as verl's `rollout_is: token` and TRL's
                     `token_truncate`).
    """
    if mode == "none":
        return torch.ones_like(ratio)
    if mode == "token_truncated":
        return ratio.clamp(max=cap)  # [N, T]
    raise _invalid("rollout_correction", mode, ROLLOUT_CORRECTIONS)


def engine_ratio(old_logprobs: Tensor, engine_logprobs: Tensor) -> Tensor:
    """pi_old / pi_engine per token [N, T], detached; the log-ratio is clamped to [-20, 20] before exp, so a token the
    engine gave probability ~0 stays finite."""
    return torch.exp((old_logprobs - engine_logprobs).detach().clamp(-20.0, 20.0))


def surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    objective: str,
    ratio: str,
    clip_low: float,
    clip_high: float,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
) -> tuple[Tensor, Tensor, tuple[float, float]]:
    """The policy-gradient term per token to minimise, by `objective` (logprobs, old_logprobs, mask: [N, T];
    advantages: [N]). Returns (loss [N, T], the ratio [N, T] the metrics describe, the ratio band (lo, hi) they count
    as clipped). r is `importance_ratio(..., ratio)`, A the response's advantage, sg the stop-gradient.

    clip (PPO; GRPO, Dr.GRPO, DAPO, GSPO):  l = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A).
    cispo (MiniMax-M1, arXiv 2506.13585, eqs. 4-5):  l = -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi_theta.
        Every token keeps a gradient, weighted by its truncated IS ratio: d l / d logp = -clip(r) A.
    sapo (Soft Adaptive Policy Optimization, arXiv 2511.20347, eqs. 5-6):  l = -f(r) A,
        f(r) = sigmoid(tau (r - 1)) 4 / tau,  tau = sapo_tau_pos if A > 0 else sapo_tau_neg.
        d l / d logp = -4 p (1 - p) r A with p = sigmoid(tau (r - 1)): the plain policy gradient at r = 1, decaying
        smoothly away from it (faster for tau_neg > tau_pos). f(1) = 2 / tau, so the loss's value at r = 1 is -2A/tau.
    gmpo (Geometric-Mean Policy Optimization, arXiv 2507.20673, the clipped objective of sec. 3):  one value per
        response, copied to its tokens:  l_i = -A_i exp((1/|o_i|) sum_t m_it),  with the token log-ratios clipped in
        log space on the side PPO clips: m = sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -clip_low, clip_high)),
        i.e. the geometric mean of the pessimistically clipped token ratios, ratio band (e^-clip_low, e^clip_high).
        It takes the token ratios itself (ratio must be token).
    """
    adv = advantages.to(logprobs.dtype)[:, None]  # [N, 1]
    if objective == "gmpo":
        if ratio != "token":
            raise ValueError(f"objective 'gmpo' takes the token ratios (its own geometric mean); got ratio {ratio!r}")
        keep = mask.bool()  # [N, T]
        log_r = torch.where(keep, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [N, T]
        sign = torch.sign(adv)  # [N, 1]
        kept = sign * torch.minimum(sign * log_r, sign * log_r.clamp(-clip_low, clip_high))  # [N, T]
        lengths = keep.sum(dim=-1, keepdim=True).to(logprobs.dtype).clamp(min=1)  # [N, 1]
        geo = torch.exp(kept.sum(dim=-1, keepdim=True) / lengths)  # [N, 1]
        return (-adv * geo).expand_as(logprobs), torch.exp(log_r), (math.exp(-clip_low), math.exp(clip_high))
    r = importance_ratio(logprobs, old_logprobs, mask, ratio)  # [N, T]
    band = (1 - clip_low, 1 + clip_high)
    if objective == "clip":
        return torch.maximum(-adv * r, -adv * r.clamp(*band)), r, band
    if objective == "cispo":
        return -adv * r.clamp(*band).detach() * logprobs, r, band
    if objective == "sapo":
        tau = torch.where(adv > 0, adv.new_tensor(sapo_tau_pos), adv.new_tensor(sapo_tau_neg))  # [N, 1]
        return -adv * torch.sigmoid(tau * (r - 1)) * (4 / tau), r, band
    raise _invalid("objective", objective, OBJECTIVES)


def metric_units(mask: Tensor, ratio: str) -> Tensor:
    """What policy_loss's ratio and clip statistics average over: counted tokens for the token ratio ([N, T]),
    non-empty sequences when the ratio is one value per sequence ([N])."""
    return mask.bool() if ratio == "token" else mask.bool().any(dim=-1)


def policy_loss_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio: str,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    max_len: int | None = None,
    objective: str = "clip",
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    clip_ratio_c: float | None = None,
    engine_logprobs: Tensor | None = None,
    rollout_correction: str = "none",
    rollout_correction_cap: float = 2.0,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    loss_scale: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss to minimise, per token: the `surrogate` of `objective` (clip: PPO/GRPO's clipped surrogate, DAPO's
    clip-higher with clip_high > clip_low; cispo; sapo; gmpo), plus kl_coef * KL_estimator(pi_theta || pi_ref):

    clip:  l = -min(r*A, clip(r, 1 - clip_low, 1 + clip_high)*A)  [+ kl_coef * KL]
    with r from `importance_ratio` and, if clip_ratio_c (> 1) is set (objective clip only), the dual clip for A < 0
    (verl): l = min(l, -clip_ratio_c * A), i.e. the loss of a negative-advantage token is capped at clip_ratio_c*|A|.
    With rollout_correction, the surrogate of each token is multiplied by `rollout_correction_weights` (computed from
    old_logprobs and engine_logprobs [N, T]); the metrics then include the untruncated ratio's token mean and max
    and the share of tokens whose ratio exceeded the cap.
    Aggregated by `aggregate`, then multiplied by loss_scale: the learner passes world_size there, because
    FSDP/DDP average gradients over ranks while the global normalizer already divides by the global count.

    logprobs, old_logprobs, ref_logprobs, mask: [N, T]; advantages: [N]. Returns (loss [], metrics) where the
    metrics (float64 tensors [], on the inputs' device: reading them is left to the caller, so that a learner syncs
    with the device once per update, not once per metric) cover this call's counted tokens, or its non-empty
    sequences for sequence ratios; pg_loss is the loss without KL and without loss_scale, so it sums over
    micro-batches and ranks. `policy_loss` is the same with the metrics as floats.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip; got {clip_ratio_c}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 requires ref_logprobs")
    if clip_ratio_c is not None and objective != "clip":
        raise ValueError(f"clip_ratio_c (the dual clip) is a term of the clip objective; got objective {objective!r}")
    pg, r, (lo, hi) = surrogate(
        logprobs, old_logprobs, advantages, mask, objective=objective, ratio=ratio, clip_low=clip_low,
        clip_high=clip_high, sapo_tau_pos=sapo_tau_pos, sapo_tau_neg=sapo_tau_neg,
    )  # fmt: skip
    adv = advantages.to(logprobs.dtype)[:, None]  # [N, 1]
    if clip_ratio_c is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_ratio_c), pg)  # [N, T]
    to_engine = None  # pi_old / pi_engine [N, T] when the correction is on
    if rollout_correction != "none":
        if engine_logprobs is None:
            raise ValueError(f"rollout_correction {rollout_correction!r} requires engine_logprobs")
        to_engine = engine_ratio(old_logprobs, engine_logprobs)
        pg = pg * rollout_correction_weights(to_engine, rollout_correction, rollout_correction_cap)  # the KL term is not weighted (verl, TRL)
    loss_mat = pg  # [N, T]
    if kl_coef > 0:
        assert ref_logprobs is not None
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)  # [N, T]
        loss_mat = pg + kl_coef * kl

    def agg(x: Tensor) -> Tensor:  # [N, T] -> []
        return aggregate(x, mask, aggregation, max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)

    loss = agg(loss_mat) * loss_scale  # []

    with torch.no_grad():
        units = metric_units(mask, ratio)  # [N, T] or [N]
        if units.dim() == 2:
            r_u, a_u = r[units], adv.expand_as(r)[units]  # [U]
        else:
            r_u, a_u = r[:, 0][units], adv[:, 0][units]  # [U]
        low = (r_u < lo) & (a_u < 0)  # [U]: the ratio beyond the band on the side the clip stops (sapo: gates)
        high = (r_u > hi) & (a_u > 0)  # [U]
        metrics = {
            "clip_frac_low": _frac(low),
            "clip_frac_high": _frac(high),
            "clip_frac": _frac(low | high),
            "ratio_mean": _stat(r_u, torch.mean, 1.0),
            "ratio_min": _stat(r_u, torch.min, 1.0),
            "ratio_max": _stat(r_u, torch.max, 1.0),
            "pg_loss": agg(pg).to(torch.float64),
        }
        if clip_ratio_c is not None:
            pg_u = torch.maximum(-a_u * r_u, -a_u * r_u.clamp(1 - clip_low, 1 + clip_high))  # [U]
            metrics["dual_clip_frac"] = _frac((a_u < 0) & (pg_u > -a_u * clip_ratio_c))
        if kl_coef > 0:
            metrics["kl"] = masked_mean(kl, mask).to(torch.float64)
        if to_engine is not None:
            raw = to_engine[mask.bool()]  # [M] untruncated
            metrics["rollout_ratio_mean"] = _stat(raw, torch.mean, 1.0)
            metrics["rollout_ratio_max"] = _stat(raw, torch.max, 1.0)
            metrics["rollout_capped_frac"] = _frac(raw > rollout_correction_cap)
    return loss, metrics


@dataclass(frozen=True)
class LossOptions:
    """The run's loss options (the recipe's algo.* and rollout.max_new_tokens), as the loop hands them to the learner:
    policy_loss_terms' keyword arguments of that name."""

    ratio: str
    clip_low: float
    clip_high: float
    aggregation: str
    max_len: int | None = None
    objective: str = "clip"
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    clip_ratio_c: float | None = None
    rollout_correction: str = "none"
    rollout_correction_cap: float = 2.0

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


def combine_metrics(parts: list[tuple[dict[str, Tensor], dict[str, Tensor]]]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Micro-batches' policy_loss metrics -> the mini-batch's, on this rank: `parts` holds each micro-batch's metrics
    and its shares ({"tokens": its counted tokens / the mini-batch's, "units": the same for metric units}). Returns
    (sums: the "sum" metrics summed, the "tokens"/"units" ones weighted by their shares and summed; extremes: the
    largest "max" metric, and the largest negated "min" one), each a 0-d tensor: summing the sums and taking the
    largest extremes over ranks gives the global values (METRIC_REDUCTIONS)."""
    sums: dict[str, Tensor] = {}
    extremes: dict[str, Tensor] = {}
    for metrics, share in parts:
        for k, v in metrics.items():
            how = METRIC_REDUCTIONS.get(k, "units")
            if how in ("sum", "tokens", "units"):
                term = v if how == "sum" else v * share[how]
                sums[k] = sums[k] + term if k in sums else term
            else:
                v = v if how == "max" else -v
                extremes[k] = torch.maximum(extremes[k], v) if k in extremes else v
    return sums, extremes


def policy_loss(*args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
    """`policy_loss_terms` (same arguments) with its metrics read as floats, all at once."""
    loss, metrics = policy_loss_terms(*args, **kwargs)
    return loss, as_floats(metrics)


def as_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    """0-d tensors -> floats with one device-to-host copy."""
    values = torch.stack([v.to(torch.float64) for v in metrics.values()]).tolist() if metrics else []
    return dict(zip(metrics, values))


# How policy_loss's metrics of several micro-batches (and ranks) combine into the mini-batch's: "sum" as they are,
# "tokens" / "units" weighted by the micro-batch's share of counted tokens / of metric units, "max" / "min" over them.
METRIC_REDUCTIONS = {
    "pg_loss": "sum",
    "kl": "tokens",
    "rollout_ratio_mean": "tokens",
    "rollout_capped_frac": "tokens",
    "rollout_ratio_max": "max",
    "ratio_max": "max",
    "ratio_min": "min",
}  # every other metric: "units"


def _frac(flags: Tensor) -> Tensor:
    """Fraction of True in flags [U] (float64 []); 0 when empty."""
    return flags.double().mean() if flags.numel() else flags.new_zeros((), dtype=torch.float64)


def _stat(x: Tensor, reduce: Callable[[Tensor], Tensor], empty: float) -> Tensor:
    """reduce(x) in x's dtype, as float64 []; `empty` when x has no elements."""
    return reduce(x).to(torch.float64) if x.numel() else x.new_full((), empty, dtype=torch.float64)
