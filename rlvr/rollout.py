"""The only module that imports vllm: generate, load weights, reset the prefix cache, sleep and wake.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the learner can push
weights into it directly after every optimizer step, with no serialization. On a GPU it shares the device with the
learner: it sleeps while the learner runs and wakes for the weight push and the next rollout (`Memory`).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers.decoders import DecodeStream

# In-process engine: direct weight updates need the model in this process (set before vllm import).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import logging  # noqa: E402

from vllm import LLM, CompletionOutput, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.v1.engine.detokenizer import INVALID_PREFIX_ERR_MSG, uses_fast_detokenizer  # noqa: E402

from rlvr import distributed  # noqa: E402
from rlvr.config import Config  # noqa: E402
from rlvr.memory import sleep_level  # noqa: E402
from rlvr.settings import engine_lora_rank  # noqa: E402
from rlvr.types import Completion  # noqa: E402


def _quiet_vllm_logs() -> None:
    """Under Hydra the root logger is at INFO and vLLM's records propagate to it: keep vLLM to warnings.

    Every reload warns that the tied LM head and the rotary embedding got no checkpoint tensor. Both are
    expected (the head is re-packed by _repack_cpu_embeddings; rotary has no weights), so silence that logger.
    Called again after the engine starts: its start-up (external_launcher) re-applies vLLM's logging config.
    """
    logging.getLogger("vllm").setLevel(logging.WARNING)
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)


_quiet_vllm_logs()


class Engine:
    """One vLLM engine holding a copy of the policy for sampling."""

    def __init__(
        self,
        model_path: str,
        *,
        seed: int,
        max_model_len: int,
        dtype: str,
        gpu_memory_utilization: float,
        cpu_kv_cache_gib: int,
        tensor_parallel_size: int = 1,
        cuda_graphs: bool = False,
        sleep: bool = False,
        kv_cache_gib: float = 0.0,
        lora_rank: int = 0,
        max_num_seqs: int = 256,
    ) -> None:
        distributed.init()  # the engine joins the run's process group (external_launcher), even in a world of one
        cpu = not torch.cuda.is_available()
        if cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        # On CPU, a prompt split over two scheduler steps (chunked prefill) makes vLLM 0.32 rewind the request's
        # seeded generator, which CPU generators cannot do ("CPU Generator does not use offset"): seeded sampling of
        # more prompt tokens than one step's budget crashed. Without chunking, a prompt waits for the next step whole.
        no_chunking = dict(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192)) if cpu else {}
        # GPU: the KV cache's size in bytes, not what vLLM's profiling finds free (the learner holds part of the device)
        kv_bytes = dict(kv_cache_memory_bytes=int(kv_cache_gib * 2**30)) if kv_cache_gib > 0 and not cpu else {}
        # vLLM runs full garbage collections while it loads the model and freezes the heap when it is done. One
        # collection now (garbage cycles, such as an earlier engine's, are freed first), then freezing what is left
        # (imports, the learner) lets vLLM's collections scan only the engine's own new objects: the built-in
        # engine starts in 1.3 s instead of 2.1 s on 2 CPU cores.
        # model.lora.sync=adapter: the policy is the base plus one LoRA adapter, replaced at every push (load_adapter)
        adapters = dict(enable_lora=True, max_lora_rank=engine_lora_rank(lora_rank), max_loras=1, max_cpu_loras=1) if lora_rank else {}
        self.adapter: LoRARequest | None = None
        # what its weights are stored in: a push sends them so (Learner.pushed_weights), None where vLLM chooses (auto)
        self.dtype: torch.dtype | None = getattr(torch, dtype) if dtype != "auto" else None
        gc.collect()
        gc.freeze()
        self.llm = LLM(
            model=model_path,
            seed=seed,
            dtype=dtype,  # type: ignore[arg-type]  # validated by vLLM: auto | float32 | bfloat16 ...
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            # the most sequences in flight: a round's rows (rlvr.settings), not vLLM's 1024 on big GPUs, whose sampler
            # buffers (sequences x vocabulary in fp32) would hold memory no round uses
            max_num_seqs=max_num_seqs,
            # sampled-token logprobs after temperature and top-p, as the learner computes them (vLLM's default: raw)
            logprobs_mode="processed_logprobs",
            # CUDA graphs (GPU): decoding a 0.5-7B model is otherwise bound by kernel launches; weight pushes copy into
            # the same storage (reload_weights), so captured graphs stay valid. CPU: eager
            enforce_eager=not cuda_graphs,
            enable_sleep_mode=sleep,  # GPU only (vLLM rejects it on CPU): the Memory lifecycle below
            # one engine per rank (or per tensor_parallel_size consecutive ranks), inside torchrun's world
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=tensor_parallel_size,
            **no_chunking,  # type: ignore[arg-type]
            **kv_bytes,  # type: ignore[arg-type]
            **adapters,  # type: ignore[arg-type]
        )
        self.max_model_len = max_model_len  # the context of every sequence: prompt and answer
        self.memory = Memory(self.llm, enabled=sleep, level=sleep_level(sleep=sleep, adapter_sync=bool(lora_rank)))
        self.tokenizer = self.llm.get_tokenizer()
        self._decodes_texts = uses_fast_detokenizer(self.tokenizer)  # else vLLM's (slow) detokenizer always runs
        # vLLM's sampler wraps two small ops in torch.compile (the sampled token's rank, for logprobs; a seedless
        # random sample). On CPU, inductor compiles them at the first sampled round: 2 s of every run's first step,
        # for ops that take microseconds eagerly. Run them eagerly there (on GPUs vLLM's choice stands: the eager rank
        # count would allocate a tokens x vocab mask).
        self._compiler_stance = "force_eager" if cpu else "default"
        _quiet_vllm_logs()

    @classmethod
    def from_config(cls, model_path: str, cfg: Config, max_model_len: int, *, lora_rank: int = 0) -> Engine:
        """The engine a run's config asks for (rollout.*, seeded with trainer.seed); lora_rank > 0: one that takes the
        policy as a LoRA adapter of that rank (load_adapter)."""
        r = cfg.rollout
        return cls(model_path, seed=cfg.trainer.seed, max_model_len=max_model_len, dtype=r.dtype,
                   gpu_memory_utilization=r.gpu_memory_utilization, cpu_kv_cache_gib=r.cpu_kv_cache_gib,
                   tensor_parallel_size=r.tensor_parallel_size, cuda_graphs=r.cuda_graphs, sleep=r.sleep,
                   kv_cache_gib=r.kv_cache_gib, lora_rank=lora_rank, max_num_seqs=r.max_num_seqs)  # fmt: skip  # resolved (rlvr.settings)

    def generate(
        self,
        prompts: list[tuple[int, ...]],
        *,
        n: int,
        max_tokens: int | list[int],
        temperature: float,
        top_p: float,
        seeds: list[int] | None,
        stop: list[str],
        keep_stop: bool = False,
    ) -> list[list[Completion]]:
        """Sample `n` completions per prompt (token ids, as rlvr.prompts rendered them); one seed per prompt makes
        sampling reproducible. temperature 0 is greedy. Generation ends at the model's EOS / end-of-turn tokens (vLLM
        reads them from the generation config), at a `stop` string, or after `max_tokens` (one for all, or one per
        prompt); the text excludes them, or keeps the stop string with `keep_stop` (a tool call's closing fence:
        rlvr.multiturn). Completion.stop_string names the stop string that ended a completion."""
        # vLLM's detokenizer is needed only to find stop strings. Without them (and with a fast tokenizer) the texts are
        # decoded here after generation (_decode: the same decoding), not in vLLM's output loop, which also decodes the
        # token of every logprob (unused here): a round of 80 prompts x 8 on the built-in model took 375 -> 328 and
        # 351 -> 312 ms.
        detokenize = bool(stop) or not self._decodes_texts
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        params = [
            SamplingParams(n=n, max_tokens=m, temperature=temperature, top_p=top_p, seed=s, stop=stop or None,
                           logprobs=0 if temperature > 0 else None, detokenize=detokenize,
                           include_stop_str_in_output=keep_stop)  # fmt: skip
            for s, m in zip(seeds if seeds is not None else [None] * len(prompts), budgets, strict=True)
        ]
        requests: list[TokensPrompt] = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts]
        self.memory.wake()  # (awake already in the loop: the weight push woke it)
        with torch.compiler.set_stance(self._compiler_stance):
            outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.adapter)
        return [
            [
                Completion(
                    prompt_ids=list(out.prompt_token_ids or []),
                    token_ids=list(c.token_ids),
                    text=c.text if detokenize else self._decode(out.prompt_token_ids or [], c),
                    finish_reason=c.finish_reason or "length",
                    engine_logprobs=sampled_logprobs(c.logprobs, c.token_ids),
                    stop_string=c.stop_reason if isinstance(c.stop_reason, str) else None,
                )
                for c in out.outputs
            ]
            for out in outputs
        ]

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """The logprob of each of ids[1:] given the tokens before it, under the policy the engine samples from (its
        weights, and its LoRA adapter if one was pushed) at temperature 1: vLLM's prompt logprobs, which are raw whatever
        logprobs_mode says, and computed afresh (a request that asks for them reads no cached prefix). Greedy, one token
        generated: no random numbers drawn. What rlvr.sync_check compares with the learner's after every push."""
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        self.memory.wake()
        with torch.compiler.set_stance(self._compiler_stance):
            out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False, lora_request=self.adapter)[0]
        scored = out.prompt_logprobs or []  # [len(ids)]: None for the first token, then {token: Logprob, ...}
        return [step[token].logprob for step, token in zip(scored[1:], ids[1:], strict=True) if step is not None]

    def _decode(self, prompt_ids: list[int], completion: CompletionOutput) -> str:
        """The text vLLM's detokenizer for fast tokenizers makes of a completion (FastIncrementalDetokenizer in
        vllm/v1/engine/detokenizer.py): a tokenizers DecodeStream primed with the prompt, so that the first token
        decodes as it does after the prompt (a SentencePiece "▁" keeps its space), special tokens skipped, a character cut
        off at the end left out, and a completion ended by a stop token (EOS, end of turn) decoded without it. Its
        recoveries too: a token the stream rejects adds nothing, and an invalid prefix restarts the stream unprimed."""
        ids = completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids
        backend = self.tokenizer._tokenizer  # type: ignore[attr-defined]  # the Rust tokenizer of a fast HF tokenizer
        stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
        text = ""
        for token in ids:
            try:
                text += stream.step(backend, token) or ""
            except (OverflowError, TypeError):
                continue
            except Exception as e:
                if not str(e).startswith(INVALID_PREFIX_ERR_MSG):
                    raise
                stream = DecodeStream(skip_special_tokens=True)
                text += stream.step(backend, token) or ""
        return text

    def greedy(self, prompts: list[tuple[int, ...]], *, max_tokens: int, stop: list[str]) -> list[Completion]:
        """Greedy decoding (evaluation): one completion per prompt."""
        return [g[0] for g in self.generate(prompts, n=1, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seeds=None, stop=stop)]

    def sleep(self) -> None:
        """Free the engine's GPU memory for the learner's phases (rollout.sleep); nothing otherwise."""
        self.memory.sleep()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights (checkpoint names) and drop cached prefixes of the old ones. A sleeping engine
        wakes its weights first and its KV cache after the push, so the two never need the device at once."""
        self.memory.wake("weights")
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(named_tensors), "is_checkpoint_format": True},
        )
        if not torch.cuda.is_available():
            self.llm.collective_rpc(_repack_cpu_embeddings)
        self.memory.filled()  # (not before: a reload that raised leaves a level-2 engine unfit to wake)
        self.memory.wake("kv_cache")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def load_adapter(self, folder: Path) -> None:
        """Sample from now on with the LoRA adapter in `folder` (a peft folder), under a new id and name. vLLM 0.32
        caches adapters by id (a reused id keeps the old tensors, whatever the folder now holds) and keys prefix-cache
        blocks by name and path, not id (a reused name would serve blocks computed by the old adapter): the previous
        adapter is removed and the prefix cache reset. vLLM reads the folder when the next generate needs it. Every
        prompt of a generate carries the same adapter (vLLM's CPU LoRA kernels apply an adapter to rows without one
        when a batch mixes them)."""
        self.memory.wake()  # as a weight push does (the base's weights come back; the adapter is read at the next generate)
        previous = self.adapter
        number = 1 if previous is None else previous.lora_int_id + 1
        self.adapter = LoRARequest(lora_name=f"policy-{number}", lora_int_id=number, lora_path=str(folder))
        if previous is not None and previous.lora_int_id in self.llm.llm_engine.list_loras():
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self.llm.reset_prefix_cache()  # (the new name keys new blocks anyway; the old ones are of no use)

    def close(self) -> None:
        """Shut the engine down now (it also tears down vLLM's process groups: call before leaving the run's)."""
        self.llm.llm_engine.engine_core.shutdown()



def sampled_logprobs(logprobs: Any, token_ids: Sequence[int]) -> list[float]:
    """The logprob of each sampled token, one per token, in order (vLLM's per-token {token: Logprob} entries; none
    asked for, greedy: []). An entry without the sampled token counts 0.0 in its place, never dropped: a dropped entry
    would shift every later logprob onto the wrong token."""
    if not logprobs:
        return []
    return [entry[token].logprob if entry and token in entry else 0.0 for entry, token in zip(logprobs, token_ids, strict=True)]


class Memory:
    """The engine's GPU memory around the learner's phases (vLLM sleep mode, as TRL's and verl's colocated engines do).

    sleep(): vLLM's LLM.sleep: the KV cache is dropped and the prefix cache reset; the weights are dropped (level 2:
    full-weight pushes, which replace every one) or copied to pinned host memory and back (level 1: a LoRA adapter's
    base, which no push brings back). wake("weights") before a weight push, wake("kv_cache") after it: the push's
    temporary tensors and the KV cache are never on the device together. wake() wakes whatever sleeps; after level 2
    it refuses to wake weights that no push refilled (they would be whatever the freed memory held: vLLM's issue
    #29341 is weights coming back wrong after level 2). rlvr.sync_check checks every push against the learner.
    Disabled (CPU, rollout.sleep=false), every call does nothing. Tested with a fake engine
    (tests/test_rollout_memory.py): vLLM has no sleep mode on CPU.
    """

    TAGS = ("weights", "kv_cache")  # vLLM's sleep tags (vllm.v1.executor.abstract.SLEEP_TAGS)

    def __init__(self, llm: object, *, enabled: bool, level: int = 1) -> None:
        self.llm = llm
        self.enabled = enabled
        self.level = level if enabled else 0  # what settings.json records (0: the engine never sleeps)
        self.asleep: set[str] = set()
        self.unfilled = False  # level 2: weights woken, not yet written by a push

    def sleep(self) -> None:
        if self.enabled and not self.asleep:
            self.llm.sleep(level=self.level)  # type: ignore[attr-defined]
            self.asleep = set(self.TAGS)

    def wake(self, tag: str | None = None) -> None:
        """Wake `tag` (or whatever sleeps). wake() with weights dropped by level 2 is an error: only a push
        (Engine.load_weights: wake("weights"), then every weight written) may bring them back."""
        if tag is None and self.level == 2 and ("weights" in self.asleep or self.unfilled):
            raise RuntimeError("the engine's weights were dropped by its level-2 sleep and no push has refilled them: "
                               "it would sample from freed memory (push the learner's weights first)")  # fmt: skip
        tags = [t for t in self.TAGS if t in self.asleep and tag in (None, t)]
        if tags:
            self.llm.wake_up(tags=tags)  # type: ignore[attr-defined]
            self.asleep -= set(tags)
            self.unfilled = self.unfilled or (self.level == 2 and "weights" in tags)

    def filled(self) -> None:
        """A push has written every weight (Engine.load_weights, after vLLM's reload returned)."""
        self.unfilled = False


def _repack_cpu_embeddings(worker) -> None:  # type: ignore[no-untyped-def]
    """Re-pack embedding-type layers' GEMM weights after a reload (runs inside the vLLM worker).

    On CPU, vLLM 0.32 packs a copy of each embedding/LM-head weight for its GEMM kernel when the
    model loads. `reload_weights` refreshes a tied LM head's weight but not that packed copy (the
    head never receives a checkpoint tensor of its own), so sampling would keep using the old
    output projection. Re-running the layer's post-load step re-packs it from the current weight.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in worker.model_runner.model.modules():
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            module.quant_method.process_weights_after_loading(module)
