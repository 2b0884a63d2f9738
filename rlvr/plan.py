"""`rlvr plan [overrides] plan.gpus=8 plan.gpu_memory_gib=80`: what a run of a config will hold on each GPU, and
whether it fits, before anything loads and before any GPU is rented.

It composes the same recipe tree as `rlvr train` (plus recipes/plan.yaml's `plan:` section), validates it, reads the
model's config.json alone (a local folder, `builtin:`, a hub id through transformers' AutoConfig, or a config.json
file), resolves the device-dependent settings with rlvr.settings.resolve on the described GPU (the function a run
calls at start-up, so the plan and the run cannot disagree) and adds up rlvr.memory's figures per phase:

    rollout phase   the learner's resident state (fp32 weights, AdamW state, the reference) + the engine awake
                    (weights, LoRA slots, KV cache, forward activations, sampler buffers, CUDA graphs)
    learner phase   the learner's peak + what the engine keeps meanwhile (asleep: its CUDA graphs; awake: all but
                    its transient buffers)

and the host memory of a node (sleep copies, CPU offload, vLLM's LoRA cache, rank 0's export).

When it does not fit, each knob that would make it fit is named, checked by running the same arithmetic with the knob
applied. It also reports the config errors that would stop the run at start-up on that many ranks. Its last line is
one JSON object. Exit code 0: it fits; 1: it does not; 2: a config error. No torch at import: it starts in a second.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr import memory, settings
from rlvr.config import (
    GROUPS,
    Config,
    ConfigError,
    compose_tree,
    override_key,
    unknown_key_message,
    validate,
)
from rlvr.memory import GIB, ModelShape
from rlvr.ranks import world_problems
from rlvr.settings import DeviceSpec, Settings

PLAN_KEYS = ("plan.gpus", "plan.gpu_memory_gib", "plan.gpu_name")
GPUS_PER_NODE = 8  # ranks that share one machine's CPU cores (torch threads per rank)
MAX_GPUS = 1024  # the most GPUs the "more GPUs" suggestion looks at
ASSUMED_PROMPT_TOKENS = settings.ASSUMED_PROMPT_TOKENS  # the prompt length planned for without data.max_prompt_tokens
SMALLEST_TOKENS = 256  # the smallest trainer.micro_batch_tokens suggested


def main(argv: list[str]) -> int:
    """`rlvr plan [overrides]`: print the plan; its last line is one JSON object. 0 fits, 1 does not, 2 config error."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        raw = compose(argv)
        gpus, memory_gib, gpu_name = int(raw.plan.gpus), float(raw.plan.gpu_memory_gib), str(raw.plan.gpu_name)
        if gpus < 1 or memory_gib <= 0:
            raise ConfigError(f"plan.gpus must be >= 1 and plan.gpu_memory_gib > 0, got {gpus}, {memory_gib}")
        cfg = validate(OmegaConf.masked_copy(raw, [str(k) for k in raw if k not in ("plan", "hydra")]))
        shape = model_shape(cfg.model.path)
        builtin = cfg.model.path.startswith("builtin:")
        result = plan(cfg, shape, gpus=gpus, memory_gib=memory_gib, gpu_name=gpu_name, builtin=builtin)
    except ConfigError as e:
        print(f"rlvr plan: config error: {e}", file=sys.stderr)
        print(json.dumps({"fits": False, "error": str(e)}))
        return 2
    if not result["fits"]:
        result["suggestions"] = suggestions(
            cfg, shape, gpus=gpus, memory_gib=memory_gib, gpu_name=gpu_name, builtin=builtin
        )
    print(describe(result, cfg, shape))
    print(json.dumps(result))
    if result["problems"]:
        return 2
    return 0 if result["fits"] else 1


def compose(overrides: list[str]) -> DictConfig:
    """recipes/plan.yaml composed with `overrides` by Hydra's compose API (no output folder, no logging set up);
    ConfigError for an unknown key."""
    for arg in overrides:
        key = override_key(arg)
        if "=" in arg and not (key in PLAN_KEYS or key in GROUPS or key.startswith("hydra.")):
            message = unknown_key_message(key)
            if message is not None:
                raise ConfigError(message)
    if not any(override_key(o) == "trainer.output_dir" for o in overrides):
        overrides = [*overrides, "trainer.output_dir=unused"]  # Hydra's run folder: the plan writes nothing
    return compose_tree("plan", overrides)


def model_shape(path: str) -> ModelShape:
    """The model's shape from its config.json: `path` may also be that file itself."""
    from rlvr.models import resolve_model_path

    if path.endswith(".json") and Path(path).expanduser().is_file():
        return ModelShape.from_config(json.loads(Path(path).expanduser().read_text()))
    return settings.model_shape(resolve_model_path(path))


def device(memory_gib: float, gpu_name: str, gpus: int) -> DeviceSpec:
    """One of `gpus` described GPUs, with its node's share of CPU cores."""
    return DeviceSpec.gpu(memory_gib, gpu_name, local_ranks=min(gpus, GPUS_PER_NODE))


def plan(
    cfg: Config, shape: ModelShape, *, gpus: int, memory_gib: float, gpu_name: str, builtin: bool
) -> dict[str, Any]:
    """What one GPU holds in each phase (GiB), whether the run fits, the resolved settings and the start-up problems.
    ConfigError when the settings cannot be resolved (e.g. no room for a KV cache)."""
    spec = device(memory_gib, gpu_name, gpus)
    s = settings.resolve(cfg, spec, shape, world_size=gpus, builtin=builtin)
    t, r = cfg.trainer, cfg.rollout
    # one micro-batch: a rank's rows of a mini-batch, of prompt + response tokens padded to the longest, within the
    # token and row budgets (the same arithmetic rlvr.settings decides activation checkpointing from)
    rows, row, tokens = settings.planned_micro_batch(cfg, gpus, s.micro_batch_tokens)
    learner = memory.learner_memory(
        shape,
        world_size=gpus,
        precision=s.precision,
        sharded=settings.sharded(gpus, t.cpu_offload),
        autocast=settings.autocast(s.precision, settings.sharded(gpus, t.cpu_offload)),
        checkpointing=s.activation_checkpointing,
        tokens=tokens,
        chunk_tokens=s.logits_chunk_tokens,
        reference=cfg.algo.kl_coef > 0,
        cpu_offload=t.cpu_offload,
        seq_len=row,
        lora_rank=cfg.model.lora.rank,
    )
    engine = settings.engine_parts(cfg, spec, shape, engine_dtype=s.engine_dtype, max_num_seqs=s.max_num_seqs,
                                   cuda_graphs=s.cuda_graphs, kv_cache_bytes=int(s.kv_cache_gib * GIB))  # fmt: skip
    # one rollout round on one engine (rlvr.settings.round_rows); vLLM runs what its KV cache holds at once and queues
    # the rest
    kv_per_token = memory.kv_bytes_per_token(shape, dtype=s.engine_dtype, tensor_parallel_size=r.tensor_parallel_size)
    kv_tokens = engine["kv_cache"] // kv_per_token
    held = memory.engine_asleep(engine) if s.sleep else memory.engine_idle(engine)
    phases = {
        "rollout": {"learner_state": memory.learner_resident(learner), **{f"engine_{k}": v for k, v in engine.items()}},
        "learner": {**learner, **{f"engine_{k}": v for k, v in held.items()}},
    }
    usable = int(memory.USABLE_FRACTION * memory_gib * GIB)
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    fits = all(total <= usable for total in totals.values()) and kv_tokens >= row
    adapter = settings.adapter_sync(cfg, s.engine_dtype)
    level = memory.sleep_level(sleep=s.sleep, adapter_sync=adapter)
    per_node = min(gpus, GPUS_PER_NODE)
    host = memory.host_memory(shape, engine, world_size=gpus, ranks_per_node=per_node, level=level,
                              cpu_offload=t.cpu_offload, lora_rank=cfg.model.lora.rank, engine_dtype=s.engine_dtype,
                              adapter_sync=adapter)  # fmt: skip
    ranks_host = host["sleep_copies"] + host["learner_offload"] + host["lora_cache"]  # the node's ranks, the export aside
    return {
        "fits": fits,
        "gpus": gpus,
        "gpu_memory_gib": memory_gib,
        "usable_gib": _gib(usable),
        "free_gib": {name: _gib(usable - total) for name, total in totals.items()},  # the margin in each phase
        "phases": {
            name: {"total_gib": _gib(totals[name]), **{k: _gib(v) for k, v in parts.items()}}
            for name, parts in phases.items()
        },
        "micro_batch": {
            "tokens": tokens,
            "rows": rows,
            "row_tokens": row,
            "prompt_tokens_assumed": not cfg.data.max_prompt_tokens,
        },
        "kv_cache": {
            "tokens": kv_tokens,
            "bytes_per_token": kv_per_token,
            "round_tokens": settings.round_rows(cfg, gpus) * row,
            "row_tokens": row,
        },
        "engine": {
            "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": memory.vllm_batch_defaults(cuda=True, memory_gib=memory_gib, name=gpu_name,
                                                                 tensor_parallel_size=r.tensor_parallel_size)[0],
            "round_rows": settings.round_rows(cfg, gpus),
            "sleep_level": level,
            "push": settings.push_rule(s, lora_rank=cfg.model.lora.rank),
        },  # fmt: skip
        "host": {"ranks_per_node": per_node, **{k: _gib(v) for k, v in host.items()}},
        "host_gib_per_node": _gib(sum(host.values())),
        "host_gib_per_gpu": _gib(ranks_host // per_node),  # one rank's share, the export aside
        "params": shape.num_params,
        "settings": asdict(s),
        # what would stop the run at start-up on that many ranks, or the model's context
        "problems": world_problems(cfg, gpus) + [p for p in [memory.context_problem(shape.context, r.max_new_tokens)] if p],
        "suggestions": [],
    }


def suggestions(
    cfg: Config, shape: ModelShape, *, gpus: int, memory_gib: float, gpu_name: str, builtin: bool
) -> list[dict[str, str]]:
    """The knobs that each alone make the run fit, each checked by planning again with it applied: more GPUs (the
    fewest that fit and split the batch), activation checkpointing, a smaller token budget, a smaller engine share,
    CPU offload, LoRA (model.lora.rank=16)."""

    def fits(c: Config, n: int = gpus) -> bool:
        try:
            result = plan(c, shape, gpus=n, memory_gib=memory_gib, gpu_name=gpu_name, builtin=builtin)
        except ConfigError:
            return False
        return bool(result["fits"]) and not result["problems"]

    t, r, a = cfg.trainer, cfg.rollout, cfg.algo
    out = []
    for n in range(gpus + 1, MAX_GPUS + 1):  # the fewest GPUs that fit, with mini-batches that split over them
        step = n // math.gcd(a.group_size, n)  # mini-batches of a multiple of this many prompts split over n ranks
        minibatch = -(-a.prompts_per_minibatch // step) * step  # the smallest such from algo.prompts_per_minibatch
        split = _with(cfg, algo=replace(a, prompts_per_minibatch=minibatch))
        if a.prompts_per_step % minibatch == 0 and fits(split, n):
            also = f" algo.prompts_per_minibatch={minibatch}" if minibatch != a.prompts_per_minibatch else ""
            out.append({"set": f"plan.gpus={n}{also}", "why": f"{n} GPUs shard the learner's state {n} ways"})
            break
    if t.activation_checkpointing is not True and fits(_with(cfg, trainer=replace(t, activation_checkpointing=True))):
        out.append(
            {
                "set": "trainer.activation_checkpointing=true",
                "why": "recompute each layer in backward: one layer's activations at a time",
            }
        )
    budget = SMALLEST_TOKENS
    while budget < 2**20 and fits(_with(cfg, trainer=replace(t, micro_batch_tokens=budget * 2))):
        budget *= 2
    if fits(_with(cfg, trainer=replace(t, micro_batch_tokens=budget))):
        out.append(
            {"set": f"trainer.micro_batch_tokens={budget}", "why": "fewer tokens per forward/backward, more of them"}
        )
    share = next(
        (
            u / 20
            for u in range(int(r.gpu_memory_utilization * 20) - 1, 1, -1)
            if fits(_with(cfg, rollout=replace(r, gpu_memory_utilization=u / 20)))
        ),
        None,
    )
    if share is not None:
        out.append(
            {
                "set": f"rollout.gpu_memory_utilization={share:g}",
                "why": "a smaller engine (KV cache) beside the learner's state",
            }
        )
    if not t.cpu_offload and fits(_with(cfg, trainer=replace(t, cpu_offload=True))):
        out.append(
            {"set": "trainer.cpu_offload=true", "why": "the learner's fp32 state in host memory (slower updates)"}
        )
    lora = replace(cfg.model, lora=replace(cfg.model.lora, rank=16))
    if not cfg.model.lora.rank and fits(_with(cfg, model=lora)):
        out.append({"set": "model.lora.rank=16", "why": "a LoRA adapter on a frozen base in the compute dtype (raise trainer.lr ~10x)"})
    return out


def _with(cfg: Config, **sections: Any) -> Config:
    return replace(cfg, **sections)


def describe(result: dict[str, Any], cfg: Config, shape: ModelShape) -> str:
    """The plan as a person reads it: the model, the settings, each phase's parts per GPU, the verdict, the knobs."""
    s = Settings(**result["settings"])
    mb, kv = result["micro_batch"], result["kv_cache"]
    assumed = (
        f"; data.max_prompt_tokens=0: {ASSUMED_PROMPT_TOKENS} prompt tokens assumed"
        if mb["prompt_tokens_assumed"]
        else ""
    )
    lines = [
        f"rlvr plan: {cfg.model.path}: {shape.num_params / 1e9:.2f}B parameters ({shape.num_layers} layers, hidden "
        f"{shape.hidden_size}, vocabulary {shape.vocab_size:,}) on {result['gpus']} x {result['gpu_memory_gib']:g} GiB GPU, "
        + (f"LoRA rank {cfg.model.lora.rank} ({shape.lora_params(cfg.model.lora.rank) / 1e6:.1f}M adapter parameters)"
           if cfg.model.lora.rank else "full fine-tuning"),
        "settings: " + ", ".join(s.lines(settings.asked(cfg))),
        f"push: the learner computes in {result['engine']['push']['learner_compute']}; the engine gets the "
        f"{result['engine']['push']['pushed']}",
        f"micro-batch: {mb['tokens']:,} padded tokens ({mb['rows']} rows of {mb['row_tokens']:,}{assumed})",
        f"per GPU, of {result['usable_gib']:.1f} GiB usable ({memory.USABLE_FRACTION:.0%}):",
    ]
    e = result["engine"]
    graphs = f"{e['max_num_seqs']} sequences" + (", twice: LoRA" if cfg.model.lora.rank and "engine_lora" in result["phases"]["rollout"] else "")
    labels = {
        "learner_state": "learner state kept (weights, AdamW, reference)",
        "engine_weights": f"engine weights ({s.engine_dtype})",
        "engine_lora": "engine LoRA adapter slots",
        "engine_kv_cache": f"engine KV cache ({kv['tokens']:,} tokens; a round needs {kv['round_tokens']:,})",
        "engine_activations": f"engine forward activations ({e['max_num_batched_tokens']:,} batched tokens)",
        "engine_sampler": f"engine sampler buffers ({e['max_num_seqs']} x vocabulary, fp32)",
        "engine_sampler_scratch": "engine sampler top-k/top-p scratch",
        "engine_cuda_graphs": f"engine CUDA graphs ({graphs}; an estimate)",
        "weights": f"weights (frozen {s.precision} base, fp32 adapter)" if cfg.model.lora.rank else "weights (fp32 master)",
        "gradients": "gradients (fp32)",
        "optimizer": "AdamW moments (2 x fp32)",
        "reference": "reference model",
        "compute_weights": f"{s.precision} weight copies (autocast casts or FSDP2 gathers)",
        "activations": f"activations ({mb['tokens']:,} tokens{', checkpointed' if s.activation_checkpointing else ''})",
        "logits": "LM head (logits chunks, its weight gradient)",
    }
    kept = f"kept asleep, level {e['sleep_level']}" if s.sleep else "kept awake"
    held = {"engine_cuda_graphs": f"engine CUDA graphs ({kept})", "engine_sampler_scratch": f"engine sampler scratch ({kept})"}
    for name, parts in result["phases"].items():
        verdict = "fits" if parts["total_gib"] <= result["usable_gib"] else "does NOT fit"
        free = result["free_gib"][name]
        lines.append(f"  {name} phase: {parts['total_gib']:.2f} GiB, {verdict} ({free:.2f} GiB free, "
                     f"{free / result['usable_gib']:.0%} of usable)")  # fmt: skip
        for k, v in parts.items():
            if k == "total_gib":
                continue
            label = held[k] if name == "learner" and k in held else labels[k]
            lines.append(f"    {label:<66} {v:8.2f}")
    if kv["tokens"] < kv["row_tokens"]:
        lines.append(
            f"  the KV cache holds {kv['tokens']:,} tokens, less than one row ({kv['row_tokens']:,}): vLLM will not start"
        )
    host, what = result["host"], {"sleep_copies": "sleeping engines' weights", "learner_offload": "offloaded learner state",
                                  "lora_cache": "vLLM's CPU LoRA cache", "export": "rank 0's export"}  # fmt: skip
    lines.append(
        f"host memory per node ({host['ranks_per_node']} rank{'s' if host['ranks_per_node'] > 1 else ''}): {result['host_gib_per_node']:.1f} GiB ("
        + ", ".join(f"{what[k]} {host[k]:.1f}" for k in what if host[k]) + ")"
    )
    lines += [f"start-up error: {p}" for p in result["problems"]]
    lines.append("fits: " + ("yes" if result["fits"] else "no"))
    if not result["fits"]:
        lines.append(
            "what would make it fit (each alone, checked):"
            if len(result["suggestions"]) > 1
            else "no single knob makes it fit"
        )
        lines += [f"  {x['set']:<44} {x['why']}" for x in result["suggestions"]]
    return "\n".join(lines)


def _gib(x: float) -> float:
    return round(x / GIB, 3)
