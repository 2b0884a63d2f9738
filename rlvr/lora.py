"""LoRA adapters (model.lora.rank > 0): the policy's only trainable weights, and what the engine is given of them.

peft wraps the model: every targeted linear layer W (by default every linear layer of the decoder, peft's
"all-linear", which leaves the LM head out) computes W x + (alpha / r) B A x, with A [r, in] drawn at random (seeded)
and B [out, r] zero, so a fresh adapter is the base model exactly. The base stays frozen in the compute dtype; A and B
are the master weights (float32, or the model's float64 in tests) and alone have gradients and AdamW state.

The reference policy needs no second copy of the model: it is a frozen copy of the adapter's tensors (`Snapshot`),
swapped in for the reference's forward: the starting adapter (a fresh one is B = 0, the base model exactly), then the
adapter at each refresh (algo.ref_update_every).

The engine follows the learner in one of two ways (model.lora.sync; `sync_mode`):
  merged   W + (alpha / r) B A in float32, pushed as full weights (the engine's weights are replaced, as in full
           fine-tuning). Exact where the engine computes in float32 (CPUs); in bf16 a small update of W rounds away.
  adapter  A and B written as a peft adapter folder that vLLM loads as a LoRA adapter under a new id at every push
           (the base in the engine never changes, so nothing is rounded away; rlvr.rollout.Engine.load_adapter).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr import settings
from rlvr.config import ConfigError

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_FOLDER = "adapter"  # beside the merged model in every saved model folder
PEFT_PREFIX = "base_model.model."  # peft's prefix on the wrapped model's parameter names


@dataclass(frozen=True)
class LoraSpec:
    """What the learner needs to build the adapter (model.lora, resolved)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...] | None  # None: every linear layer of the decoder
    init: str | None  # a peft adapter folder to start from
    seed: int  # A's initialisation

    @classmethod
    def from_config(cls, cfg: Any) -> LoraSpec | None:
        """None when model.lora.rank is 0 (full fine-tuning)."""
        lora = cfg.model.lora
        if lora.rank == 0:
            return None
        targets = tuple(lora.target_modules) if lora.target_modules else None
        return cls(lora.rank, float(lora.alpha), float(lora.dropout), targets, lora.init, cfg.trainer.seed)


def sync_mode(cfg: Any) -> str | None:
    """How the engine follows the adapter: "merged" | "adapter" (None without LoRA). auto: merged where the engine
    computes in float32 (its merged weights then equal the learner's up to float32 rounding), else adapter."""
    if cfg.model.lora.rank == 0:
        return None
    return "adapter" if settings.adapter_sync(cfg, cfg.rollout.dtype) else "merged"


def check_init(cfg: Any) -> None:
    """The initial adapter (model.lora.init): a peft folder of model.lora.rank, before any model loads."""
    lora = cfg.model.lora
    if lora.rank == 0 or not lora.init:
        return
    config_file = Path(lora.init) / "adapter_config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.lora.init: {config_file} does not exist; point it at a peft adapter folder "
                          "(adapter_config.json and adapter_model.safetensors), e.g. <run>/model/adapter")  # fmt: skip
    saved = json.loads(config_file.read_text())
    r, alpha = saved.get("r"), saved.get("lora_alpha")
    if r != lora.rank:
        raise ConfigError(f"model.lora.init: the adapter in {lora.init} has rank {r}, but model.lora.rank={lora.rank}; "
                          f"set model.lora.rank={r}")  # fmt: skip
    if alpha is not None and float(alpha) != float(lora.alpha):
        raise ConfigError(f"model.lora.init: the adapter in {lora.init} has alpha {alpha:g}, but model.lora.alpha="
                          f"{lora.alpha:g}; set model.lora.alpha={alpha:g}")  # fmt: skip
    variants = [k for k in ("use_dora", "use_rslora") if saved.get(k)]
    if variants:
        raise ConfigError(f"model.lora.init: the adapter in {lora.init} uses {', '.join(variants)}, which rlvr does not "
                          "train or merge; start from a plain LoRA adapter")  # fmt: skip


def wrap(model: Any, spec: LoraSpec, master_dtype: torch.dtype) -> Any:
    """The model with spec's adapter (a peft model): the base frozen, the adapter's A and B in `master_dtype` and
    trainable. A is drawn from spec.seed's generator (the global RNGs are left as they were)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        head = model.get_output_embeddings()
        linear = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head})
        foreign = [t for t in spec.target_modules or () if t not in linear]
        if foreign:  # the embedding and the LM head too: their adapters would be neither trained nor merged here
            raise ConfigError(f"model.lora.target_modules: {', '.join(foreign)} is not a linear layer of the decoder; "
                              f"choose among {', '.join(linear)} (null: all of them)")  # fmt: skip
        if spec.init:
            peft_model = PeftModel.from_pretrained(model, spec.init, is_trainable=True)
        else:
            targets = list(spec.target_modules) if spec.target_modules else "all-linear"
            config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,  # type: ignore[arg-type]
                                target_modules=targets, bias="none", task_type="CAUSAL_LM")  # fmt: skip
            peft_model = get_peft_model(model, config)
    for name, param in peft_model.named_parameters():
        param.requires_grad_(_is_adapter(name))
        if _is_adapter(name) and param.dtype != master_dtype:
            param.data = param.data.to(master_dtype)
    return peft_model


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The adapter's (trainable) parameters, in the model's order."""
    return [(name, p) for name, p in model.named_parameters() if _is_adapter(name)]


def checkpoint_name(name: str) -> str:
    """A wrapped model's parameter name as the base model's checkpoint names it."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_weights(model: Any, units: Iterable[dict[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with the adapter merged in (W + scaling B A, accumulated in at least float32), in
    checkpoint names. `units`: the wrapped model's whole tensors by name, each targeted layer's base weight, A and B in
    one dict (rlvr.sharding.gathered_units: one decoder layer per dict, a collective, so every rank must consume the
    iterator in order). Every tensor comes out in the adapter's dtype (float32, or float64)."""
    from peft.tuners.lora import LoraLayer

    out_dtype = next(p for _, p in adapter_parameters(model)).dtype
    for unit in units:
        for name, tensor in unit.items():
            if _is_adapter(name):
                continue
            weight = tensor.to(out_dtype)
            owner, _, kind = name.rpartition(".")
            if owner.endswith(".base_layer") and kind == "weight":
                prefix = owner.removesuffix(".base_layer")
                layer = model.get_submodule(prefix)
                if isinstance(layer, LoraLayer) and ADAPTER in layer.lora_A:
                    a = unit[f"{prefix}.lora_A.{ADAPTER}.weight"].to(out_dtype)  # [r, in]
                    b = unit[f"{prefix}.lora_B.{ADAPTER}.weight"].to(out_dtype)  # [out, r]
                    delta = b @ a * layer.scaling[ADAPTER]  # [out, in]
                    weight = weight + (delta.T if getattr(layer, "fan_in_fan_out", False) else delta)
            yield checkpoint_name(name), weight


def adapter_weights(model: Any, full: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's whole tensors on the CPU, in the wrapped model's names (a collective under FSDP2)."""
    return {name: full(p).detach().cpu() for name, p in adapter_parameters(model)}


def save_adapter(model: Any, weights: dict[str, torch.Tensor], folder: Path) -> None:
    """A peft adapter folder (adapter_config.json, adapter_model.safetensors) that peft and vLLM load."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, state_dict=weights, safe_serialization=True, save_embedding_layers=False)


class Snapshot:
    """A frozen copy of the adapter's tensors (this rank's shards), swapped in while the reference runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tensors = {name: p.detach().clone() for name, p in adapter_parameters(model)}

    @torch.no_grad()
    def copy_from(self, model: torch.nn.Module) -> None:
        for name, p in adapter_parameters(model):
            self.tensors[name].copy_(p)

    @contextlib.contextmanager
    def swapped_in(self, model: torch.nn.Module) -> Iterator[None]:
        """While active, the model's adapter holds the snapshot; its own tensors are restored after."""
        params = dict(adapter_parameters(model))
        own = {name: p.detach().clone() for name, p in params.items()}
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self.tensors[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(own[name])
