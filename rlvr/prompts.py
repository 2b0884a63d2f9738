"""Prompts -> the exact token ids the engine samples from and the learner trains on, and the prompt budget.

A prompt is tokenized once, here: the engine receives these ids (vLLM accepts token-id prompts) and hands them
back with each completion, so the engine, the learner and the logs agree on one tokenization.

Formats (data.format):
- `chat`: the tokenizer's chat template over [system?] + user message (or the row's own `messages`), with the
  generation prompt (the assistant header) appended: `apply_chat_template(..., add_generation_prompt=True)`.
- `plain`: the text itself, tokenized with the tokenizer's special tokens (a BOS where the model has one).
- `auto`: chat when the tokenizer has a chat template, plain otherwise (the built-in model has none).
data.prompt_template (with `{prompt}`) rewrites the prompt text first; data.system_prompt goes first (a system
message in chat, a paragraph before the prompt in plain text). With rollout.tools, the python tool's instruction ends
it, and the user's functions (rlvr.function_tools) go to the chat template as `tools=` (or, where the template has no
tool support, rlvr's description of them ends the system message); they need the chat path. Every chat render takes
data.chat_template_kwargs, with model.chat_template's text in place of the model's where one is given (rlvr.chat).

Each prompt also gets its thinking state here, once (rlvr.thinking.prompt_state): whether the template left a
`<think>` block open at its end (R1 distills, QwQ), opened and closed one (Qwen3 with thinking off), or neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlvr import chat, console, function_tools, memory, thinking
from rlvr.config import Config, ConfigError, DataConfig, LongPrompts, PromptFormat, VerifierName
from rlvr.types import Example


def chat_format(fmt: PromptFormat, tokenizer: Any) -> bool:
    """Whether prompts go through the chat template (auto: when the tokenizer has one)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if fmt is PromptFormat.chat and not has_template:
        raise ConfigError(
            "data.format=chat, but the model's tokenizer has no chat template (model.path); use data.format=plain "
            "(or auto), or a model with a chat template"
        )
    return fmt is PromptFormat.chat or (fmt is PromptFormat.auto and has_template)


def messages_of(example: Example, cfg: DataConfig, instruction: str | None = None) -> list[dict[str, str]]:
    """The chat messages of an example: its own (a `messages` row), or [system?] + the templated prompt. The tool
    instruction (rollout.tool.instruction, with rollout.tools) ends the system message, the row's own one too."""
    system = [{"role": "system", "content": _joined(cfg.system_prompt, instruction)}] if cfg.system_prompt or instruction else []
    if example.messages is not None:
        own = [dict(m) for m in example.messages]
        if own[0]["role"] != "system":
            return system + own
        return [{**own[0], "content": _joined(own[0]["content"], instruction)}, *own[1:]]  # the row's own system message wins
    return system + [{"role": "user", "content": apply_template(cfg.prompt_template, example.prompt)}]


def _joined(*paragraphs: str | None) -> str:
    return "\n\n".join(p for p in paragraphs if p)


def apply_template(template: str, prompt: str) -> str:
    return template.replace("{prompt}", prompt)  # not str.format: prompts and templates may hold braces (LaTeX)


def render(
    examples: list[Example], tokenizer: Any, cfg: DataConfig, instruction: str | None = None, tools: list[dict] | None = None,
    *, max_calls: int = 1, think_tags: tuple[str, str] = thinking.DEFAULT_TAGS,
) -> list[Example]:
    """The examples with `prompt_ids` set (the ids of the prompt as the model sees it) and their thinking state (the
    block `think_tags` delimit); `instruction`: the python tool's instruction (a system paragraph); `tools`: the JSON
    schemas of the user's function tools, of which one turn may call up to `max_calls` (rollout.max_turns)."""
    if chat_format(cfg.format, tokenizer):
        kwargs = chat.template_kwargs(cfg.chat_template_kwargs)
        chat.check(tokenizer, kwargs)
        if tools:  # the template can show 1..max_calls results after a turn (ConfigError if not)
            function_tools.ChatFrame(tokenizer, tools, max_calls, kwargs)
            if not function_tools.renders_tools(tokenizer, [{"role": "user", "content": "?"}], tools, kwargs):
                instruction, tools = _joined(instruction, function_tools.describe(tools)), None
        out = []
        for e in examples:
            ids = tokenizer.apply_chat_template(messages_of(e, cfg, instruction), tools=tools or None, add_generation_prompt=True,
                                                tokenize=True, **kwargs)  # fmt: skip
            ids = ids["input_ids"] if not isinstance(ids, list) else ids  # transformers 5 returns a mapping
            out.append(dataclasses.replace(e, prompt_ids=tuple(ids), think=_state(tokenizer, ids, think_tags)))
        return out
    if tools:
        raise ConfigError(
            f"rollout.tools names functions, which are offered to the model through its chat template, but prompts are "
            f"formatted as plain text (data.format={cfg.format.value}"
            f"{', and the tokenizer has no chat template' if cfg.format is PromptFormat.auto else ''}); use a model with a "
            f"chat template, or rollout.tools=[python] alone"
        )
    if any(e.messages is not None for e in examples):
        first = next(e for e in examples if e.messages is not None)
        raise ConfigError(
            f"prompt {first.id} is a list of chat messages, but prompts are formatted as plain text (data.format="
            f"{cfg.format.value}{', and the tokenizer has no chat template' if cfg.format is PromptFormat.auto else ''}); "
            "use data.format=chat with a model that has a chat template, or give prompts as strings"
        )
    head = _joined(cfg.system_prompt, instruction) + "\n\n" if cfg.system_prompt or instruction else ""
    texts = [head + apply_template(cfg.prompt_template, e.prompt) for e in examples]
    ids = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    return [dataclasses.replace(e, prompt_ids=tuple(i), think=_state(tokenizer, i, think_tags)) for e, i in zip(examples, ids)]


def _state(tokenizer: Any, ids: list[int], tags: tuple[str, str]) -> thinking.State:
    """The prompt's thinking state, read off its text as the model sees it (special tokens included) after its last
    end of turn (the tokenizer's EOS): the generation prompt, not earlier turns. Only that tail is decoded."""
    ids = list(ids)
    eos = tokenizer.eos_token_id
    start = len(ids) - ids[::-1].index(eos) if eos is not None and eos in ids else 0
    return thinking.prompt_state(tokenizer.decode(ids[start:], skip_special_tokens=False), tags, None)


def drop_long_prompts(examples: list[Example], budget: int, mode: LongPrompts) -> tuple[list[Example], int]:
    """(the examples whose prompt fits in `budget` tokens, how many were dropped); budget 0 keeps all."""
    counts = [len(e.prompt_ids) for e in examples]
    over = [i for i, count in enumerate(counts) if budget and count > budget]
    if over and mode is LongPrompts.error:
        first = over[0]
        raise ConfigError(
            f"prompt {examples[first].id} has {counts[first]} tokens, over data.max_prompt_tokens={budget} "
            f"({len(over)} of {len(examples)} prompts are over it); raise data.max_prompt_tokens, "
            f"or set data.long_prompts=drop to skip them"
        )
    if over and len(over) == len(examples):
        raise ConfigError(
            f"every prompt is over data.max_prompt_tokens={budget} (the shortest has {min(counts)} tokens), "
            f"so none of the {len(examples)} is left; raise data.max_prompt_tokens"
        )
    dropped = set(over)
    return [e for i, e in enumerate(examples) if i not in dropped], len(over)


def prepare(
    train_set: list[Example], eval_set: list[Example], tokenizer: Any, context: int, cfg: DataConfig, max_new_tokens: int,
    *, verbose: bool = True, instruction: str | None = None, tools: list[dict] | None = None, max_calls: int = 1,
    think_tags: tuple[str, str] = thinking.DEFAULT_TAGS, open_prompts: bool = False,
) -> tuple[list[Example], list[Example], int, dict[str, int]]:
    """Render both sets, then drop (or reject) prompts over the budget; return the sets, the engine's max_model_len
    and the counts dropped.

    The budget is data.max_prompt_tokens, and at most what the model's context leaves after rollout.max_new_tokens, so
    no prompt can fail inside the engine hours into a run, nor have its response cut short by the context.
    """
    problem = memory.context_problem(context, max_new_tokens)
    if problem:
        raise ConfigError(problem)
    # a budget over what the context leaves would let the engine cut those prompts' responses short: the smaller one
    budget = min(cfg.max_prompt_tokens or context, context - max_new_tokens)
    (train_set, train_dropped), (eval_set, eval_dropped) = (
        drop_long_prompts(render(examples, tokenizer, cfg, instruction, tools, max_calls=max_calls, think_tags=think_tags),
                          budget, cfg.long_prompts)  # fmt: skip
        for examples in (train_set, eval_set)
    )
    if not eval_set:
        raise ConfigError(f"no evaluation prompt fits the prompt budget ({budget} tokens, data.max_prompt_tokens)")
    if verbose and train_dropped + eval_dropped:
        console.warn(f"rlvr: dropped {train_dropped} training and {eval_dropped} evaluation prompts over the prompt budget "
                     f"of {budget} tokens (data.max_prompt_tokens; data.long_prompts=error rejects them instead)")  # fmt: skip
    longest = max(len(e.prompt_ids) for e in train_set + eval_set)
    # `open_prompts` (rollout.env): an environment's first observation may replace a prompt, so the engine's context
    # holds the whole prompt budget, not just the longest prompt rendered here
    max_model_len = min(context, (budget if open_prompts else longest) + max_new_tokens)
    return train_set, eval_set, max_model_len, {"data/dropped_train_prompts": train_dropped, "data/dropped_eval_prompts": eval_dropped}


def load(
    cfg: Config, model_path: str, *, verbose: bool
) -> tuple[list[Example], list[Example], VerifierName, int, dict[str, int]]:
    """The configured task's examples as token ids for `model_path` (prepare): (training set, held-out set, the task's
    verifier, the engine's max_model_len, the counts dropped). Training and `rlvr eval` start the same way."""
    from transformers import AutoConfig, AutoTokenizer

    from rlvr.data import load_task

    train_set, eval_set, task_verifier = load_task(cfg.data)
    context = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None) or 1 << 30
    tokenizer = chat.use_template(AutoTokenizer.from_pretrained(model_path), chat.read_template(cfg.model.chat_template))
    train_set, eval_set, max_model_len, dropped = prepare(
        train_set, eval_set, tokenizer, context, cfg.data, cfg.rollout.max_new_tokens, verbose=verbose,
        open_prompts=cfg.rollout.env is not None, **_render_options(cfg),
    )
    return train_set, eval_set, task_verifier, max_model_len, dropped


def _render_options(cfg: Config) -> dict[str, Any]:
    """render's options for this run: the python tool's instruction, the function tools' schemas, the thinking tags."""
    return {"instruction": cfg.rollout.tool.instruction if "python" in cfg.rollout.tools else None,
            "tools": function_tools.load(list(cfg.rollout.tools))[1] or None, "max_calls": cfg.rollout.max_turns,
            "think_tags": (cfg.reward.think_tags[0], cfg.reward.think_tags[1])}  # fmt: skip


def renderer(cfg: Config, tokenizer: Any) -> Callable[[Example, str], list[int]]:
    """(example, text) -> the ids of the example's prompt with `text` as its user message, rendered as every prompt of
    the run is (an environment's first observation, rlvr.envs: a chat row's own messages give way to it)."""
    options = _render_options(cfg)

    def render_one(example: Example, text: str) -> list[int]:
        changed = dataclasses.replace(example, prompt=text, messages=None, prompt_ids=())
        return list(render([changed], tokenizer, cfg.data, **options)[0].prompt_ids)

    return render_one
