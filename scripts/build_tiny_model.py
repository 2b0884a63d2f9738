"""Build the built-in tiny model: a character-level Llama warm-started on 2-digit addition.

    python scripts/build_tiny_model.py [--out rlvr/assets/tiny-arith] [--target 0.5]
    python scripts/build_tiny_model.py --smoke --out /tmp/tiny     # seconds: 2 steps, small slices (tests/test_scripts.py)

Supervised training on the arithmetic task's TRAINING pool only, stopped as soon as
greedy accuracy on a validation slice of that pool (never trained on here) reaches
`--target`; then the held-out evaluation pool's accuracy is printed for the record.
The result (fp32 safetensors, ~4 MB) ships inside the package so `rlvr train` needs no
network. The last line of stdout is one JSON object (params, steps, val_acc, held_out_acc, held_out, out, seconds).
--smoke runs the same code in seconds (batch 16, 2 steps, 32 validation and 64 held-out examples) and needs --out,
so that it never overwrites the shipped model. Not imported by rlvr.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlvr.tasks import arithmetic

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 96 characters incl. space, newline


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()  # join characters without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def build_model(vocab_size: int, pad_id: int, eos_id: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def batch_tensors(examples, tok, device="cpu"):
    """Right-padded prompt+answer+eos; labels only on the answer and EOS."""
    rows, labels = [], []
    for ex in examples:
        p = tok(ex.prompt, add_special_tokens=False)["input_ids"]
        a = tok(ex.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)  # [B, L]
    lab = torch.full((len(rows), width), -100)  # [B, L]
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids.to(device), lab.to(device), (ids != tok.pad_token_id).to(device)


@torch.no_grad()
def greedy_accuracy(model, tok, examples, max_new_tokens=6) -> float:
    tok.padding_side = "left"
    enc = tok([e.prompt for e in examples], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
    )  # [B, L+new]
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(t.strip() == e.answer for t, e in zip(texts, examples)) / len(examples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="default: rlvr/assets/tiny-arith (the shipped model)")
    ap.add_argument("--target", type=float, default=0.5, help="stop at this validation accuracy")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="seconds: batch 16, 2 steps, small validation and held-out slices")
    args = ap.parse_args()
    if args.smoke and args.out is None:
        ap.error("--smoke needs --out (it must not overwrite the shipped model)")
    args.out = args.out or str(Path(__file__).resolve().parents[1] / "rlvr/assets/tiny-arith")
    if args.smoke:
        args.batch, args.max_steps = 16, 2

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = build_tokenizer()
    model = build_model(len(tok), tok.pad_token_id, tok.eos_token_id)
    print(f"params: {sum(p.numel() for p in model.parameters()):,}")

    train = arithmetic.train_examples()
    rng.shuffle(train)
    val, train = train[:500], train[500:]  # validation slice: never trained on here
    val = val[:32] if args.smoke else val
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    t0, step, acc, checked = time.time(), 0, 0.0, 0
    while step < args.max_steps:
        model.train()
        ids, lab, att = batch_tensors(rng.sample(train, args.batch), tok)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        # the accuracy jumps during the phase change: check often once it is on its way
        if step % (5 if acc >= args.target / 2 else 25) == 0:
            model.eval()
            acc, checked = greedy_accuracy(model, tok, val), step
            print(f"step {step} loss {loss.item():.3f} val_acc {acc:.3f} ({time.time() - t0:.0f}s)")
            if acc >= args.target:
                break
    model.eval()
    if checked != step:  # stopped by --max-steps between two checks
        acc = greedy_accuracy(model, tok, val)
    held_out_set = arithmetic.eval_examples(64 if args.smoke else arithmetic.EVAL_POOL_SIZE)
    held_out = greedy_accuracy(model, tok, held_out_set)
    print(f"stopped at step {step}: val_acc {acc:.3f}, held-out eval accuracy {held_out:.3f}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"saved to {out}")
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "steps": step, "val_acc": acc,
                      "held_out_acc": held_out, "held_out": len(held_out_set), "out": str(out),
                      "seconds": time.time() - t0}))  # fmt: skip


if __name__ == "__main__":
    main()
