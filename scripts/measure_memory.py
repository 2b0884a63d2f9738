"""Check rlvr.memory's learner peak against a measurement: the peak of live tensor memory of a real update.

    python scripts/measure_memory.py [--shapes llama qwen2] [--settings fp32 bf16 fp32-ckpt bf16-ckpt] [--json] [--smoke]

For each shape (a randomly initialised model written to a temp folder, built from a config: no download) and setting
(fp32, or bf16 autocast over fp32 weights; with or without activation checkpointing), one rlvr.learner.Learner in a
world of one (the plain module), built as rlvr train builds it (scripts/bench_config.py; DAPO's loss), runs one warm-up update (AdamW's state comes at the first step), then one measured
update under `LiveTensors` (a TorchDispatchMode that tracks every live tensor storage: the model, its gradients, the
optimizer state, activations and temporaries; RSS would be too noisy, and torch's MemTracker refuses a module called
twice in one step, which micro-batches do). The batch has 8 rows: six of `--length`
tokens and two 8 tokens shorter, so that the second micro-batch (4 rows, trainer.micro_batch_tokens = 4 x length) is
padded and carries SDPA's mask, and runs when every gradient already exists: the peak rlvr.memory.learner_memory
describes. Prediction and measurement go side by side into one markdown table; with --json the last line is a JSON
list of the rows. On 2 CPU cores (no AVX512-BF16: bf16 is emulated) the default run takes about 20 minutes. Not a test;
--smoke (seconds: both families at hidden 64, 2 layers, vocabulary 2,048; fp32 and bf16; length 16) is
tests/test_scripts.py's.

Shapes (vocabulary and grouping like the models users train, depth and width cut so that a CPU can run them):
    llama  hidden 512, 8 layers, 8 heads over 2 KV heads (transformers' repeat_kv copies K and V), MLP 1408,
           vocabulary 32,000, untied head
    qwen2  hidden 448, 6 layers, 7 heads over 1 KV head (repeat_kv is a view), MLP 1216, q/k/v biases,
           Qwen2.5's vocabulary of 151,936, tied head
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rlvr import settings  # noqa: E402
from rlvr.memory import GIB, ModelShape, learner_memory  # noqa: E402
from rlvr.types import Completion, RolloutBatch  # noqa: E402

TINY_ASSETS = REPO / "rlvr" / "assets" / "tiny-arith"
SHAPES: dict[str, dict] = {
    "llama": dict(model_type="llama", hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=1408, vocab_size=32000, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=448, num_hidden_layers=6, num_attention_heads=7, num_key_value_heads=1,
                  intermediate_size=1216, vocab_size=151936, tie_word_embeddings=True),
}  # fmt: skip
SETTINGS = {"fp32": ("fp32", False), "bf16": ("bf16", False), "fp32-ckpt": ("fp32", True), "bf16-ckpt": ("bf16", True)}
# --smoke: the same two families shrunk to seconds (hidden 64, 2 layers, a 2,048-token vocabulary), fp32 and bf16
SMOKE_SHAPES = {name: {**shape, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 2048,
                       "num_attention_heads": 4 if name == "llama" else 2}  # fmt: skip
                for name, shape in SHAPES.items()}
SMOKE_SETTINGS = ["fp32", "bf16"]


class LiveTensors(TorchDispatchMode):
    """The bytes of the tensor storages alive now and at most, counting those handed to `track` and every storage an op
    creates while the mode is on (a storage is counted once, however many views share it, until it is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # storage id -> bytes
        self.refs: dict[int, weakref.ref] = {}
        self.now = self.peak = 0

    def track(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.live or storage.nbytes() == 0 or t.device.type == "meta":
            return
        self.live[key] = storage.nbytes()
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        self.refs[key] = weakref.ref(storage, lambda _, key=key: self._free(key))

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
        self.refs.pop(key, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


def build_model(folder: Path, config: dict) -> Path:
    """A randomly initialised model of `config`'s shape, and the built-in model's tokenizer, in `folder`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config["model_type"], **fields, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    )
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_ASSETS / name, folder / name)
    return folder


def make_batch(length: int, vocab_size: int) -> tuple[RolloutBatch, list[int]]:
    """8 rows (six of `length` tokens, two of length - 8), half prompt, half response; and their response lengths."""
    g = torch.Generator().manual_seed(0)
    completions, responses = [], []
    for i in range(8):
        total = length - (8 if i >= 6 else 0)
        p = length // 2
        ids = torch.randint(3, vocab_size, (total,), generator=g).tolist()
        completions.append(
            Completion(
                prompt_ids=ids[:p],
                token_ids=ids[p:],
                text="",
                finish_reason="length",
                engine_logprobs=[0.0] * (total - p),
            )
        )
        responses.append(total - p)
    return RolloutBatch.from_completions(
        completions, [float(i % 2) for i in range(8)], [False] * 8, pad_id=0
    ), responses


def measure(folder: Path, shape: ModelShape, *, precision: str, checkpointing: bool, length: int) -> dict:
    """The measured and the predicted peak of one update (bytes), with the prediction's parts. The learner is built as
    rlvr train builds one (scripts/bench_config.py): the recipe tree (DAPO's loss) with the model, fp32 master weights,
    the setting's precision and checkpointing and a 4-row token budget, every other `auto` resolved for this machine."""
    from bench_config import build_learner, loss_options, run_config

    cfg = run_config(f"model.path={folder}", "model.dtype=float32", "trainer.lr=1e-6", "trainer.warmup_steps=0",
                     "trainer.lr_schedule=constant", "trainer.micro_batch_rows=256", f"trainer.micro_batch_tokens={4 * length}",
                     f"trainer.precision={precision}", f"trainer.activation_checkpointing={str(checkpointing).lower()}",
                     f"rollout.max_new_tokens={length}")  # fmt: skip
    learner = build_learner(cfg)
    batch, responses = make_batch(length, shape.vocab_size)
    advantages = torch.randn(8, generator=torch.Generator().manual_seed(1))
    options = loss_options(cfg)
    learner.update(batch, advantages, batch.response_mask, None, None, options=options)  # AdamW's state appears
    tracker = LiveTensors()
    state = [t for s in learner.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    tracker.track([*learner.model.parameters(), *learner.model.buffers(), *state])
    with tracker:
        learner.update(batch, advantages, batch.response_mask, None, None, options=options)
    measured = tracker.peak
    t = cfg.trainer
    sharded = settings.sharded(1, t.cpu_offload)
    # the second micro-batch: rows 5-8 after the longest-first sort (two of `length`, two of length - 8), padded to `length`
    parts = learner_memory(shape, world_size=1, precision=str(t.precision.value), sharded=sharded,
                           autocast=settings.autocast(str(t.precision.value), sharded), checkpointing=bool(t.activation_checkpointing),
                           tokens=4 * length, chunk_tokens=int(t.logits_chunk_tokens), reference=cfg.algo.kl_coef > 0, seq_len=length,
                           response_tokens=sum(sorted(responses, reverse=True)[4:]))  # fmt: skip
    del learner
    return {"measured": measured, "predicted": sum(parts.values()), "parts": parts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), help="default: all (--smoke: fp32 bf16)")
    parser.add_argument("--length", type=int, help="tokens of the longest rows (default: 64; --smoke: 16)")
    parser.add_argument("--smoke", action="store_true", help="seconds: both families shrunk (SMOKE_SHAPES), fp32 and bf16")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.settings = args.settings or (SMOKE_SETTINGS if args.smoke else list(SETTINGS))
    args.length = args.length or (16 if args.smoke else 64)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    torch.set_num_threads(args.threads)
    rows = []
    print(
        "| shape | setting | tokens | predicted MiB | measured MiB | predicted / measured |\n|---|---|---|---|---|---|"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes:
            folder = build_model(Path(tmp) / name, shapes[name])
            shape = ModelShape.from_config(json.loads((folder / "config.json").read_text()))
            for setting in args.settings:
                precision, checkpointing = SETTINGS[setting]
                r = measure(folder, shape, precision=precision, checkpointing=checkpointing, length=args.length)
                ratio = r["predicted"] / r["measured"]
                rows.append({"shape": name, "setting": setting, "tokens": 4 * args.length, "params": shape.num_params,
                             "predicted": r["predicted"], "measured": r["measured"], "ratio": round(ratio, 4),
                             "parts": r["parts"]})  # fmt: skip
                print(f"| {name} | {setting} | {4 * args.length} | {r['predicted'] / 2**20:.1f} | {r['measured'] / 2**20:.1f} | "
                      f"{ratio:.3f} |", flush=True)  # fmt: skip
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"worst relative error: {worst:.1%} (GiB = {GIB} bytes)")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
