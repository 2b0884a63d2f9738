"""The engine's completion texts: decoded after generation (without stop strings) exactly as vLLM's detokenizer does.

Its own module: the test builds an engine on a model of its own, and two engines alive in one process share vLLM's
process groups (closing one tears them down under the other).
"""

from __future__ import annotations

import torch

from rlvr.rollout import Engine


def sentencepiece_model(folder) -> str:
    """A random 2-layer Llama with a Llama-2-style tokenizer: "▁" word starts whose decoder drops the text's first
    space, byte-fallback tokens (a character can be cut off mid-way), EOS 1. Random weights sample every token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # byte tokens for "é" (C3 A9) and "€" (E2 82 AC) only: a small vocabulary samples EOS often enough
    pieces = ["<pad>", "<eos>", "<unk>", "<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>", "▁", "▁a", "▁b", "a", "b", "ab", "1", "2"]
    backend = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(pieces), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_texts_decoded_after_generation_are_vllms(tmp_path):
    """Without stop strings the engine decodes the texts itself. For the same seeded tokens they equal vLLM's
    detokenizer's (which a stop string that never matches turns on): with a tokenizer whose decoding depends on the
    prompt before it (a first "▁" is a space after a prompt, nothing at a text's start) and completions cut off
    inside a UTF-8 character, ended by EOS or by the length limit."""
    path = sentencepiece_model(tmp_path / "model")
    engine = Engine(path, seed=0, max_model_len=64, dtype="float32", gpu_memory_utilization=0.3, cpu_kv_cache_gib=1)
    tokenizer = engine.tokenizer
    ids = [tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in ["a b", "ab 12", "b", "é €"]]
    kwargs = dict(n=16, max_tokens=6, temperature=1.0, top_p=1.0, seeds=[1, 2, 3, 4])
    decoded: list[int] = []  # a spy on the engine's own decode: the fast path must be the one that ran
    decode = engine._decode
    engine._decode = lambda prompt_ids, c: decoded.append(1) or decode(prompt_ids, c)  # type: ignore[method-assign]
    ours = [c for g in engine.generate(ids, stop=[], **kwargs) for c in g]
    assert len(decoded) == len(ours) == 4 * 16  # every text decoded after generation (vLLM's detokenizer was off)
    vllms = [c for g in engine.generate(ids, stop=["never seen"], **kwargs) for c in g]
    assert len(decoded) == 4 * 16  # with a stop string, vLLM's detokenizer made the texts
    assert [c.token_ids for c in ours] == [c.token_ids for c in vllms]
    assert [c.engine_logprobs for c in ours] == [c.engine_logprobs for c in vllms]
    assert [c.text for c in ours] == [c.text for c in vllms]
    # the cases that a context-free decode of the completion alone gets wrong are among them
    alone = tokenizer.batch_decode([c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids for c in ours],
                                   skip_special_tokens=True)  # fmt: skip
    assert any(c.text.startswith(" ") and not a.startswith(" ") for a, c in zip(alone, ours))  # a first "▁"
    assert any(a.endswith("\ufffd") and not c.text.endswith("\ufffd") for a, c in zip(alone, ours))  # a cut-off character
    assert {c.finish_reason for c in ours} == {"stop", "length"}
    greedy = engine.greedy(ids, max_tokens=6, stop=[])
    assert [c.text for c in greedy] == [c.text for c in engine.greedy(ids, max_tokens=6, stop=["never seen"])]
    engine.close()
