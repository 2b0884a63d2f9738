"""The bf16 path (the default on GPUs and on CPUs with AVX512-BF16): the chunked LM head under autocast, its backward,
and a learner update, against float64 / fp32 references, with tolerances derived from bf16's precision.

Notation: u = 2^-8 is bf16's unit roundoff (8 significant bits, round to nearest: |fl(x) - x| <= u |x|); fp32's is
2^-24. For logits z_vj = sum_i h_vi W_ji / T, S_vj = sum_i |h_vi W_ji| / T is the sum of the absolute terms.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from learners import make_learner

from rlvr.algo import LossOptions
from rlvr.learner import Learner
from rlvr.lm_head import response_logprobs, token_logprobs
from tests.test_learner import synthetic_batch, update_with_gradient

U_BF16 = 2.0**-8
U_FP32 = 2.0**-24
SLACK = 1.25  # covers the second-order terms the first-order bounds below leave out (products of two roundoffs)

M, H, V = 70, 64, 257  # tokens, hidden size, vocabulary
CHUNK = 16  # tokens per chunk: 4 full chunks and a partial one of 6
TEMPERATURE = 0.7


def head_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 hidden [M, H] (RMS-normed scale), weight [V, H] (logits of std ~3 at T = 0.7), targets [M], upstream grad [M]."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(M, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.25
    targets = torch.randint(0, V, (M,), generator=g)
    upstream = torch.randn(M, generator=g)
    return hidden, weight, targets, upstream


def logit_error_bound(hidden: torch.Tensor, weight: torch.Tensor, u: float) -> torch.Tensor:
    """delta [M]: a bound on max_j |z_hat_vj - z_vj| for the logits computed at precision u from fp32 h and W.

    h and W are rounded to bf16 (u|h_i|, u|W_ji|: 2u S_vj on the products to first order), the product is summed in
    fp32 (H * 2^-24 S_vj) and rounded to bf16 (u |z_vj| <= u S_vj): |dz_vj| <= (3u + H 2^-24) S_vj. Dividing by T is
    exact enough (in fp32).
    """
    s = hidden.double().abs() @ weight.double().abs().T / TEMPERATURE  # [M, V] S
    return ((3 * u + H * U_FP32) * s).amax(-1)  # [M]


def float64_reference(hidden, weight, targets):
    """log p [M], entropy [M], softmax p [M, V] and z [M, V] in float64 from the same (fp32) weights."""
    z = hidden.double() @ weight.double().T / TEMPERATURE
    logsm = torch.log_softmax(z, -1)
    p = logsm.exp()
    return logsm.gather(-1, targets[:, None])[:, 0], -(p * logsm).sum(-1), p, z


def test_chunked_head_under_bf16_autocast_matches_float64_within_bf16_roundoff():
    """Forward: log softmax(z)[t] = z_t - logsumexp(z), and |d logsumexp| <= max_j |dz_j| (its gradient is the
    softmax, which sums to 1), so |d logp| <= 2 delta. The entropy's gradient in z_j is -p_j (z_j - zbar) with
    zbar = sum p z, so |dH| <= delta * sum_j p_j |z_j - zbar| (first order; SLACK covers the rest). Asserted: the
    observed error is within the bf16 bound, and above the same bound with u = 2^-24 (~3000 times smaller), which an
    fp32 computation could not exceed: bf16 really ran. Then, tighter: against torch's log_softmax of the same bf16
    logits, only fp32 roundoff apart."""
    torch.set_num_threads(1)
    hidden, weight, targets, _ = head_data()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as rlvr.learner's _autocast does
        logp, entropy = token_logprobs(
            hidden, weight, targets, temperature=TEMPERATURE, with_entropy=True, chunk_tokens=CHUNK
        )
    assert logp.dtype == torch.float32 and entropy is not None  # softmax and logsumexp in fp32 under bf16
    ref_logp, ref_entropy, p, z = float64_reference(hidden, weight, targets)
    zbar = (p * z).sum(-1, keepdim=True)
    spread = (p * (z - zbar).abs()).sum(-1)  # [M]
    for u, name in ((U_BF16, "bf16"), (U_FP32, "fp32")):
        delta = logit_error_bound(hidden, weight, u)
        bound_logp, bound_entropy = SLACK * 2 * delta, SLACK * delta * spread
        err_logp, err_entropy = (logp.double() - ref_logp).abs(), (entropy.double() - ref_entropy).abs()
        if name == "bf16":
            assert (err_logp <= bound_logp).all(), (err_logp / bound_logp).max()
            assert (err_entropy <= bound_entropy).all(), (err_entropy / bound_entropy).max()
        else:  # not tiny: an fp32-vs-fp64 comparison would sit under these
            assert err_logp.max() > max(bound_logp.max(), 1e-6), (err_logp.max(), bound_logp.max())
            assert err_entropy.max() > max(bound_entropy.max(), 1e-6), (err_entropy.max(), bound_entropy.max())

    # the same bf16 logits, formed chunk by chunk as the head does (bf16 product, then fp32), through torch's log_softmax:
    # only fp32 arithmetic differs, each of the ~V + 4 roundings in logsumexp and the entropy's sums at most 2^-24 of
    # max|z| + |logsumexp| (2^-24 (V + 4) (2 max|z| + |lse|) bounds both): a softmax in bf16 would be ~2^-8 off
    zb = (
        torch.cat([hidden[s : s + CHUNK].bfloat16() @ weight.bfloat16().T for s in range(0, M, CHUNK)]).float()
        / TEMPERATURE
    )
    lsm = torch.log_softmax(zb, -1)
    plain_logp, plain_entropy = lsm.gather(-1, targets[:, None])[:, 0], -(lsm.exp() * lsm).sum(-1)
    lse_b = torch.logsumexp(zb.double(), -1)
    fp32_bound = SLACK * (V + 4) * U_FP32 * (2 * zb.double().abs().amax(-1) + lse_b.abs())
    for got, ref in ((logp, plain_logp), (entropy, plain_entropy)):
        err = (got.double() - ref.double()).abs()
        assert (err <= fp32_bound).all(), (err / fp32_bound).max()


def dz_bound(g, p, dz, delta, u, flips):
    """Bound [M, V] on the error of d logp / dz = g (onehot(t) - p) / T once rounded to bf16: the softmax at
    logits off by delta (row's max) is off by a factor within e^(+-2 delta), so |dp_j| <= (e^(2 delta) - 1) p_j;
    rounding dz to bf16 adds u |dz| (flips = 2: two roundings of nearly equal fp32 values may land one ulp apart)."""
    return g.abs()[:, None] / TEMPERATURE * torch.expm1(2 * delta)[:, None] * p + flips * u * dz.abs()


@pytest.mark.parametrize("weight_grad", [True, False], ids=["trained_head", "frozen_head"])
def test_chunked_head_backward_under_bf16_autocast(weight_grad):
    """Backward (hidden's gradient dz @ W, the weight's dz^T @ h; a frozen head, as under LoRA, gets none), against
    float64 autograd and against autograd through plain bf16 logits log_softmax((h.bf16() @ W.bf16().T).float() / T).

    With ddz the bound on dz's error (dz_bound) and first-order terms:
      hidden: |d| <= ddz @ |W| + u |dz| @ |W| (W rounded to bf16) + u |dz| @ |W| (the product rounded to bf16);
      weight: |d| <= ddz^T @ |h| + 3u |dz|^T @ |h| (h rounded; each chunk's product rounded to bf16 before the fp32
              accumulation; 3u also covers autograd's plain path, whose sum is rounded to bf16 again: the head returns
              the fp32 sum itself, checked below).
    Against float64, delta is the logit bound of the forward test. Against plain bf16 autograd (same bf16 inputs), the
    logits differ by at most one bf16 ulp (eps below), dz's rounding by one ulp (2u), and the products' roundings by
    2u (hidden) and 3u (weight: chunk rounding plus two final roundings). Not tiny: above the float64 bound at fp32's
    roundoff."""
    torch.set_num_threads(1)
    hidden, weight, targets, upstream = head_data()
    hidden.requires_grad_(True)
    weight.requires_grad_(weight_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = token_logprobs(hidden, weight, targets, temperature=TEMPERATURE, chunk_tokens=CHUNK)
    logp.backward(upstream)

    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    (torch.log_softmax(h64 @ w64.T / TEMPERATURE, -1).gather(-1, targets[:, None])[:, 0]).backward(upstream.double())

    hb, wb = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    zb = (hb.bfloat16() @ wb.bfloat16().T).float() / TEMPERATURE
    torch.log_softmax(zb, -1).gather(-1, targets[:, None])[:, 0].backward(upstream)

    _, _, p, _ = float64_reference(hidden.detach(), weight.detach(), targets)
    dz = upstream.double()[:, None] * (torch.nn.functional.one_hot(targets, V).double() - p) / TEMPERATURE  # [M, V]
    abs_h, abs_w = hidden.detach().double().abs(), weight.detach().double().abs()

    def bounds(delta, u, flips, product_roundings_h, product_roundings_w):
        ddz = dz_bound(upstream.double(), p, dz, delta, u, flips)
        bound_h = ddz @ abs_w + product_roundings_h * u * dz.abs() @ abs_w
        bound_w = ddz.T @ abs_h + product_roundings_w * u * dz.abs().T @ abs_h
        return SLACK * bound_h, SLACK * bound_w

    gh, gh64, ghb = hidden.grad.double(), h64.grad, hb.grad.double()
    assert weight.grad is None if not weight_grad else weight.grad.dtype == torch.float32
    if weight_grad:  # the fp32 accumulation itself, not rounded to bf16 on the way (most entries need fp32's bits)
        assert (weight.grad != weight.grad.bfloat16().float()).float().mean() > 0.9
    gw = weight.grad.double() if weight_grad else None

    # against float64
    bh, bw = bounds(logit_error_bound(hidden.detach(), weight.detach(), U_BF16), U_BF16, 1, 2, 3)
    fh, fw = bounds(logit_error_bound(hidden.detach(), weight.detach(), U_FP32), U_FP32, 1, 2, 3)
    cases = (("hidden", gh, ghb, gh64, bh, fh), ("weight", gw, wb.grad, w64.grad, bw, fw))[: 2 if weight_grad else 1]
    for name, got, plain, ref, bound, floor in cases:
        err = (got - ref).abs()
        assert (err <= bound).all(), (name, (err / bound).max())
        assert (plain.double() - ref).abs().le(bound).all(), name  # plain bf16 autograd too
        assert err.max() > max(floor.max(), 1e-6), (name, err.max(), floor.max())  # bf16 really ran

    # against plain bf16 autograd: same inputs, so only rounding-order differences (one ulp each)
    zbd = zb.detach().double()
    eps = (2 * U_BF16 * zbd.abs() + 2 * H * U_FP32 * abs_h @ abs_w.T / TEMPERATURE).amax(-1)
    bh, bw = bounds(eps, U_BF16, 2, 2, 3)
    err = (gh - ghb).abs()
    assert (err <= bh).all(), (err / bh).max()
    if weight_grad:
        err = (gw - wb.grad.double()).abs()
        assert (err <= bw).all(), (err / bw).max()


LOSS = dict(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8)
# bf16 matmuls in the gradient's chain: 9 a layer (q, k, v, o, QK^T, PV, gate, up, down) x 4, the head; x 2 for backward
K = 2 * (4 * 9 + 1)


def learner(precision: str, *overrides: str) -> Learner:
    torch.manual_seed(0)
    return make_learner("model.dtype=float32", f"trainer.precision={precision}", "trainer.lr=1e-3", "trainer.grad_clip=1e9",
                        "trainer.micro_batch_rows=6", "algo.kl_coef=0", *overrides)  # fmt: skip


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]).double().cpu()


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_bf16_learner_update_follows_the_fp32_gradient(compiled):
    """One update of the built-in model in bf16 (autocast over fp32 master weights) and in fp32, from identical weights,
    on the same batch. The observable is the gradient handed to AdamW (whose first step, ~ -lr sign(g), flips on tiny
    entries and says little).

    Derivation. At ratio 1 the gradient is g = sum_t w_t grad log p_t (w_t = -A_t / #tokens, checked below), and as in
    the head tests the roundoff scales with the sum of the absolute terms, A = sum_t |w_t| |grad log p_t|, not with |g|
    (the advantages' signs cancel: kappa = A / |g| is ~3.4 here). Each grad log p_t goes through a chain of K = 74 bf16
    matmuls, each adding ~3u relative (two input roundings, one output rounding): 3uK = 0.87 in the worst case of
    aligned errors, 3u sqrt(K) = 0.10 for independent roundings (the probabilistic bound of Higham and Mary, 2019), which
    is asserted: |g_bf16 - g_fp32| / A < 3u sqrt(K). Then |g_bf16 - g_fp32| / |g| < kappa 3u sqrt(K), and the cosine of
    two vectors that close is at least sqrt(1 - (kappa 3u sqrt(K))^2). Not tiny: above 3 u_fp32 K (1.3e-5), the most an
    fp32 chain could be off by."""
    torch.set_num_threads(1)
    bf16, fp32 = learner("bf16", f"trainer.compile={str(compiled).lower()}"), learner("fp32")  # compiled: trainer.compile's layers
    assert bf16.precision == "bf16" and bf16.autocast_dtype == torch.bfloat16  # autocast on (one rank: unsharded)
    assert fp32.precision == "float32" and fp32.autocast_dtype is None
    for a, b in zip(bf16.model.parameters(), fp32.model.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)  # master weights in fp32, identical
    batch = synthetic_batch()
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4])

    # the per-token terms of the fp32 gradient (before the update moves the weights)
    params = list(fp32.model.parameters())
    logp, _ = response_logprobs(fp32.model, batch.to(fp32.device))
    rows, cols = batch.response_mask.bool().nonzero(as_tuple=True)
    per_token = torch.stack(
        [flat(torch.autograd.grad(logp[r, c], params, retain_graph=True)) for r, c in zip(rows, cols)]
    )
    weights = -adv[rows].double() / len(rows)  # token_mean at ratio 1: loss = -sum_t A_t log p_t / #tokens

    before = flat(params)
    _, g16 = update_with_gradient(bf16, batch, adv, batch.response_mask, None, None, options=LossOptions(**LOSS))
    _, g32 = update_with_gradient(fp32, batch, adv, batch.response_mask, None, None, options=LossOptions(**LOSS))
    g16, g32, before = g16.double().cpu(), g32.double().cpu(), before.cpu()
    assert ((weights @ per_token - g32).norm() / g32.norm()) < 1e-4  # the decomposition (fp32 sums in another order)
    abs_sum = weights.abs() @ per_token.norm(dim=1)  # A
    kappa = (abs_sum / g32.norm()).item()
    err = (g16 - g32).norm().item()
    assert err / abs_sum < 3 * U_BF16 * math.sqrt(K), err / abs_sum
    assert err / abs_sum > 3 * U_FP32 * K, err / abs_sum  # bf16 really ran
    cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0).item()
    assert cos > math.sqrt(1 - (kappa * 3 * U_BF16 * math.sqrt(K)) ** 2), (cos, kappa)
    # the step: AdamW's first is -lr g / (|g| + eps), so the two moved the fp32 master weights the same way wherever
    # the gradient's sign survived bf16, i.e. at least wherever |g_fp32| exceeds the bf16 error (95% of entries here)
    d16, d32 = flat(bf16.model.parameters()) - before, flat(fp32.model.parameters()) - before
    assert (torch.sign(d16) == torch.sign(d32))[g32.abs() > (g16 - g32).abs()].all()


def bf16_casts_of_weights(learner: Learner, run) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """How many times `run()` casts each of the learner's fp32 weights to bf16, by name (the tied head under its
    embedding's name)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = {p.data_ptr(): name for name, p in learner.model.named_parameters()}
    counts: dict[str, int] = dict.fromkeys(names.values(), 0)

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16 \
                    and args[0].data_ptr() in names:  # fmt: skip
                counts[names[args[0].data_ptr()]] += 1
            return func(*args, **kwargs)

    with Count():
        run()
    return counts


def test_bf16_update_casts_each_weight_once_for_all_micro_batches_and_computes_the_same():
    """Learner._casts_kept: over 3 micro-batches an update (and a logprob pass) casts each fp32 weight of the layers to
    bf16 once, not once per micro-batch (the LM head's weight, cast by rlvr.lm_head itself, once per micro-batch), and
    the gradient and the logprobs are bitwise those of casting per micro-batch (the same bf16 weights, the same
    products)."""
    torch.set_num_threads(1)
    batch, adv = synthetic_batch(), torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4])
    kept, per_micro_batch = learner("bf16"), learner("bf16")
    per_micro_batch._casts_kept = contextlib.nullcontext  # type: ignore[method-assign]  # the cast in every micro-batch
    kept.micro_batch_rows = per_micro_batch.micro_batch_rows = 2  # 3 micro-batches of the 6 rows
    head = next(n for n, p in kept.model.named_parameters() if p is kept.model.get_output_embeddings().weight)
    options = LossOptions(**LOSS)
    grads, logps, casts = [], [], []
    for lrn in (kept, per_micro_batch):
        casts.append(bf16_casts_of_weights(lrn, lambda lrn=lrn: logps.append(lrn.logprobs(batch))))
        for _ in range(2):  # the second update: the weights the first one moved, cast anew
            casts.append(bf16_casts_of_weights(lrn, lambda lrn=lrn: grads.append(update_with_gradient(
                lrn, batch, adv, batch.response_mask, None, None, options=options)[1])))  # fmt: skip
    layers = [n for n, p in kept.model.named_parameters() if p.dim() == 2 and n != head]
    assert len(layers) == 4 * 7  # q k v o gate up down
    for counts, each in zip(casts, (1, 1, 1, 3, 3, 3), strict=True):
        assert {n: counts[n] for n in layers} == dict.fromkeys(layers, each)
        assert counts[head] == 3  # the head's, in every micro-batch
    assert torch.equal(logps[0], logps[1]) and torch.equal(grads[0], grads[2]) and torch.equal(grads[1], grads[3])
    assert not torch.equal(grads[0], grads[1])  # (the first update moved the weights)
