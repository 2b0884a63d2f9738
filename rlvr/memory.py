"""Memory arithmetic of a run, from the model's config.json alone: no torch, nothing loaded. (~450 lines, one job:
every byte a run holds on a GPU and a node, counted per tensor with its reason; the model's arithmetic and the run's
phases share the same per-token and per-parameter figures, so they stay in one place.)

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

The engine's figures (`engine_memory`) follow vLLM's GPU worker as read in its source (0.32 installed here; the
0.33 run on GPUs has the same structure where it was compared): its weights, its KV cache (rollout.kv_cache_gib, passed
as kv_cache_memory_bytes), the start-up profile's forward activations, the sampler's [max_num_seqs, vocab] buffers,
CUDA graphs and LoRA adapter slots; `engine_asleep` is what of it stays on the device while it sleeps, and
`host_memory` what a node's RAM holds (sleep copies, CPU offload, the final export, vLLM's CPU LoRA cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8,
               "fp32": 4, "bf16": 2}  # fmt: skip
MIB = 2**20
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
    dtype: str = "float32"  # config.json's torch_dtype: what the model's files are stored in (the final export's)
    context: int | None = None  # max_position_embeddings: the longest row (prompt + response) the model takes

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
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
            context=int(config["max_position_embeddings"]) if config.get("max_position_embeddings") else None,
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


def context_problem(context: int | None, max_new_tokens: int) -> str | None:
    """Why no row fits a model's context of `context` tokens (None: one can, or the context is not known):
    rollout.max_new_tokens leaves no room for a prompt. Start-up (rlvr.prompts) and `rlvr plan` ask the same."""
    if context is None or max_new_tokens < context:
        return None
    return (f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {context} "
            f"tokens (max_position_embeddings); set rollout.max_new_tokens to the context less the prompts' length, "
            f"e.g. {max(context - 1024, context // 2)}")


def activation_bytes_per_token(
    shape: ModelShape, *, compute_bytes: int, checkpointing: bool, autocast: bool = False, seq_len: int = 0
) -> int:
    """Activation memory that backward keeps per token of a micro-batch, all layers and the final norm (SDPA: no
    [T, T] scores). `autocast`: bf16 compute by autocast over fp32 weights (a world of one), where the residual stream
    stays fp32 and each projection casts its own copy of its input; else the weights are in the compute dtype (fp32,
    or FSDP2's bf16). `seq_len`: the padded row length (no [rows, 1, L, L] attention mask is built: the learner
    passes none for its right-padded rows, rlvr.lm_head, so attention runs causal and nothing grows with L^2).

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
    shared = (4 + r) * h + 2 * 4 * shape.head_dim  # final norm, rotary cos/sin
    if checkpointing:
        return shape.num_layers * r * h + per_layer + shared
    return shape.num_layers * per_layer + shared


def lora_bytes_per_token(shape: ModelShape, rank: int, *, compute_bytes: int, autocast: bool, checkpointing: bool) -> int:
    """What a rank-`rank` adapter on every linear layer adds to activation_bytes_per_token (0 without LoRA): per
    adapted projection its [rank] intermediate; under autocast A's own cast of q/k/v/gate/up's input. With activation
    checkpointing (transformers' per decoder layer, which holds the adapters) one layer's, during its recompute."""
    if not rank:
        return 0
    b = compute_bytes
    layers = 1 if checkpointing else shape.num_layers
    return layers * (7 * rank * b + (5 * b * shape.hidden_size if autocast else 0))


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
    cast of its input for A (lora_bytes_per_token: one layer's under activation checkpointing). Derived from rlvr.lora's
    structure, not yet checked by scripts/measure_memory.py.
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
    per_token += lora_bytes_per_token(shape, lora_rank, compute_bytes=b, autocast=autocast, checkpointing=checkpointing)
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


# vLLM's batch defaults for its LLM class on a GPU (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): 1024
# sequences and 16,384 batched tokens on a GPU of >= 70 GiB that is not an A100 (H100, H200; B200's >= 160 GiB alike),
# else 256 and 8192; on CPUs 256 and 4096 per engine rank (tensor parallelism).
VLLM_SEQS_LARGE_GPU, VLLM_SEQS = 1024, 256
VLLM_TOKENS_LARGE_GPU, VLLM_TOKENS = 16384, 8192
VLLM_CPU_TOKENS = 4096
VLLM_MAX_CAPTURE = 512  # vLLM's default largest CUDA-graph batch (1024 on data-center Blackwell)
SAMPLER_SMS = 132  # the SMs of an H100/H200 SXM: rows of vLLM's Triton top-k/top-p scratch buffer, at most
# CUDA graphs: vLLM's own estimate (gpu_model_runner.profile_cudagraph_memory) is the largest graph's share of the
# shared graph pool plus a per-graph cost of at least 1 MiB. The per-graph cost here, 2 MiB + 256 KiB per decoder
# layer (a graph's kernel nodes grow with the layers), is calibrated on vLLM's published capture logs ("Graph capturing
# finished in 14 secs, took 0.21 GiB": Llama-3.2-1B, 16 layers, 35 graphs: ~6 MiB each): 0.5-7B models come to
# 0.7-0.9 GiB at 256 sequences (86 graphs), twice the graphs with LoRA. An estimate, not a measurement: vLLM logs the
# real figure at start-up ("Graph capturing finished in N secs, took X GiB").
GRAPH_BYTES = 2 * MIB
GRAPH_BYTES_PER_LAYER = 256 * 2**10
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM allows (vllm.config.lora.MaxLoRARanks)
EXPORT_SHARD_BYTES = 2 * GIB  # the final export's largest safetensors shard, held while it is written


def vllm_batch_defaults(*, cuda: bool, memory_gib: float, name: str, tensor_parallel_size: int = 1) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that vLLM's LLM class takes by default on this device."""
    if not cuda:
        return VLLM_CPU_TOKENS * tensor_parallel_size, VLLM_SEQS * tensor_parallel_size
    if memory_gib >= 70 and "a100" not in name.lower():
        return VLLM_TOKENS_LARGE_GPU, VLLM_SEQS_LARGE_GPU
    return VLLM_TOKENS, VLLM_SEQS


def cuda_graph_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[list[int], list[int]]:
    """The batch sizes vLLM captures (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, and
    vllm/v1/cudagraph_dispatcher.py under its default FULL_AND_PIECEWISE mode): (mixed prefill-decode PIECEWISE
    graphs, decode-only FULL graphs). Up to min(2 x max_num_seqs, 512, max_num_batched_tokens): 1, 2, 4, multiples of
    8 below 256, multiples of 16 from 256, plus max_num_seqs and max_num_batched_tokens where they fit; FULL graphs for
    the sizes up to max_num_seqs."""
    largest = min(2 * max_num_seqs, VLLM_MAX_CAPTURE)
    cap = min(largest, max_num_batched_tokens)
    sizes = {x for x in (1, 2, 4) if x <= cap} | set(range(8, min(cap + 1, 256), 8)) | set(range(256, cap + 1, 16))
    if max_num_batched_tokens <= cap:
        sizes.add(max_num_batched_tokens)
    if max_num_seqs <= largest and max_num_seqs <= max_num_batched_tokens:
        sizes.add(max_num_seqs)
    piecewise = sorted(sizes)
    return piecewise, [x for x in piecewise if x <= max_num_seqs]


def engine_forward_bytes_per_token(shape: ModelShape, *, dtype: str, tensor_parallel_size: int = 1) -> int:
    """An inference forward's live activations per token at its peak, the MLP of a layer (vLLM's Qwen2/Llama layers,
    no autograd): the residual and the normed input [h], gate_up's output [2 i] and the activation's [i] (i split over
    tensor-parallel ranks), in the engine's dtype."""
    i = shape.intermediate_size // tensor_parallel_size
    return DTYPE_BYTES[dtype] * (2 * shape.hidden_size + 3 * i)


def engine_memory(
    shape: ModelShape,
    *,
    dtype: str,
    kv_cache_bytes: int,
    tensor_parallel_size: int = 1,
    max_num_seqs: int = VLLM_SEQS,
    max_num_batched_tokens: int = VLLM_TOKENS,
    cuda_graphs: bool = True,
    lora_rank: int = 0,
    max_loras: int = 1,
) -> dict[str, int]:
    """Bytes one engine rank holds awake, by what holds them (vLLM's v1 GPU worker, read in its source):

    weights       the model in the engine's dtype, split over tensor-parallel ranks.
    lora          model.lora.sync=adapter (`lora_rank`: the engine's max_lora_rank, rlvr.settings.engine_lora_rank):
                  each adapted linear layer's slots, lora_a [max_loras, 1, r, in] and lora_b [max_loras, 1, out, r]
                  in the engine's dtype (vllm/lora/layers/base_linear.py create_lora_weights): max_loras x r x (in +
                  out) of q, k, v, o, gate, up, down per layer = max_loras x ModelShape.lora_params(r) x bytes.
    kv_cache      rollout.kv_cache_gib (vLLM's kv_cache_memory_bytes).
    activations   the start-up profile's forward (gpu_worker.determine_available_memory -> profile_run ->
                  _dummy_run(max_num_batched_tokens)), which a rollout step of that many tokens reaches again:
                  max_num_batched_tokens x engine_forward_bytes_per_token. Freed into torch's cache after each step,
                  handed back by sleep (CuMemAllocator.sleep ends in empty_cache).
    sampler       the sampler at max_num_seqs rows (_dummy_sampler_run; vllm/v1/sample/sampler.py, with rlvr's
                  logprobs_mode=processed_logprobs through TopKTopPSampler.forward_native): the logits in the engine's
                  dtype, their fp32 copy (none for an fp32 engine), the processed logprobs (log_softmax, fp32), the
                  probabilities (softmax, fp32) and random_sample's exponential noise (fp32), all live at once:
                  max_num_seqs x vocab x (bytes + 4 + 12). Transient, like the activations (counted beside them,
                  though torch's cache may serve one from the other's freed blocks).
    sampler_scratch  the Triton top-k/top-p kernel's cached buffer, [min(SMs, max_num_seqs) rows (a power of two at
                  most the SMs), vocab] fp32 (vllm/v1/sample/ops/topk_topp_triton.py): kept for the process's life.
    cuda_graphs   (rollout.cuda_graphs) cuda_graph_sizes' PIECEWISE and FULL graphs, each captured twice with LoRA
                  (vLLM's cudagraph_specialize_lora: with and without an active adapter), at GRAPH_BYTES +
                  GRAPH_BYTES_PER_LAYER x layers each, plus the shared graph pool's intermediate tensors for the
                  largest captured batch (its size x engine_forward_bytes_per_token).
    """
    b, v, sms = DTYPE_BYTES[dtype], shape.vocab_size, SAMPLER_SMS
    forward = engine_forward_bytes_per_token(shape, dtype=dtype, tensor_parallel_size=tensor_parallel_size)
    graphs = 0
    if cuda_graphs:
        piecewise, full = cuda_graph_sizes(max_num_seqs, max_num_batched_tokens)
        count = (len(piecewise) + len(full)) * (2 if lora_rank else 1)
        graphs = count * (GRAPH_BYTES + GRAPH_BYTES_PER_LAYER * shape.num_layers) + max(piecewise) * forward
    programs = min(sms, max_num_seqs)
    scratch_rows = min(1 << (programs - 1).bit_length(), sms)
    parts = {
        "weights": shape.num_params * b // tensor_parallel_size,
        "lora": max_loras * shape.lora_params(lora_rank) * b // tensor_parallel_size,
        "kv_cache": kv_cache_bytes,
        "activations": max_num_batched_tokens * forward,
        "sampler": max_num_seqs * v * (b + (4 if b != 4 else 0) + 12),
        "sampler_scratch": scratch_rows * v * 4,
        "cuda_graphs": graphs,
    }
    return parts if lora_rank else {k: x for k, x in parts.items() if k != "lora"}


def engine_overhead(parts: dict[str, int]) -> int:
    """What an awake engine holds beside its weights and KV cache (rlvr.settings sizes the KV cache from it)."""
    return sum(x for k, x in parts.items() if k not in ("weights", "kv_cache"))


def engine_asleep(parts: dict[str, int], *, offload_cudagraphs: bool = False) -> dict[str, int]:
    """What of an engine (engine_memory's parts) stays on the device while it sleeps, at level 1 or 2 alike: vLLM's
    cumem sleep (vllm/device_allocator/sleep_mode_backend.py, CuMemAllocator.sleep) releases the weights and LoRA slots
    (allocated in its "weights" pool: copied to host at level 1, dropped at level 2) and the KV cache, then empties
    torch's cache (the activations' and the sampler's freed blocks); CUDA graphs live in torch's graph pool and stay
    unless vLLM's sleep_mode_offload_cudagraph copies them to host; the sampler's scratch buffer stays."""
    return {"cuda_graphs": 0 if offload_cudagraphs else parts.get("cuda_graphs", 0),
            "sampler_scratch": parts.get("sampler_scratch", 0)}  # fmt: skip


def engine_idle(parts: dict[str, int]) -> dict[str, int]:
    """What an engine that does not sleep (rollout.sleep=false) holds while the learner runs: everything but its
    activations and sampler buffers, freed blocks in torch's cache that the learner (the same process) reuses."""
    return {k: x for k, x in parts.items() if k not in ("activations", "sampler")}


def sleep_level(*, sleep: bool, adapter_sync: bool) -> int:
    """The vLLM sleep level rlvr.rollout's engine uses: 0 when it does not sleep; 1 for a LoRA adapter's engine
    (model.lora.sync=adapter: the base must survive, copied to pinned host memory and back); 2 otherwise (every
    full-weight push replaces all the weights: they are dropped)."""
    return 0 if not sleep else (1 if adapter_sync else 2)


def host_memory(
    shape: ModelShape,
    engine: dict[str, int],
    *,
    world_size: int,
    ranks_per_node: int,
    level: int,
    cpu_offload: bool,
    lora_rank: int = 0,
    engine_dtype: str = "bfloat16",
    adapter_sync: bool = False,
    offload_cudagraphs: bool = False,
) -> dict[str, int]:
    """Host memory (bytes) on the busiest node (rank 0's), by what holds it, for `ranks_per_node` ranks:

    sleep_copies   level 1: each rank's engine weights and LoRA slots, copied to pinned host memory while it sleeps
                   (CuMemAllocator.sleep with the "weights" tag offloaded); level 2 keeps none (CUDA graphs too when
                   vLLM's sleep_mode_offload_cudagraph is set, at either level).
    learner_offload  trainer.cpu_offload: each rank's share of the learner's state (learner_host_bytes).
    lora_cache     adapter sync: vLLM's CPU LoRA cache (max_cpu_loras=1): one adapter of the learner's rank, in the
                   engine's dtype, per rank.
    export         rank 0's final export, streamed in the model's own dtype (config.json's torch_dtype): one
                   safetensors shard being written (EXPORT_SHARD_BYTES) plus the largest unit gathered at a time (a
                   decoder layer, or the root: embedding, head and final norm).
    """
    copies = 0
    if level == 1:
        copies = engine["weights"] + engine.get("lora", 0)
    if level and offload_cudagraphs:
        copies += engine.get("cuda_graphs", 0)
    unit = max(shape.layer_params, shape.root_params) * DTYPE_BYTES.get(shape.dtype, 4)
    return {
        "sleep_copies": ranks_per_node * copies,
        "learner_offload": ranks_per_node * learner_host_bytes(shape, world_size=world_size, cpu_offload=cpu_offload,
                                                                lora_rank=lora_rank),
        "lora_cache": ranks_per_node * (shape.lora_params(lora_rank) * DTYPE_BYTES[engine_dtype] if adapter_sync else 0),
        "export": EXPORT_SHARD_BYTES + unit,
    }  # fmt: skip


def round_tokens(*, rows: int, prompt_tokens: int, max_new_tokens: int) -> int:
    """KV cache tokens that one rollout round needs to run all its rows at once."""
    return rows * (prompt_tokens + max_new_tokens)
