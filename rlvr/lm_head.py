"""The LM head's logprobs without the logits: only response tokens, a chunk of tokens at a time.

`response_logprobs` runs the model with its LM head replaced, so the head's [rows, length, vocab] logits never exist:
the hidden states of the response tokens go through `token_logprobs`, a custom autograd function that computes
log softmax(h W^T / T)[target] (and the entropy) one chunk of tokens at a time, in forward and in backward. The chunk
size is trainer.logits_chunk_tokens (rlvr.settings sizes it from the device's memory and the vocabulary).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel

from rlvr import algo
from rlvr.settings import CPU_LOGITS_CHUNK_BYTES
from rlvr.types import RolloutBatch


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(h W^T / temperature)[target] (and the entropy) for M tokens, in chunks of tokens.

    Only one chunk's [chunk, V] logits exist at a time, in forward and in backward (which recomputes them from the
    saved hidden states: one more [M, H] x [H, V] product than autograd would do, no [M, V] tensor kept). The chunk
    buffers are allocated once per call and reused in place: a fresh 64 MiB tensor per chunk costs more in page faults
    on a CPU than its exp. Softmax, logsumexp and the weight gradient's accumulation run in float32 (float64 stays).
    The products run in hidden's dtype: under autocast (bf16 hidden, fp32 weight) the weight is cast here, once per
    call, and its gradient is returned in fp32 as accumulated, not rounded to bf16 and widened again by autograd (two
    passes over [V, H] per micro-batch less).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy, chunk_tokens):  # type: ignore[no-untyped-def, override]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        m, v = hidden.shape[0], weight.shape[0]
        chunk = max(1, min(m, chunk_tokens))
        ctx.weight_dtype = weight.dtype
        weight = weight.to(hidden.dtype)  # [V, H] the products' copy (a no-op unless under autocast)
        z_buf = torch.empty(chunk, v, dtype=acc, device=hidden.device)  # [c, V] logits, then shifted logits
        e_buf = torch.empty(chunk, v, dtype=acc, device=hidden.device)  # [c, V] exp of the shifted logits
        logp = torch.empty(m, dtype=acc, device=hidden.device)  # [M]
        lse = torch.empty(m, dtype=acc, device=hidden.device)  # [M]
        entropy = torch.zeros(m if with_entropy else 0, dtype=acc, device=hidden.device)  # [M] or [0]
        for s in range(0, m, chunk):
            z, e = _logits(hidden[s : s + chunk], weight, temperature, z_buf), e_buf[: min(chunk, m - s)]  # [c, V]
            top = z.amax(-1, keepdim=True)  # [c, 1]
            z.sub_(top)
            torch.exp(z, out=e)
            log_sum = e.sum(-1).log_()  # [c]
            lse[s : s + chunk] = top[:, 0] + log_sum
            logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None])[:, 0] - log_sum
            if with_entropy:  # H = log sum exp(z') - sum softmax(z') z'  with z' = z - max z
                entropy[s : s + chunk] = log_sum - e.mul_(z).sum(-1) / log_sum.exp()
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # type: ignore[no-untyped-def, override]
        hidden, weight, targets, lse = ctx.saved_tensors
        acc = lse.dtype
        m, v = hidden.shape[0], weight.shape[0]
        chunk = max(1, min(m, ctx.chunk_tokens))
        z_buf = torch.empty(chunk, v, dtype=acc, device=hidden.device)  # [c, V]
        grad_hidden = torch.empty_like(hidden)  # [M, H]
        # a frozen head (LoRA) gets no weight gradient: no [V, H] accumulator, one product less per chunk
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if ctx.needs_input_grad[1] else None  # [V, H]
        for s in range(0, m, chunk):
            h, g = hidden[s : s + chunk], grad_logp[s : s + chunk].to(acc)  # [c, H], [c]
            dz = _logits(h, weight, ctx.temperature, z_buf)  # [c, V]
            dz.sub_(lse[s : s + chunk, None]).exp_().mul_(-g[:, None])  # d logp / dz = onehot(target) - softmax(z)
            dz.scatter_add_(-1, targets[s : s + chunk, None], g[:, None])
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)  # now the gradient of the raw logits h W^T
            dz_c = dz if dz.dtype == hidden.dtype else dz.to(hidden.dtype)
            grad_hidden[s : s + chunk] = dz_c @ weight
            if grad_weight is None:
                continue
            if dz_c.dtype == acc:
                grad_weight.addmm_(dz_c.T, h)
            else:
                grad_weight += (dz_c.T @ h).to(acc)
        return grad_hidden, None if grad_weight is None else grad_weight.to(ctx.weight_dtype), None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, buffer: torch.Tensor) -> torch.Tensor:
    """hidden [c, H] @ weight[V, H]^T / temperature into the first c rows of `buffer` (its dtype): [c, V]."""
    z = buffer[: hidden.shape[0]]
    if hidden.dtype == buffer.dtype:
        torch.matmul(hidden, weight.T, out=z)
    else:
        z.copy_(hidden @ weight.T)  # bf16 product, fp32 softmax
    if temperature != 1.0:
        z.div_(temperature)
    return z


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `targets` [M] under softmax(hidden [M, H] @ weight [V, H]^T / temperature): [M], and the entropy
    [M] (no gradient) if asked. Peak memory is one chunk of `chunk_tokens` tokens' logits (0: 64 MiB of them, the CPU
    rule of rlvr.settings), not [M, V]. Under autocast the product runs in autocast's dtype, as the LM head's would;
    the weight's gradient comes back in the weight's own dtype (fp32 masters: fp32, as accumulated)."""
    chunk_tokens = chunk_tokens or max(1, CPU_LOGITS_CHUNK_BYTES // (4 * weight.shape[0]))
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden = hidden.to(dtype)  # the weight is cast inside, where its gradient stays fp32
    with torch.autocast(device_type, enabled=False):
        logp, entropy = _TokenLogprobs.apply(hidden, weight, targets, temperature, with_entropy, chunk_tokens)
    return logp, entropy if with_entropy else None


@contextlib.contextmanager
def _head_replaced(head: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """While active, calling the LM head runs `forward` instead (inside the model's forward, where FSDP2 has gathered
    every weight)."""
    head.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del head.forward


def has_plain_head(model: PreTrainedModel, device: torch.device) -> bool:
    """Whether the model's logits are exactly its LM head's weight times the last hidden state (a bias-free Linear,
    called by the forward, no soft-capping or scaling after it), checked on a few tokens; a collective under FSDP2
    (every rank calls it)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    ids = torch.arange(5, device=device)[None] % model.config.vocab_size  # [1, 5]
    seen: dict[str, torch.Tensor] = {}

    def plain(hidden: torch.Tensor) -> torch.Tensor:
        seen["logits"] = hidden @ head.weight.T  # [1, 5, V]
        return seen["logits"]

    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits  # [1, 5, V]
        with _head_replaced(head, plain):
            model(input_ids=ids, use_cache=False)
    return "logits" in seen and torch.allclose(logits.float(), seen["logits"].float(), rtol=1e-4, atol=1e-4)


def response_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    plain_head: bool = True,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the response tokens under `model` at `temperature`: [N, T] (and the entropy [N, T] if asked).

    Only what the responses need is computed: the rows are cut to this batch's longest row (no compute on the padding
    that a longer row elsewhere in the step added), and the LM head runs only at response tokens, a chunk of tokens at
    a time (`token_logprobs`): no [rows, length, vocab] logits. A model whose logits are not its head's plain product
    (plain_head False: soft-capping, scaling) takes the model's own logits from the earliest response position on.
    Entries outside the response mask are 0.
    """
    width = int(batch.attention_mask.sum(1).max())  # the longest row here (rows are right-padded)
    # the response columns up to the last counted token here (not the mask's row sums: with tools a response has holes,
    # its tool outputs, and its last tokens lie past the count of its counted ones)
    counted = batch.response_mask.any(0).nonzero()  # [c, 1]
    t = int(counted[-1, 0]) + 1 if len(counted) else 1
    first = int(batch.response_index[:, 0].min())  # the earliest position whose logits predict a response token
    keep = width - first  # the last `keep` positions hold every predicting logit
    rows, cols = batch.response_mask[:, :t].bool().nonzero(as_tuple=True)  # [M] each: the response tokens
    positions = batch.response_index[rows, cols] - first  # [M] their predicting positions among the kept ones
    targets = batch.response_ids[rows, cols]  # [M]
    # No attention mask: rows are right-padded, so under the causal mask a real token never sees a pad, and positions
    # count from 0 on every row. Given one, transformers builds a [rows, 1, L, L] mask that attention keeps for the
    # backward in every layer (quadratic in L: ~15 GiB for two 8k rows of SmolLM2-135M, docs/measured/long_thinking.md)
    # and takes attention's math path; without it, attention runs causal (flash on GPU and CPU), linear in L.
    # No KV cache: transformers builds one by default, in training too, copying every layer's keys and values into it.
    inputs = dict(input_ids=batch.input_ids[:, :width], logits_to_keep=keep, use_cache=False)
    if plain_head:
        head = model.get_output_embeddings()
        out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

        def response_head(hidden: torch.Tensor) -> torch.Tensor:  # [N, keep, H] -> no logits
            out["logp"] = token_logprobs(hidden[rows, positions], head.weight, targets, temperature=temperature,
                                         with_entropy=with_entropy, chunk_tokens=chunk_tokens)  # fmt: skip
            return hidden[:, :0]

        with _head_replaced(head, response_head):
            model(**inputs)
        logp_flat, entropy_flat = out["logp"]  # [M], [M] | None
    else:
        z = model(**inputs).logits[rows, positions]  # [M, V]
        z = z.to(torch.promote_types(z.dtype, torch.float32)) / temperature
        logp_flat = torch.log_softmax(z, dim=-1).gather(-1, targets[:, None])[:, 0]  # [M]
        entropy_flat = algo.entropy_from_logits(z.detach()) if with_entropy else None

    def scatter(values: torch.Tensor) -> torch.Tensor:  # [M] -> [N, T]
        return values.new_zeros(batch.response_mask.shape).index_put((rows, cols), values)

    return scatter(logp_flat), None if entropy_flat is None else scatter(entropy_flat)
