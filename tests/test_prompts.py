"""rlvr.prompts: prompt formats (chat template, system prompt, template, messages rows) and the prompt budget.

The chat cases give the built-in tokenizer a small ChatML template (a real tokenizer feature, not a fake); the
SmolLM2 chat template itself is checked end to end against the engine in test_real_model.py.
"""

from __future__ import annotations

import pytest
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from rlvr.config import AnswerExtract, ConfigError, DataConfig, LongPrompts, PromptFormat, Task
from rlvr.models import resolve_model_path
from rlvr.prompts import chat_format, prepare, render
from rlvr.types import Example

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer(chat: bool, bos: bool = False):
    """The built-in character-level tokenizer; `bos`: one that adds a <s> token, as Llama's and Qwen's do (the
    built-in one adds none, so a prompt that lost its special tokens would look right)."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-arith"))
    if chat:
        tok.chat_template = CHATML
    if bos:
        tok.add_special_tokens({"bos_token": "<s>"})
        tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    return tok


def chars(tok, text: str) -> list[int]:
    """The ids of a text, character by character (the built-in vocabulary): expected ids not made by the call under test."""
    return tok.convert_tokens_to_ids(list(text))


def data_cfg(**kw) -> DataConfig:
    fields = dict(task=Task.file, path="x.jsonl", eval_path=None, split="train", prompt_key="prompt", answer_key="answer",
                  eval_size=1, max_prompt_tokens=0, long_prompts=LongPrompts.drop, format=PromptFormat.auto,
                  system_prompt=None, prompt_template="{prompt}", subset=None, answer_extract=AnswerExtract.none,
                  name=None, size=0, seed=0, options={}, chat_template_kwargs=None)  # fmt: skip
    return DataConfig(**{**fields, **kw})


EXAMPLES = [Example("a", "12+34=", "46"), Example("b", "1+1", "2")]


def decode(tok, ids) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)


def test_plain_is_the_text_with_the_tokenizers_special_tokens():
    tok = tokenizer(chat=False, bos=True)
    out = render(EXAMPLES, tok, data_cfg())  # auto, and the tokenizer has no chat template: plain
    assert [list(e.prompt_ids) for e in out] == [[tok.bos_token_id, *chars(tok, "12+34=")], [tok.bos_token_id, *chars(tok, "1+1")]]
    assert out[0].prompt == "12+34=" and out[0].answer == "46"  # nothing else changes


def test_plain_template_and_system_prompt():
    tok = tokenizer(chat=False)
    out = render(EXAMPLES[:1], tok, data_cfg(system_prompt="Add.", prompt_template="Q: {prompt} A:"))
    assert decode(tok, out[0].prompt_ids) == "Add.\n\nQ: 12+34= A:"


def test_chat_applies_the_template_with_the_generation_prompt():
    tok = tokenizer(chat=True, bos=True)
    out = render(EXAMPLES[:1], tok, data_cfg(system_prompt="Be brief.", prompt_template="{prompt} Answer:"))
    # the template's text, tokenized as it stands: its own markers, no <s> added on top (a template states its own)
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+34= Answer:<|im_end|>\n<|im_start|>assistant\n"
    assert list(out[0].prompt_ids) == chars(tok, text)


def test_auto_is_chat_when_the_tokenizer_has_a_template():
    assert chat_format(PromptFormat.auto, tokenizer(chat=True)) and not chat_format(PromptFormat.auto, tokenizer(chat=False))
    assert not chat_format(PromptFormat.plain, tokenizer(chat=True))
    with pytest.raises(ConfigError, match="data.format=chat.*no chat template"):
        chat_format(PromptFormat.chat, tokenizer(chat=False))


def test_braces_in_prompts_and_templates_stay_literal():
    tok = tokenizer(chat=False)
    out = render([Example("m", "{x}", "1")], tok, data_cfg(prompt_template="{prompt} Put it in \\boxed{}."))
    assert decode(tok, out[0].prompt_ids) == "{x} Put it in \\boxed{}."


def test_message_rows_use_their_own_messages():
    tok = tokenizer(chat=True)
    own = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
    row = Example("m", "U", "1", messages=own)
    out = render([row], tok, data_cfg(system_prompt="ignored: the row has its own", prompt_template="{prompt}!"))
    assert decode(tok, out[0].prompt_ids) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    user_only = render([Example("u", "U", "1", messages=own[1:])], tok, data_cfg(system_prompt="Sys"))
    assert decode(tok, user_only[0].prompt_ids).startswith("<|im_start|>system\nSys<|im_end|>")


def test_the_tool_instruction_ends_the_system_prompt_on_both_paths():
    """rollout.tool.instruction (with rollout.tools): the system message's last paragraph (chat; a row's own system
    message too), the paragraph before the prompt (plain); without a system prompt it is the system message."""
    plain, chat = tokenizer(chat=False), tokenizer(chat=True)
    out = render(EXAMPLES[:1], plain, data_cfg(system_prompt="Add.", prompt_template="Q: {prompt}"), "Use python.")
    assert decode(plain, out[0].prompt_ids) == "Add.\n\nUse python.\n\nQ: 12+34="
    assert decode(plain, render(EXAMPLES[:1], plain, data_cfg(), "Use python.")[0].prompt_ids) == "Use python.\n\n12+34="
    out = render(EXAMPLES[:1], chat, data_cfg(system_prompt="Be brief."), "Use python.")
    assert decode(chat, out[0].prompt_ids).startswith("<|im_start|>system\nBe brief.\n\nUse python.<|im_end|>\n<|im_start|>user")
    out = render(EXAMPLES[:1], chat, data_cfg(), "Use python.")
    assert decode(chat, out[0].prompt_ids).startswith("<|im_start|>system\nUse python.<|im_end|>")
    own = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
    out = render([Example("m", "U", "1", messages=own)], chat, data_cfg(), "Use python.")
    assert decode(chat, out[0].prompt_ids).startswith("<|im_start|>system\nS\n\nUse python.<|im_end|>")
    assert render(EXAMPLES[:1], chat, data_cfg(), None) == render(EXAMPLES[:1], chat, data_cfg())  # no tools: as before


def test_message_rows_need_the_chat_format():
    with pytest.raises(ConfigError, match="prompt m is a list of chat messages.*data.format=plain"):
        render([Example("m", "U", "1", messages=({"role": "user", "content": "U"},))], tokenizer(chat=True),
               data_cfg(format=PromptFormat.plain))  # fmt: skip


def test_prepare_budgets_rendered_tokens_and_sizes_the_engine():
    tok = tokenizer(chat=True)
    long = Example("long", "9" * 40, "1")
    train, held_out, max_model_len, dropped = prepare([*EXAMPLES, long], EXAMPLES, tok, 1000, data_cfg(max_prompt_tokens=70), 8)
    assert [e.id for e in train] == ["a", "b"] and dropped == {"data/dropped_train_prompts": 1, "data/dropped_eval_prompts": 0}
    assert max_model_len == max(len(e.prompt_ids) for e in train) + 8  # the longest kept prompt + max_new_tokens
    with pytest.raises(ConfigError, match="long has .* tokens, over data.max_prompt_tokens=70"):
        prepare([long], EXAMPLES, tok, 1000, data_cfg(max_prompt_tokens=70, long_prompts=LongPrompts.error), 8)


def test_without_a_prompt_budget_the_context_less_the_response_is_the_budget():
    """data.max_prompt_tokens=0: a prompt may take what the model's context leaves after rollout.max_new_tokens, and
    not a token more (a prompt of exactly that length is kept, one token longer is dropped), so no prompt can fail
    inside the engine; max_model_len never exceeds the context."""
    tok = tokenizer(chat=False)
    fits, over = Example("fits", "1" * 24, "1"), Example("over", "1" * 25, "1")  # 24 and 25 tokens (one per character)
    assert [len(tok(e.prompt)["input_ids"]) for e in (fits, over)] == [24, 25]
    train, _, max_model_len, dropped = prepare([fits, over], EXAMPLES, tok, 32, data_cfg(max_prompt_tokens=0), 8, verbose=False)
    assert [e.id for e in train] == ["fits"] and dropped["data/dropped_train_prompts"] == 1
    assert max_model_len == 32
