"""The policy (and, when the KL term is on, a frozen reference) under FSDP2, and its optimizer.

Every rank holds a shard of every parameter (`fully_shard` per decoder layer and at the root; a world of one
trains the plain module). Every rank is handed the same full batch; each computes logprobs for, and trains
on, its own contiguous share of the rows, and the loss normalizers are the batch's global counts, so the
summed gradient over micro-batches and ranks is the full-batch gradient (rlvr.algo.aggregate). After the
updates the full weights are gathered one parameter at a time for the rollout engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlvr import algo, distributed
from rlvr.config import ConfigError
from rlvr.types import RolloutBatch

# Logits are computed this many bytes at a time (fp32 [tokens, vocab]): 341 tokens of a 49k vocabulary, 110 of 152k.
LOGITS_CHUNK_BYTES = 64 * 2**20
# devices with torch's fused AdamW kernel (torch.utils._foreach_utils._get_fused_kernels_supported_devices, less the rare ones)
FUSED_OPTIMIZER_DEVICES = ("cpu", "cuda", "xpu", "mps")


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(h W^T / temperature)[target] (and the entropy) for M tokens, in chunks of tokens.

    Only one chunk's [chunk, V] logits exist at a time, in forward and in backward (which recomputes them from the
    saved hidden states: one more [M, H] x [H, V] product than autograd would do, no [M, V] tensor kept). The chunk
    buffers are allocated once per call and reused in place: a fresh 64 MiB tensor per chunk costs more in page faults
    on a CPU than its exp. Softmax, logsumexp and the weight gradient's accumulation run in float32 (float64 stays).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy):  # type: ignore[no-untyped-def, override]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        m, v = hidden.shape[0], weight.shape[0]
        chunk = max(1, min(m, LOGITS_CHUNK_BYTES // (4 * v)))
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
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # type: ignore[no-untyped-def, override]
        hidden, weight, targets, lse = ctx.saved_tensors
        acc = lse.dtype
        m, v = hidden.shape[0], weight.shape[0]
        chunk = max(1, min(m, LOGITS_CHUNK_BYTES // (4 * v)))
        z_buf = torch.empty(chunk, v, dtype=acc, device=hidden.device)  # [c, V]
        grad_hidden = torch.empty_like(hidden)  # [M, H]
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)  # [V, H]
        for s in range(0, m, chunk):
            h, g = hidden[s : s + chunk], grad_logp[s : s + chunk].to(acc)  # [c, H], [c]
            dz = _logits(h, weight, ctx.temperature, z_buf)  # [c, V]
            dz.sub_(lse[s : s + chunk, None]).exp_().mul_(-g[:, None])  # d logp / dz = onehot(target) - softmax(z)
            dz.scatter_add_(-1, targets[s : s + chunk, None], g[:, None])
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)  # now the gradient of the raw logits h W^T
            dz_c = dz if dz.dtype == hidden.dtype else dz.to(hidden.dtype)
            grad_hidden[s : s + chunk] = dz_c @ weight
            if dz_c.dtype == acc:
                grad_weight.addmm_(dz_c.T, h)
            else:
                grad_weight += (dz_c.T @ h).to(acc)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


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
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `targets` [M] under softmax(hidden [M, H] @ weight [V, H]^T / temperature): [M], and the entropy
    [M] (no gradient) if asked. Peak memory is one chunk of logits, not [M, V]. Under autocast the product runs in
    autocast's dtype, as the LM head's would."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(device_type, enabled=False):
        logp, entropy = _TokenLogprobs.apply(hidden, weight, targets, temperature, with_entropy)
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
        logits = model(input_ids=ids).logits  # [1, 5, V]
        with _head_replaced(head, plain):
            model(input_ids=ids)
    return "logits" in seen and torch.allclose(logits.float(), seen["logits"].float(), rtol=1e-4, atol=1e-4)


def response_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    plain_head: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the response tokens under `model` at `temperature`: [N, T] (and the entropy [N, T] if asked).

    Only what the responses need is computed: the rows are cut to this batch's longest row (no compute on the padding
    that a longer row elsewhere in the step added), and the LM head runs only at response tokens, a chunk of tokens at
    a time (`token_logprobs`): no [rows, length, vocab] logits. A model whose logits are not its head's plain product
    (plain_head False: soft-capping, scaling) takes the model's own logits from the earliest response position on.
    Entries outside the response mask are 0.
    """
    width = int(batch.attention_mask.sum(1).max())  # the longest row here (rows are right-padded)
    t = int(batch.response_mask.sum(1).max().clamp(min=1))  # the longest response here
    first = int(batch.response_index[:, 0].min())  # the earliest position whose logits predict a response token
    keep = width - first  # the last `keep` positions hold every predicting logit
    rows, cols = batch.response_mask[:, :t].bool().nonzero(as_tuple=True)  # [M] each: the response tokens
    positions = batch.response_index[rows, cols] - first  # [M] their predicting positions among the kept ones
    targets = batch.response_ids[rows, cols]  # [M]
    inputs = dict(input_ids=batch.input_ids[:, :width], attention_mask=batch.attention_mask[:, :width], logits_to_keep=keep)
    if plain_head:
        head = model.get_output_embeddings()
        out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

        def response_head(hidden: torch.Tensor) -> torch.Tensor:  # [N, keep, H] -> no logits
            out["logp"] = token_logprobs(hidden[rows, positions], head.weight, targets, temperature=temperature, with_entropy=with_entropy)
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


def micro_batches(lengths: list[int], *, max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices grouped into micro-batches that each pad only to their own longest row.

    Rows are taken longest first; a micro-batch grows while its padded size (rows x its longest row) stays within
    max_tokens (0: no token budget) and its rows within max_rows. A row longer than max_tokens is a micro-batch alone.
    """
    plan: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: equal lengths keep their order
        current = plan[-1] if plan else None
        if current is None or len(current) >= max_rows or (max_tokens and (len(current) + 1) * lengths[current[0]] > max_tokens):
            plan.append([i])
        else:
            current.append(i)
    return plan


def split_to(plan: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """The plan with its largest micro-batches (in padded tokens) halved until it has `count` of them (every FSDP2 rank
    must run as many forward/backward passes as the others). Needs count <= the number of rows."""
    plan = [list(p) for p in plan]
    while len(plan) < count:
        j = max((k for k in range(len(plan)) if len(plan[k]) > 1), key=lambda k: len(plan[k]) * lengths[plan[k][0]])
        half = len(plan[j]) // 2
        plan[j : j + 1] = [plan[j][:half], plan[j][half:]]
    return plan


def keep_freed_memory() -> None:
    """Let glibc keep freed tensor memory for reuse instead of returning it to the OS (CPU training).

    By default glibc serves large allocations with mmap and unmaps them on free, so every step's activations are
    faulted in page by page again: on the SmolLM2-135M benchmark half of the update's time was system time. Raising
    the mmap threshold to its maximum (32 MiB) and the trim threshold to 2 GiB keeps them in the heap. Measured with
    this and the reused logits buffers of _TokenLogprobs (6 of its layers, 64 long-tailed rows, 2 cores): 59 s per
    update (30 s of it system time) before, 40 s (4 s) after. A no-op where glibc is absent.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
    libc.mallopt(m_mmap_threshold, 32 * 2**20)
    libc.mallopt(m_trim_threshold, 2 * 2**30)


def bf16_is_faster(device: torch.device, hidden_size: int) -> bool:
    """Whether bf16 matmuls beat fp32 ones here: always on CUDA; on a CPU, measured once ([512, H] x [H, 4H], a
    decoder MLP's shape) and true when bf16 is at least 1.5x faster (AMX and AVX512-BF16 CPUs; AVX2 emulates bf16 and
    ran 8x slower than fp32 on an AMD EPYC without AVX-512)."""
    if device.type == "cuda":
        return True
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, w = torch.randn(512, hidden_size, dtype=dtype), torch.randn(4 * hidden_size, hidden_size, dtype=dtype)
        a @ w.T  # warm-up
        t0 = time.perf_counter()
        for _ in range(3):
            a @ w.T
        seconds[dtype] = time.perf_counter() - t0
    return seconds[torch.bfloat16] * 1.5 <= seconds[torch.float32]


def lr_factor(update: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer update `update` (0-based): linear warmup, then the schedule."""
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r}; valid choices: constant, cosine")


class Learner:
    """A causal LM trained by the clipped policy-gradient loss of rlvr.algo, sharded by FSDP2 over all ranks (a
    world of one trains the plain module)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        lr: float,
        weight_decay: float,
        warmup_steps: int,
        lr_schedule: str,
        total_updates: int,
        grad_clip: float,
        micro_batch_rows: int,
        with_reference: bool,
        micro_batch_tokens: int = 0,
        temperature: float = 1.0,
        precision: str = "auto",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        shard: bool | None = None,
    ) -> None:
        distributed.init()
        self.model_path = model_path
        self.device = distributed.device()
        self.world_size = distributed.world_size()  # FSDP averages gradients over ranks; the loss is scaled by this
        self.rank = distributed.rank()
        if self.device.type == "cpu":
            keep_freed_memory()
        if cpu_offload and self.device.type != "cuda":
            raise ConfigError("trainer.cpu_offload moves FSDP2 state from the GPU to the CPU; on a CPU-only machine it does nothing useful: set it to false")
        # auto: bf16 compute where bf16 matmuls are faster (CUDA; CPUs with AMX or AVX512-BF16), for fp32 weights only
        # (float64 asks for exact arithmetic); rank 0 decides for all, so that every rank computes alike
        if precision == "auto" and dtype == "float32":
            hidden = AutoConfig.from_pretrained(model_path).hidden_size
            precision = distributed.broadcast_object("bf16" if bf16_is_faster(self.device, hidden) else "fp32")
        bf16 = precision == "bf16"
        self.precision = "bf16" if bf16 else dtype
        self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        self.offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=True) if cpu_offload else OffloadPolicy()
        # FSDP2 over a single rank shards nothing but puts DTensor dispatch and parameter copy-in/out on every op
        # (63 vs 42 ms per update of the built-in model, +50%): a world of one trains the plain module, with
        # autocast for bf16, unless CPU offload (an FSDP2 feature) is asked for.
        self.sharded = self.world_size > 1 or cpu_offload if shard is None else shard  # shard=True: FSDP2 even alone
        self.autocast_dtype = torch.bfloat16 if bf16 and not self.sharded else None
        self.model = self._build(dtype, activation_checkpointing)
        self.model.train()
        self.reference = self._build(dtype, False).eval().requires_grad_(False) if with_reference else None
        # fused: one kernel over all parameters instead of a Python loop of per-tensor ops (CPU and CUDA since torch 2.4;
        # DTensor shards included): the built-in model's AdamW step takes 0.6 instead of 2.7 ms on 2 CPU cores
        fused = self.device.type in FUSED_OPTIMIZER_DEVICES
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, warmup=warmup_steps, total=total_updates, schedule=lr_schedule)
        )
        self.grad_clip = grad_clip
        self.micro_batch_rows = micro_batch_rows
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.plain_head = has_plain_head(self.model, self.device)  # else response logprobs take the model's own logits

    def _build(self, dtype: str, activation_checkpointing: bool) -> PreTrainedModel:
        """The model from `model_path` on this rank's device: fully_shard-ed per decoder layer and at the root
        when sharded. Every rank reads the full checkpoint into CPU memory first, then keeps only its shard."""
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype))
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not self.sharded:
            torch.nn.Module.to(model, self.device)  # (not through transformers' `to`, which mypy mis-types)
            return model
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        layer_types = set(getattr(model, "_no_split_modules", None) or [])  # HF's name for the decoder block class
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        if not layers:
            raise ValueError(f"{self.model_path}: found no decoder layers to shard (model._no_split_modules={layer_types})")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        fully_shard(model, mesh=mesh, mp_policy=self.mp_policy, offload_policy=self.offload)
        if not isinstance(self.offload, CPUOffloadPolicy):
            torch.nn.Module.to(model, self.device)  # the shards (not through transformers' `to`, which mypy mis-types)
        return model

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 compute for the unsharded model (FSDP2's MixedPrecisionPolicy does it for the sharded one)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _my_rows(self, num_rows: int) -> slice:
        """This rank's contiguous share of a batch that every rank holds in full."""
        if num_rows % self.world_size:
            raise ValueError(f"{num_rows} rows cannot be split evenly over {self.world_size} ranks")
        share = num_rows // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def refresh_reference(self) -> None:
        """pi_ref <- pi_theta (shard by shard: both models are sharded the same way)."""
        if self.reference is not None:
            for model in (self.model, self.reference):
                for module in model.modules():  # FSDP2 leaves the root's parameters gathered after a forward
                    if isinstance(module, FSDPModule):
                        module.reshard()
            with torch.no_grad():
                for ref, param in zip(self.reference.parameters(), self.model.parameters(), strict=True):
                    ref.copy_(param)

    def _micro_batches(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """This rank's rows as micro-batches (index tensors) by trainer.micro_batch_tokens / micro_batch_rows; as many
        on every rank (FSDP2's collectives run once per forward and backward)."""
        lengths = batch.attention_mask.sum(1).tolist()  # [n] prompt + response tokens per row
        plan = micro_batches(lengths, max_rows=self.micro_batch_rows, max_tokens=self.micro_batch_tokens)
        if self.world_size > 1:
            plan = split_to(plan, lengths, max(distributed.all_gather_objects(len(plan))))
        return [torch.tensor(rows, device=self.device) for rows in plan]

    def _response_logprobs(self, model: PreTrainedModel, batch: RolloutBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._autocast():
            return response_logprobs(model, batch, with_entropy=with_entropy, temperature=self.temperature, plain_head=self.plain_head)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """Response logprobs [N, T] under the policy (or the reference): each rank computes its rows, then all share."""
        model = self.reference if reference else self.model
        assert model is not None, "no reference model: kl_coef is 0"
        mine = batch.select(self._my_rows(batch.num_rows)).to(self.device)
        dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # bf16 compute still returns fp32
        local = torch.zeros(mine.response_mask.shape, dtype=dtype, device=self.device)  # [N / world, T]
        for rows in self._micro_batches(mine):
            local[rows] = self._response_logprobs(model, mine.select(rows), False)[0].to(local.dtype)
        if self.world_size == 1:
            return local.cpu()
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, local)
        return torch.cat(gathered).cpu()  # [N, T]

    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        *,
        loss_kwargs: dict,
    ) -> dict[str, float]:
        """One optimizer update on a mini-batch (advantages [n], mask [n, T], logprobs [n, T]), the same on every rank.

        Each rank trains on its share of the rows. old_logprobs None means pi_old = pi_theta (one update per
        rollout): the ratio is exactly 1. The normalizers are the mini-batch's global counts, so the summed
        gradient over micro-batches and ranks is the mini-batch gradient whatever the micro-batch layout and world size.
        A non-finite gradient norm skips the optimizer step (`bad` = 1 in the metrics); the lr schedule still advances.
        """
        num_tokens = mask.sum()  # [] the same on every rank: each holds the whole mini-batch
        num_sequences = batch.num_rows
        num_units = algo.metric_units(mask, loss_kwargs["ratio"]).sum()  # [] what the clip statistics average over
        rows = self._my_rows(batch.num_rows)
        batch, advantages, mask = batch.select(rows).to(self.device), advantages[rows].to(self.device), mask[rows].to(self.device)
        old_logprobs = None if old_logprobs is None else old_logprobs[rows].to(self.device)
        ref_logprobs = None if ref_logprobs is None else ref_logprobs[rows].to(self.device)
        num_tokens, num_units = num_tokens.to(self.device), num_units.to(self.device)
        # The metrics stay on the device until the update is done: one host synchronization reads them all (and one more
        # decides whether the gradient norm is finite), instead of one per metric per micro-batch.
        sums: dict[str, torch.Tensor] = {}  # metrics reduced by "sum", "tokens" or "units" (algo.METRIC_REDUCTIONS)
        extremes: dict[str, torch.Tensor] = {}  # "max" metrics, and "min" ones negated
        entropy_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        plan = self._micro_batches(batch)
        for j, micro in enumerate(plan):  # micro: row indices [m]
            if isinstance(self.model, FSDPModule):
                self.model.set_requires_gradient_sync(j == len(plan) - 1)  # reduce-scatter once, after the last micro-batch
            part = batch.select(micro)
            logp, entropy = self._response_logprobs(self.model, part, True)  # [m, T]
            loss, metrics = algo.policy_loss_terms(
                logp,
                logp.detach() if old_logprobs is None else old_logprobs[micro],
                advantages[micro],
                mask[micro],
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro],
                engine_logprobs=part.engine_logprobs,
                num_sequences=num_sequences,
                num_tokens=num_tokens,
                loss_scale=self.world_size,
                **loss_kwargs,
            )
            loss.backward()
            # metrics are means over this micro-batch's tokens or units: weight each by its share of the mini-batch's
            share = {
                "tokens": mask[micro].sum().double() / num_tokens.clamp(min=1),
                "units": algo.metric_units(mask[micro], loss_kwargs["ratio"]).sum().double() / num_units.clamp(min=1),
            }
            for k, v in metrics.items():
                how = algo.METRIC_REDUCTIONS.get(k, "units")
                if how in ("sum", "tokens", "units"):
                    term = v if how == "sum" else v * share[how]
                    sums[k] = sums[k] + term if k in sums else term
                else:
                    v = v if how == "max" else -v
                    extremes[k] = torch.maximum(extremes[k], v) if k in extremes else v
            assert entropy is not None
            entropy_sum += (entropy * mask[micro]).sum()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        bad = not torch.isfinite(grad_norm).item()  # the same on every rank: the norm is global
        if not bad:
            self.optimizer.step()
        with warnings.catch_warnings():  # after a skipped step torch warns that the schedule moved without an optimizer step
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()  # the schedule counts update slots, skipped or not
        self.optimizer.zero_grad(set_to_none=True)
        # every rank's sums cover its rows, weighted by global counts: the global value is their sum
        keys, names = sorted(sums), sorted(extremes)
        totals = distributed.all_reduce_sum(torch.stack([sums[k] for k in keys] + [entropy_sum]))
        peaks = distributed.all_reduce_max(torch.stack([extremes[k] for k in names])) if names else totals[:0]
        entropy = totals[-1:] / num_tokens.double().clamp(min=1)  # [1] per counted token
        values = torch.cat([totals[:-1], peaks, entropy, grad_norm.double().reshape(1).to(totals.device)]).tolist()  # the one read
        out = dict(zip(keys, values[: len(keys)]))
        out.update({k: v if algo.METRIC_REDUCTIONS[k] == "max" else -v for k, v in zip(names, values[len(keys) : -2])})
        out["entropy"], out["grad_norm"] = values[-2], values[-1]
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["bad"] = float(bad)
        return out

    @torch.no_grad()
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in checkpoint names (tied weights once), gathered one parameter at a time.

        A collective: every rank must consume the whole iterator, in order. Peak extra memory is the
        largest single parameter (the gather is bounded by it, not by the model).
        """
        for name, param in self.model.named_parameters():
            if isinstance(param, DTensor):
                shard = cast(DTensor, param.detach().to(self.device))  # offloaded shards come to the device first
                yield name, shard.full_tensor()  # all-gather this parameter's shards
            else:  # the root's parameters stay gathered after a forward (FSDP2's heuristic for the root)
                yield name, param.detach()

    def save(self, folder: Path) -> None:
        """A Hugging Face folder (safetensors + config + tokenizer) that transformers and vLLM load; rank 0 writes it.

        A collective (the full weights are gathered on every rank).
        """
        state = {name: tensor.cpu() for name, tensor in self.named_weights()}
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(folder, state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(folder)

    def _sharded_state(self) -> dict:
        model, optim = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optim": optim}
        if self.reference is not None:  # pi_ref: the initial weights, or pi_theta at the last refresh
            state["reference"] = get_model_state_dict(self.reference)
        return state

    def save_state(self, folder: Path) -> None:
        """Sharded policy, optimizer (and reference) state with torch.distributed.checkpoint; a collective.

        Each rank writes its own shards (fsynced) into `folder`; the lr schedule is the trainer's to save.
        A world of one skips DCP's collectives (no_dist): after a save that ran them over the one-rank gloo
        group, every later CPU update of this process ran 2.2x slower (31 -> 71 ms on the built-in model;
        cause not found, measured in isolation, reproducible).
        """
        with warnings.catch_warnings():  # no_dist warns that it assumes a single process: that is the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(self._sharded_state(), checkpoint_id=str(folder), no_dist=self.world_size == 1)

    def load_state(self, folder: Path) -> None:
        """Restore what save_state wrote (any world size: DCP reshards on load); a collective."""
        state = self._sharded_state()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(folder), no_dist=self.world_size == 1)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.reference is not None:
            set_model_state_dict(self.reference, state["reference"])
