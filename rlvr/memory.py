"""Memory arithmetic of a run, from the model's config.json alone: no torch, nothing loaded.

Used by rlvr.settings (the token budget and activation checkpointing that `auto` resolves to on a GPU) and by
`rlvr plan` (what each phase holds per GPU, and whether it fits). Bytes are per rank. A decoder-only transformer of
the Llama/Qwen2/Mistral family: per layer, attention (q, k, v, o with grouped KV heads, optional q/k/v bias), a
gated MLP (gate, up, down) and two RMSNorms; an embedding, a final norm and an LM head (tied or not).

The learner's figures follow rlvr.learner as it is: fp32 master weights, fp32 gradients and AdamW's two fp32 moments
(16 bytes a parameter, sharded by FSDP2 over the ranks); bf16 compute by autocast in a world of one (the casts of the
weights live through the backward: 2 bytes a matmul weight) or by FSDP2's mixed precision (the root's and two
layers' weights gathered in bf16); the activations autograd saves, counted tensor by tensor from transformers' Llama
and Qwen2 layers under SDPA (`activation_bytes_per_token`); the chunked LM head's logits and its weight gradient.
scripts/measure_memory.py checks the learner's peak against a measurement of the live tensors of real updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8,
               "fp32": 4, "bf16": 2}  # fmt: skip
ENGINE_OVERHEAD_BYTES = GIB  # a GPU engine beside its weights and KV cache: profiled activations, CUDA graphs, sampler
USABLE_FRACTION = 0.9  # of a GPU's memory, for tensors: the rest is the CUDA context, NCCL buffers, fragmentation


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a decoder-only causal LM, read from its config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a config.json's fields (a dict, or a transformers config's to_dict())."""
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", False)) or config.get("model_type") == "qwen2",
        )

    @property
    def q_dim(self) -> int:
        """Width of Q (and of the attention's output) per token: heads x head dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token: kv heads x head dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params(self) -> int:
        """The matmul weights of one layer: q, k, v, o, gate, up, down."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return 2 * h * q + 2 * h * kv + 3 * h * i

    @property
    def layer_params(self) -> int:
        """One decoder layer's parameters: its matmul weights, the q/k/v biases if any, two RMSNorm weights."""
        return self.linear_params + ((self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0) + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def root_params(self) -> int:
        """What is not in a decoder layer: the embedding, the LM head (unless tied) and the final norm."""
        return self.embedding_params * (1 if self.tied_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        return self.root_params + self.num_layers * self.layer_params

    def lora_params(self, rank: int) -> int:
        """A rank-`rank` LoRA adapter on every linear layer of the decoder (rlvr.lora's default): A [r, in] and
        B [out, r] for q, k, v, o, gate, up and down."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return self.num_layers * rank * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)


def activation_bytes_per_token(
    shape: ModelShape, *, compute_bytes: int, checkpointing: bool, autocast: bool = False, seq_len: int = 0
) -> int:
    """Activation memory that backward keeps per token of a micro-batch, all layers and the final norm (SDPA: no
    [T, T] scores). `autocast`: bf16 compute by autocast over fp32 weights (a world of one), where the residual stream
    stays fp32 and each projection casts its own copy of its input; else the weights are in the compute dtype (fp32,
    or FSDP2's bf16). `seq_len`: the padded row length, for the [rows, 1, L, L] attention mask all layers share.

    Per layer, the tensors autograd saves (counted in transformers 5's Llama and Qwen2 layers, scripts/measure_memory.py):
    each RMSNorm's fp32 input and normalized output; the inputs of q/k/v (one tensor, or three casts under autocast),
    of gate/up (one, or two casts), of o and of down; SDPA's q, k and v (k and v repeated to all heads when grouped:
    transformers' repeat_kv, unless one KV head makes it a view) and its logsumexp; gate's output, silu's and up's.
    With activation checkpointing only each layer's input is kept, plus one layer's saved tensors during its recompute.
    """
    h, q, i, b = shape.hidden_size, shape.q_dim, shape.intermediate_size, compute_bytes
    kv = shape.kv_dim if shape.num_kv_heads == 1 else q  # what SDPA saves of K and of V
    r = 4 if autocast else b  # the residual stream's bytes
    norms = 2 * (4 * h + r * h + 4)  # fp32 input, normalized output, 1 / rms
    inputs = 5 * b * h if autocast else 2 * r * h  # q/k/v and gate/up inputs
    per_layer = norms + inputs + b * q + b * i + b * (q + 2 * kv) + 4 * shape.num_heads + 3 * b * i
    shared = (4 + r) * h + b * seq_len + 2 * 4 * shape.head_dim  # final norm, the mask's share, rotary cos/sin
    if checkpointing:
        return shape.num_layers * r * h + per_layer + shared
    return shape.num_layers * per_layer + shared


def learner_memory(
    shape: ModelShape,
    *,
    world_size: int,
    precision: str,
    sharded: bool,
    autocast: bool,
    checkpointing: bool,
    tokens: int,
    chunk_tokens: int,
    reference: bool,
    cpu_offload: bool = False,
    seq_len: int = 0,
    response_tokens: int | None = None,
    lora_rank: int = 0,
) -> dict[str, int]:
    """Bytes one rank's device holds at the learner's peak, by what holds them: the backward of a micro-batch of
    `tokens` padded tokens (`response_tokens` of them through the LM head, default all) that is not the first of its
    update, so every gradient already exists. The peak is the largest of three moments: the head's forward (two
    [chunk, vocab] fp32 logits buffers beside every activation); the start of backward, where the head's weight
    gradient is built in fp32 (under bf16 also a bf16 product and its fp32 copy per chunk); and the end of backward,
    where the activations are gone but the embedding's gradient is built (with a tied head, three [vocab, hidden]
    gradients at once). The parts returned are those of the peak moment: "logits" is the head's share and the
    embedding's at the end of backward. With trainer.cpu_offload the master
    weights, gradients and AdamW state live in host memory (`host` below, not on the device). `sharded` (FSDP2) and
    `autocast` (bf16 compute over fp32 weights, a world of one) are rlvr.settings.sharded's and .autocast's answers.

    `lora_rank` > 0 (model.lora.rank, every linear layer adapted): the base is frozen in the compute dtype and only the
    adapter has fp32 weights, gradients and AdamW state; no reference model (the reference is a snapshot of the adapter, lora.Snapshot); the head and the
    embedding get no gradient; each adapted projection saves its [rank] intermediate, and under autocast a second bf16
    cast of its input for A. Derived from rlvr.lora's structure, not yet checked by scripts/measure_memory.py.
    """
    n, w, b, v, h = shape.num_params, world_size, DTYPE_BYTES[precision], shape.vocab_size, shape.hidden_size
    m = tokens if response_tokens is None else response_tokens
    c = max(1, min(m, chunk_tokens))
    on_device = 0 if cpu_offload else 1
    a = shape.lora_params(lora_rank)
    state = {
        "weights": 4 * n // w,
        "gradients": 4 * n // w,
        "optimizer": 8 * n // w,
        "reference": b * n // w if reference else 0,
    }
    if lora_rank:
        state = {"weights": (b * n + 4 * a) // w, "gradients": 4 * a // w, "optimizer": 8 * a // w, "reference": 0}
    # the compute copies: autocast's bf16 casts of every matmul weight (the head's included), kept for backward; or
    # FSDP2's gathered root (embedding, head) and two layers (the current one and the prefetched next one)
    if autocast and lora_rank:  # the base is bf16 already: autocast casts only the adapter
        copies = copies_backward = 2 * a
    elif autocast:
        copies = 2 * (shape.num_layers * shape.linear_params + shape.embedding_params)
        copies_backward = copies if not checkpointing else 2 * (shape.linear_params + shape.embedding_params)
    elif sharded and b == 2:
        copies = copies_backward = b * (shape.root_params + 2 * shape.layer_params)
    else:  # fp32: FSDP2 gathers the fp32 shards themselves
        copies = copies_backward = 4 * (shape.root_params + 2 * shape.layer_params) if sharded else 0
    per_token = activation_bytes_per_token(
        shape, compute_bytes=b, checkpointing=checkpointing, autocast=autocast, seq_len=seq_len
    )
    if lora_rank:  # per adapted projection its [r] intermediate; under autocast A's own cast of q/k/v/gate/up's input
        per_token += shape.num_layers * (7 * lora_rank * b + (5 * b * h if autocast else 0))
    activations = tokens * per_token + m * (b * h + 8)  # + the head's saved input and logsumexp
    head_forward = 2 * 4 * c * v
    head_weight_grad = 0 if lora_rank else 4 * v * h + (6 * v * h if b == 2 else 0)  # a frozen head has none
    head_backward = head_weight_grad + 4 * c * v + (2 * c * v if b == 2 else 0) + b * m * h
    # the end of backward, activations gone: the embedding's dense gradient; a tied head's gradient waits in autograd's
    # buffer for it and the two are summed; FSDP2's root then casts its gradients to fp32 for the reduce-scatter
    root, vh = shape.root_params, shape.embedding_params
    if sharded:
        copies_end, grads_end = b * root, (b + 4) * root + (2 * b * vh if shape.tied_embeddings else 0)
    else:
        copies_end, grads_end = 0, 4 * vh * (3 if shape.tied_embeddings else 1)
    if lora_rank:  # a frozen embedding and head: no gradient at the end of backward
        grads_end = 0
    moments = [
        (head_forward + copies + activations, head_forward, copies, activations),
        (head_backward + copies_backward + activations, head_backward, copies_backward, activations),
        (grads_end + copies_end, grads_end, copies_end, 0),
    ]
    _, logits, compute, activations = max(moments)
    # the reference is built like the policy (sharded, offloaded), in the compute dtype
    return {k: on_device * x for k, x in state.items()} | {
        "compute_weights": compute,
        "activations": activations,
        "logits": logits,
    }


def learner_resident(memory: dict[str, int]) -> int:
    """What the learner keeps on the device between updates (through the rollout phase): weights, AdamW state and the
    reference; gradients are freed (zero_grad(set_to_none)) and activations die with their backward."""
    return memory["weights"] + memory["optimizer"] + memory["reference"]


def learner_host_bytes(shape: ModelShape, *, world_size: int, cpu_offload: bool, lora_rank: int = 0) -> int:
    """Host memory per rank for the learner's state under trainer.cpu_offload (0 without it)."""
    if not cpu_offload:
        return 0
    if lora_rank:  # the frozen base (stored as trained in the compute dtype; fp32 here, the worst case) and the adapter's 16 bytes
        return (4 * shape.num_params + 16 * shape.lora_params(lora_rank)) // world_size
    return 16 * shape.num_params // world_size


def kv_bytes_per_token(shape: ModelShape, *, dtype: str, tensor_parallel_size: int = 1) -> int:
    """KV cache per token on one engine rank: K and V of every layer (kv heads split over tensor-parallel ranks, at
    least one each)."""
    heads = max(1, shape.num_kv_heads // tensor_parallel_size)
    return 2 * shape.num_layers * heads * shape.head_dim * DTYPE_BYTES[dtype]


def engine_memory(
    shape: ModelShape, *, dtype: str, kv_cache_bytes: int, tensor_parallel_size: int = 1
) -> dict[str, int]:
    """Bytes one engine rank holds awake: its weights at its dtype (split over tensor-parallel ranks), its KV cache and
    ENGINE_OVERHEAD_BYTES."""
    weights = shape.num_params * DTYPE_BYTES[dtype] // tensor_parallel_size
    return {"weights": weights, "kv_cache": kv_cache_bytes, "overhead": ENGINE_OVERHEAD_BYTES}


def round_tokens(*, rows: int, prompt_tokens: int, max_new_tokens: int) -> int:
    """KV cache tokens that one rollout round needs to run all its rows at once."""
    return rows * (prompt_tokens + max_new_tokens)
