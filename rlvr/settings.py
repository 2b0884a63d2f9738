"""Device-dependent settings, resolved once: every `auto` in the config becomes a value, from the device and the model.
(~510 lines, one job: each resolution rule beside the table it fills and the device description it reads, so a run,
a resume and `rlvr plan` resolve alike; rlvr.memory holds the arithmetic the rules call.)

A setting whose right value depends on the device or the model takes `auto` in the recipe tree. `resolve` turns them
into values, deterministically, from a description of the device (`DeviceSpec`: what it is and can do, never a timing)
and of the model (`ModelShape`, from config.json). The trainer resolves at start-up, writes the result into the run
folder (`settings.json`) and a resume takes it from there, so a run keeps what it started with; `rlvr plan` calls the
same function on a described GPU, so the plan and the run cannot disagree. No torch here.

    setting                          CUDA                                        CPU
    trainer.precision                bf16 (fp32 master weights; fp32 before     bf16 with AVX512-BF16 or AMX, else fp32
                                     compute capability 8.0)
    rollout.dtype                    bfloat16 (float16 before 8.0)              float32 (an fp32 learner's logprobs
                                                                                exactly; beside a bf16 learner closer
                                                                                than a bf16 engine: weight_sync.md)
    (what a push sends)              the weights the learner computes with, in the engine's dtype (push_rule): under a
                                     bf16 learner the masters rounded to bf16 (an fp32 engine gets them widened, and
                                     start-up pushes them once: the engine's own load would hold the unrounded masters);
                                     else the masters (with LoRA: its bf16 base + the merged adapter)
    rollout.cuda_graphs              true                                       false
    rollout.sleep                    true (the engine frees the GPU while the   false (vLLM has no sleep mode on CPU)
                                     learner runs)
    rollout.max_num_seqs             the rows of one rollout round or           the same, at most 256 (vLLM's CPU default)
                                     evaluation on one engine (round_rows), to
                                     a multiple of 8, at most vLLM's default
                                     (1024 on >= 70 GiB but A100s, else 256)
    rollout.kv_cache_gib             gpu_memory_utilization of the GPU, less    (unused: rollout.cpu_kv_cache_gib)
                                     the engine's weights and what it holds
                                     besides (rlvr.memory.engine_memory)
    trainer.tf32                     true                                       false
    trainer.logits_chunk_tokens      memory/128 over 4 x vocab bytes, as a      64 MiB over 4 x vocab bytes (measured on
                                     power of two in [1024, 8192]               2 cores: larger chunks fault pages)
    trainer.activation_checkpointing on when without it neither the planned     false
                                     micro-batch (planned_micro_batch) nor
                                     MIN_GPU_TOKENS fit half the room
    trainer.micro_batch_tokens       half the memory the learner's state leaves  2048
                                     (rlvr.memory), over activation bytes per
                                     token, a power of two in [2048, 65536];
                                     at least the planned micro-batch if it fits
    trainer.torch_threads            cores / ranks on this machine, at most 8   cores / ranks on this machine

The built-in model (`builtin:`) is 1M parameters: fp32 learner and engine wherever it runs (its matmuls are too small
for bf16 to pay, and fp32 keeps the engine's logprobs equal to the learner's). That comes from its identity, not from
a preset, so pointing model.path at another model gets that model's settings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rlvr.choices import RoundSize
from rlvr.config import AUTO, ConfigError, Precision
from rlvr.memory import (
    DTYPE_BYTES,
    GIB,
    USABLE_FRACTION,
    VLLM_LORA_RANKS,
    ModelShape,
    activation_bytes_per_token,
    engine_asleep,
    engine_idle,
    engine_memory,
    engine_overhead,
    learner_memory,
    lora_bytes_per_token,
    vllm_batch_defaults,
)

SETTINGS_FILE = "settings.json"  # in the run folder: the device and what every setting resolved to
CPU_TOKENS = 2048  # trainer.micro_batch_tokens on a CPU (measured: larger micro-batches do not speed 2 cores up)
CPU_LOGITS_CHUNK_BYTES = 64 * 2**20  # one chunk of fp32 logits on a CPU
COMPILE_UNMEASURED = ("trainer.compile is measured and tested on one unsharded rank without activation checkpointing or "
                      "LoRA; set trainer.compile=false, or trainer.activation_checkpointing=false, model.lora.rank=0 and "
                      "one rank without trainer.cpu_offload")  # fmt: skip
MIN_GPU_TOKENS = 16384  # verl's per-GPU token budget: below it, activation checkpointing buys a larger micro-batch
MAX_GPU_TOKENS = 65536
MAX_THREADS_GPU = 8  # on a GPU machine the CPU only feeds the device
ASSUMED_PROMPT_TOKENS = 512  # the prompt length planned for when data.max_prompt_tokens is 0 (no limit)
SEQS_MULTIPLE = 8  # rollout.max_num_seqs=auto rounds a round's rows up to a multiple of this


@dataclass(frozen=True)
class DeviceSpec:
    """What a rank computes on: enough to resolve the settings, nothing measured."""

    kind: str  # "cuda" | "cpu"
    name: str  # "NVIDIA H100 80GB HBM3", "AMD EPYC 9R14"
    memory_gib: float  # one device's memory (a CPU: the machine's RAM)
    bf16: bool  # native bf16 matmuls: compute capability >= 8.0; a CPU with AVX512-BF16 or AMX
    cores: int  # CPU cores this process may use
    local_ranks: int = 1  # ranks sharing this machine's cores

    @classmethod
    def detect(cls, local_ranks: int = 1) -> DeviceSpec:
        """This rank's device (torch imported here only)."""
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return cls("cuda", props.name, props.total_memory / GIB, props.major >= 8, cores, local_ranks)
        return cls("cpu", _cpu_name(), _ram_gib(), bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"}), cores, local_ranks)

    @classmethod
    def gpu(cls, memory_gib: float, name: str = "GPU", *, bf16: bool = True, cores: int = 16, local_ranks: int = 1) -> DeviceSpec:
        """A described CUDA device (rlvr plan, tests)."""
        return cls("cuda", name, memory_gib, bf16, cores, local_ranks)


@dataclass(frozen=True)
class Settings:
    """The resolved values of every device-dependent setting (the config's own names)."""

    precision: str  # trainer.precision: bf16 (autocast over the fp32 weights) | fp32 (the weights' own dtype)
    engine_dtype: str  # rollout.dtype
    cuda_graphs: bool  # rollout.cuda_graphs
    sleep: bool  # rollout.sleep
    max_num_seqs: int  # rollout.max_num_seqs: what rlvr.rollout passes to vLLM's LLM(max_num_seqs=...)
    kv_cache_gib: float  # rollout.kv_cache_gib (0 on CPU: rollout.cpu_kv_cache_gib sizes it there)
    tf32: bool  # trainer.tf32
    logits_chunk_tokens: int  # trainer.logits_chunk_tokens
    activation_checkpointing: bool  # trainer.activation_checkpointing
    micro_batch_tokens: int  # trainer.micro_batch_tokens
    torch_threads: int  # trainer.torch_threads

    KEYS = {  # field -> config key
        "precision": "trainer.precision",
        "engine_dtype": "rollout.dtype",
        "cuda_graphs": "rollout.cuda_graphs",
        "sleep": "rollout.sleep",
        "max_num_seqs": "rollout.max_num_seqs",
        "kv_cache_gib": "rollout.kv_cache_gib",
        "tf32": "trainer.tf32",
        "logits_chunk_tokens": "trainer.logits_chunk_tokens",
        "activation_checkpointing": "trainer.activation_checkpointing",
        "micro_batch_tokens": "trainer.micro_batch_tokens",
        "torch_threads": "trainer.torch_threads",
    }

    def lines(self, asked: dict[str, Any]) -> list[str]:
        """One `key=value` per setting, `(auto)` after those that were resolved."""
        return [f"{key}={_show(getattr(self, f))}" + (" (auto)" if asked[key] == AUTO else "") for f, key in self.KEYS.items()]


def sharded(world_size: int, cpu_offload: bool) -> bool:
    """Whether the learner trains under FSDP2: over several ranks, or alone for trainer.cpu_offload (an FSDP2 feature).
    A world of one otherwise trains the plain module: FSDP2 over one rank shards nothing but puts DTensor dispatch and
    parameter copy-in/out on every op (63 vs 42 ms per update of the built-in model, +50%)."""
    return world_size > 1 or cpu_offload


def autocast(precision: str, is_sharded: bool) -> bool:
    """Whether bf16 compute is torch.autocast over the fp32 weights (the plain module: fp32 residual stream,
    per-projection casts); sharded, FSDP2's mixed-precision policy casts the weights instead."""
    return precision == "bf16" and not is_sharded


def push_rounding(precision: str, *, lora: bool) -> str | None:
    """The dtype a full-weight push rounds the master weights to before it casts them to the engine's dtype
    (Learner.pushed_weights): bfloat16 where the learner computes in bf16, since its forward computes with the masters
    so rounded (autocast's casts, FSDP2's bf16 gathers); None where it computes with the masters themselves, or with
    LoRA (the base is stored in the compute dtype already, and the learner adds the adapter's product unrounded)."""
    return "bfloat16" if precision == "bf16" and not lora else None


def startup_push(precision: str, engine_dtype: str) -> bool:
    """Whether start-up pushes the learner's weights before the sync check's baseline: where the engine's own load of
    model.path (cast to its dtype) is not what a push sends, a bf16 learner beside an engine that is not bf16 (it
    would hold the unrounded masters, or with LoRA an unrounded base, until the first push)."""
    return precision == "bf16" and engine_dtype != "bfloat16"


def push_rule(s: Settings, *, lora_rank: int) -> dict[str, Any]:
    """The push rule for settings.json and rlvr plan: what the learner computes in, what the engine holds, what a push
    sends it and whether start-up pushes once."""
    compute = "bfloat16" if s.precision == "bf16" else "float32"  # fp32: the masters' dtype (float64 in exact tests)
    rounding = push_rounding(s.precision, lora=bool(lora_rank))
    sent = f"master weights rounded to {rounding}" if rounding else ("base + merged adapter" if lora_rank else "master weights")
    return {"learner_compute": compute, "engine": s.engine_dtype, "pushed": f"{sent}, in {s.engine_dtype}",
            "startup_push": startup_push(s.precision, s.engine_dtype)}  # fmt: skip


def push_note(s: Settings, *, lora_rank: int) -> str:
    """The push rule in words, naming the settings that decide it (rlvr.sync_check's messages)."""
    rule = push_rule(s, lora_rank=lora_rank)
    return (f"the learner computes in {rule['learner_compute']} (trainer.precision={s.precision}), the engine in "
            f"{s.engine_dtype} (rollout.dtype) and a push sends it the {rule['pushed']}")  # fmt: skip


def asked(cfg: Any) -> dict[str, Any]:
    """What the config says for each device-dependent key (auto or a value)."""
    return {key: _get(cfg, key) for key in Settings.KEYS.values()}


def resolve(cfg: Any, device: DeviceSpec, shape: ModelShape, *, world_size: int, builtin: bool) -> Settings:
    """The value of every device-dependent setting: the config's where it gives one, else the rule for `device`
    (module docstring). `cfg` is a validated Config. ConfigError for a value the device cannot honour."""
    want = asked(cfg)
    cuda = device.kind == "cuda"
    model_dtype = cfg.model.dtype

    def pick(key: str, rule: Any) -> Any:
        return rule if want[key] == AUTO else want[key]

    if model_dtype in ("bfloat16", "float16", "half"):
        raise ConfigError(
            f"model.dtype={model_dtype} would make the master weights and the AdamW state {model_dtype}: an update at "
            "lr 1e-6 is below its rounding step and is lost. Keep model.dtype=float32 (the master weights) and compute in "
            "bf16 with trainer.precision=bf16 (auto does so on GPUs)"
        )
    exact = model_dtype in ("float64", "double")  # asks for exact arithmetic (the tests' float64 references): no bf16
    precision = pick("trainer.precision", "fp32" if exact or builtin or not device.bf16 else "bf16")
    engine_rule = "float32" if builtin or not cuda else ("bfloat16" if device.bf16 else "float16")
    engine_dtype = pick("rollout.dtype", engine_rule)
    cuda_graphs = pick("rollout.cuda_graphs", cuda)
    sleep = pick("rollout.sleep", cuda)
    if sleep and not cuda:
        raise ConfigError("rollout.sleep=true: vLLM has no sleep mode on CPU (nothing to free for the learner there); use auto or false")
    seqs = int(pick("rollout.max_num_seqs", max_num_seqs_rule(cfg, device, world_size=world_size)))
    engine = engine_parts(cfg, device, shape, engine_dtype=str(engine_dtype), max_num_seqs=seqs,
                          cuda_graphs=bool(cuda_graphs), kv_cache_bytes=0)  # fmt: skip
    kv_rule = engine_kv_gib(cfg, device, engine) if cuda else 0.0
    kv_cache_gib = pick("rollout.kv_cache_gib", kv_rule)
    if cuda and kv_cache_gib <= 0:
        raise ConfigError(
            f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} of a {device.memory_gib:.0f} GiB GPU "
            f"leaves no room for a KV cache beside the engine's weights; raise it, or set rollout.kv_cache_gib"
        )
    engine["kv_cache"] = int(float(kv_cache_gib) * GIB) if cuda else 0
    tf32 = pick("trainer.tf32", cuda)
    chunk = pick("trainer.logits_chunk_tokens", logits_chunk_tokens(device, shape.vocab_size))
    compute_bytes = DTYPE_BYTES[precision]
    checkpointing = pick("trainer.activation_checkpointing", False)
    tokens = want["trainer.micro_batch_tokens"]
    bf16_autocast = autocast(precision, sharded(world_size, cfg.trainer.cpu_offload))
    if cuda and (tokens == AUTO or want["trainer.activation_checkpointing"] == AUTO):
        held = sum((engine_asleep(engine) if sleep else engine_idle(engine)).values())
        free = _activation_room(cfg, device, shape, world_size=world_size, precision=precision, engine=held, chunk=int(chunk))
        per_token = {c: _per_token(cfg, shape, compute_bytes, c, bf16_autocast) for c in (False, True)}
        _, _, planned = planned_micro_batch(cfg, world_size, 0)  # a rank's rows of a mini-batch, up to micro_batch_rows
        if want["trainer.activation_checkpointing"] == AUTO:
            # off when the planned micro-batch fits half the room as it is, or the room holds 16k tokens (verl's budget)
            checkpointing = free // 2 // per_token[False] < min(planned, MIN_GPU_TOKENS)
        if tokens == AUTO:
            tokens = _token_budget(free, per_token[bool(checkpointing)], planned)
    elif tokens == AUTO:
        tokens = CPU_TOKENS
    if cfg.trainer.compile and (checkpointing or sharded(world_size, cfg.trainer.cpu_offload) or cfg.model.lora.rank):
        raise ConfigError(COMPILE_UNMEASURED + f" (here: activation checkpointing {bool(checkpointing)}, world size "
                          f"{world_size}, cpu_offload {cfg.trainer.cpu_offload}, LoRA rank {cfg.model.lora.rank})")  # fmt: skip
    threads = pick("trainer.torch_threads", max(1, min(MAX_THREADS_GPU if cuda else device.cores, device.cores // device.local_ranks)))
    return Settings(
        precision=str(precision),
        engine_dtype=str(engine_dtype),
        cuda_graphs=bool(cuda_graphs),
        sleep=bool(sleep),
        max_num_seqs=seqs,
        kv_cache_gib=round(float(kv_cache_gib), 2),
        tf32=bool(tf32),
        logits_chunk_tokens=int(chunk),
        activation_checkpointing=bool(checkpointing),
        micro_batch_tokens=int(tokens),
        torch_threads=int(threads),
    )


def engine_kv_gib(cfg: Any, device: DeviceSpec, engine: dict[str, int]) -> float:
    """The KV cache a GPU engine gets: its share of the device (rollout.gpu_memory_utilization), less its weights (split
    over tensor-parallel ranks) and what it holds besides (rlvr.memory.engine_memory: the profiled activations, the
    sampler's buffers, CUDA graphs, LoRA slots)."""
    return cfg.rollout.gpu_memory_utilization * device.memory_gib - (engine["weights"] + engine_overhead(engine)) / GIB


def engine_parts(cfg: Any, device: DeviceSpec, shape: ModelShape, *, engine_dtype: str, max_num_seqs: int,
                 cuda_graphs: bool, kv_cache_bytes: int) -> dict[str, int]:
    """rlvr.memory.engine_memory for this config's engine on `device`: vLLM's default batched-token budget there, the
    LoRA slots of an adapter-synced engine (model.lora.sync=adapter)."""
    r = cfg.rollout
    batched, _ = vllm_batch_defaults(cuda=device.kind == "cuda", memory_gib=device.memory_gib, name=device.name,
                                     tensor_parallel_size=r.tensor_parallel_size)  # fmt: skip
    return engine_memory(shape, dtype=engine_dtype, kv_cache_bytes=kv_cache_bytes, tensor_parallel_size=r.tensor_parallel_size,
                         max_num_seqs=max_num_seqs, max_num_batched_tokens=batched, cuda_graphs=cuda_graphs,
                         lora_rank=engine_adapter_rank(cfg, engine_dtype))  # fmt: skip


def adapter_sync(cfg: Any, engine_dtype: str) -> bool:
    """Whether the engine follows a LoRA adapter as an adapter (rlvr.lora.sync_mode "adapter", with the engine's
    resolved dtype): model.lora.sync=adapter, or auto where the engine does not compute in float32."""
    lora = cfg.model.lora
    if not lora.rank:
        return False
    sync = lora.sync.value if hasattr(lora.sync, "value") else str(lora.sync)
    return sync == "adapter" or (sync == AUTO and engine_dtype not in ("float32", "float"))


def engine_adapter_rank(cfg: Any, engine_dtype: str) -> int:
    """The engine's max_lora_rank (engine_lora_rank: the smallest rank vLLM allows that holds the adapter's) when it
    takes the adapter as one, else 0."""
    return engine_lora_rank(cfg.model.lora.rank) if adapter_sync(cfg, engine_dtype) else 0


def engine_lora_rank(rank: int) -> int:
    """vLLM's max_lora_rank for an adapter of `rank`: the smallest it allows that holds it (it zero-pads the rest)."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ConfigError(f"model.lora.rank={rank}: vLLM takes adapters up to rank {VLLM_LORA_RANKS[-1]}; use model.lora.sync=merged or a smaller rank")
    return fits[0]


def max_num_seqs_rule(cfg: Any, device: DeviceSpec, *, world_size: int) -> int:
    """rollout.max_num_seqs=auto: the most rows one engine generates in one call (round_rows), rounded up to a
    multiple of 8, at most vLLM's own default on the device (rlvr.memory.vllm_batch_defaults)."""
    _, default = vllm_batch_defaults(cuda=device.kind == "cuda", memory_gib=device.memory_gib, name=device.name,
                                     tensor_parallel_size=cfg.rollout.tensor_parallel_size)  # fmt: skip
    rows = round_rows(cfg, world_size)
    return min(default, -(-rows // SEQS_MULTIPLE) * SEQS_MULTIPLE)


def engines(cfg: Any, world_size: int) -> int:
    """Engines in the run: one per rollout.tensor_parallel_size ranks (1 where that does not divide the world: a
    start-up error anyway)."""
    tp = cfg.rollout.tensor_parallel_size
    return max(1, world_size // tp) if world_size % tp == 0 else 1


def round_rows(cfg: Any, world_size: int) -> int:
    """The most rows (sequences) one engine is given in one generate call: a rollout round's share (rlvr.collect: B
    prompts, or with algo.round_size=adaptive up to max_gen_batches x B, in whole shares per engine, times G samples)
    or an evaluation's (rlvr.evaluation: its share of data.eval_size prompts, times eval.n samples when n > 0)."""
    a, n = cfg.algo, engines(cfg, world_size)
    adaptive = a.dynamic_sampling and a.round_size is RoundSize.adaptive
    prompts = a.prompts_per_step * (a.max_gen_batches if adaptive else 1)
    train = -(-prompts // n) * a.group_size
    evaluation = -(-cfg.data.eval_size // n) * max(1, cfg.eval.n)
    return max(train, evaluation)


def planned_micro_batch(cfg: Any, world_size: int, micro_batch_tokens: int) -> tuple[int, int, int]:
    """(rows, row tokens, padded tokens) of the largest micro-batch a rank trains on: its rows of a mini-batch
    (algo.prompts_per_minibatch x group_size over the ranks), at most trainer.micro_batch_rows, of the longest row
    (data.max_prompt_tokens, or ASSUMED_PROMPT_TOKENS without a limit, + rollout.max_new_tokens), within
    `micro_batch_tokens` (0: no token budget; at least one row)."""
    a, t = cfg.algo, cfg.trainer
    row = (cfg.data.max_prompt_tokens or ASSUMED_PROMPT_TOKENS) + cfg.rollout.max_new_tokens
    rows = min(t.micro_batch_rows, max(1, a.prompts_per_minibatch * a.group_size // world_size))
    if micro_batch_tokens:
        rows = max(1, min(rows, micro_batch_tokens // row))
    return rows, row, rows * row


def logits_chunk_tokens(device: DeviceSpec, vocab_size: int) -> int:
    """Tokens per chunk of the LM head's logits (rlvr.lm_head): [chunk, vocab] fp32, two buffers of it at a time."""
    if device.kind != "cuda":
        return max(1, CPU_LOGITS_CHUNK_BYTES // (4 * vocab_size))
    tokens = int(device.memory_gib * GIB / 128) // (4 * vocab_size)
    return min(8192, max(1024, _pow2_floor(tokens)))


def _activation_room(cfg: Any, device: DeviceSpec, shape: ModelShape, *, world_size: int, precision: str, engine: int, chunk: int) -> int:
    """Bytes left for activations on one GPU during the learner's phase: the usable part of the device, less what the
    learner holds besides activations at its peak (rlvr.memory.learner_memory: sharded fp32 weights, gradients and AdamW
    state, the reference, the compute copies of the weights, the LM head's chunks) and `engine`, what the engine keeps
    meanwhile (asleep: its CUDA graphs; awake: all but its transient buffers)."""
    offload = cfg.trainer.cpu_offload
    parts = learner_memory(shape, world_size=world_size, precision=precision, sharded=sharded(world_size, offload),
                           autocast=autocast(precision, sharded(world_size, offload)), checkpointing=False, tokens=chunk,
                           chunk_tokens=chunk, reference=cfg.algo.kl_coef > 0, cpu_offload=cfg.trainer.cpu_offload,
                           lora_rank=cfg.model.lora.rank)  # fmt: skip
    fixed = sum(v for k, v in parts.items() if k != "activations")
    return int(USABLE_FRACTION * device.memory_gib * GIB) - fixed - engine


def _per_token(cfg: Any, shape: ModelShape, compute_bytes: int, checkpointing: bool, autocast: bool) -> int:
    """Activation bytes per token of a micro-batch (rlvr.memory), the adapter's included."""
    return activation_bytes_per_token(shape, compute_bytes=compute_bytes, checkpointing=checkpointing, autocast=autocast) + \
        lora_bytes_per_token(shape, cfg.model.lora.rank, compute_bytes=compute_bytes, autocast=autocast, checkpointing=checkpointing)


def _token_budget(room: int, per_token: int, planned: int) -> int:
    """Half the room over the activation bytes per token, a power of two in [2048, MAX_GPU_TOKENS]; at least the
    planned micro-batch (`planned` tokens) where that fits half the room, so that it is not split for want of a power
    of two."""
    fits = room // 2 // per_token
    budget = min(MAX_GPU_TOKENS, max(CPU_TOKENS, _pow2_floor(max(1, fits))))
    return max(budget, planned) if planned <= fits else budget


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def record(out: Path, device: DeviceSpec, settings: Settings, *, lora_rank: int = 0) -> None:
    """Write settings.json into the run folder (rank 0): the device, the settings and the push rule they give."""
    data = {"device": asdict(device), "settings": asdict(settings), "push": push_rule(settings, lora_rank=lora_rank)}
    (out / SETTINGS_FILE).write_text(json.dumps(data, indent=1) + "\n")


def record_applied(out: Path, values: dict[str, Any]) -> None:
    """Add to settings.json what start-up applied once the engine had started (`applied`: read back, not asked for)."""
    path = out / SETTINGS_FILE
    data = json.loads(path.read_text())
    data["applied"] = {**data.get("applied", {}), **values}
    path.write_text(json.dumps(data, indent=1) + "\n")


def recorded(out: Path) -> tuple[DeviceSpec, Settings] | None:
    """What a run folder's settings.json says, or None if it has none."""
    path = out / SETTINGS_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())  # a setting added since the run started is None: resolved afresh on a resume
    return DeviceSpec(**data["device"]), Settings(**{f.name: data["settings"].get(f.name) for f in fields(Settings)})


def keep_recorded(cfg: Any, settings: Settings, previous: Settings) -> Settings:
    """On a resume: the values the run started with for every setting still left to auto (an explicit value wins; a
    setting the run's settings.json does not hold is resolved afresh)."""
    want = asked(cfg)
    kept = {f: getattr(previous if want[key] == AUTO and getattr(previous, f) is not None else settings, f)
            for f, key in Settings.KEYS.items()}  # fmt: skip
    return Settings(**kept)


def _get(cfg: Any, key: str) -> Any:
    section, name = key.split(".")
    value = getattr(getattr(cfg, section), name)
    return value.value if hasattr(value, "value") else value  # an enum's value


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return 0.0


def model_shape(model_path: str) -> ModelShape:
    """The shape of a resolved model path's model: its config.json, or (a hub id) transformers' AutoConfig."""
    path = Path(model_path) / "config.json"
    if path.is_file():
        return ModelShape.from_config(json.loads(path.read_text()))
    from transformers import AutoConfig

    return ModelShape.from_config(AutoConfig.from_pretrained(model_path).to_dict())


def apply(cfg: Any, s: Settings) -> Any:
    """The config with every device-dependent key set to its resolved value."""
    from dataclasses import replace

    rollout = replace(cfg.rollout, dtype=s.engine_dtype, cuda_graphs=s.cuda_graphs, sleep=s.sleep, kv_cache_gib=s.kv_cache_gib,
                      max_num_seqs=s.max_num_seqs)  # fmt: skip
    trainer = replace(cfg.trainer, precision=Precision(s.precision), tf32=s.tf32, logits_chunk_tokens=s.logits_chunk_tokens,
                      activation_checkpointing=s.activation_checkpointing, micro_batch_tokens=s.micro_batch_tokens,
                      torch_threads=s.torch_threads)  # fmt: skip
    return replace(cfg, rollout=rollout, trainer=trainer)


def for_run(
    cfg: Any, model_path: str, out: Path | None, *, device: DeviceSpec, world_size: int, builtin: bool
) -> tuple[Any, Settings, list[str]]:
    """(the config with its settings resolved, the settings, notes for the console) for a run starting or resuming in
    `out` (None: an evaluation, nothing recorded). A resume keeps what its settings.json says for every key still
    left to auto, and says so when the device has changed."""
    settings = resolve(cfg, device, model_shape(model_path), world_size=world_size, builtin=builtin)
    notes = [f"device: {describe(device)}; settings: " + ", ".join(settings.lines(asked(cfg)))]
    before = recorded(out) if out is not None else None
    if before is not None:
        kept = keep_recorded(cfg, settings, before[1])
        if kept != settings:
            notes.append(f"resuming: the settings this run started with (on {describe(before[0])}) are kept: "
                         + ", ".join(kept.lines(asked(cfg))))  # fmt: skip
        settings = kept
    return apply(cfg, settings), settings, notes


def for_this_machine(cfg: Any, *, world_size: int = 1) -> Any:
    """A validated config with every `auto` resolved for this machine, as a run starting here would resolve it (for_run
    with no run folder: nothing is recorded): what benchmarks and tests build a Learner or an Engine from."""
    from rlvr.models import is_builtin, resolve_model_path

    device = DeviceSpec.detect(world_size)
    cfg, _, _ = for_run(cfg, resolve_model_path(cfg.model.path), None, device=device, world_size=world_size,
                        builtin=is_builtin(cfg.model.path))  # fmt: skip
    return cfg


def describe(device: DeviceSpec) -> str:
    bf16 = "bf16" if device.bf16 else "no bf16"
    return f"{device.kind} {device.name} ({device.memory_gib:.0f} GiB, {bf16}, {device.cores} cores)"
