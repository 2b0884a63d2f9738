"""Thinking models: grade the answer, never the thoughts. One rule, in one place, for every verifier, the evaluation and
`rlvr eval`.

A thinking model's completion is thoughts in a block (`<think>` ... `</think>`, reward.think_tags), then its answer.
Whether the completion starts inside a block is decided once per prompt, from the prompt as the model sees it
(`prompt_state`, at render): the template may have opened the block (the DeepSeek-R1 distills and QwQ end the prompt
with `<think>\\n`: OPEN), opened and closed an empty one (Qwen3 with enable_thinking=false: CLOSED), or left it to the
model (Qwen3 thinking, SmolLM3, any model without a block: ABSENT).

With reward.think=auto (`split`), an answer thinks when its prompt left a block OPEN, or (ABSENT) when the model opens
one itself: its text starts with the open tag, or a close tag shows it was thinking. The verifier then reads only the
text after the last close tag, and an answer whose last block never closes has no answer at all, whatever its finish
reason (a cut-off or an end-of-turn inside the thoughts): a `\\boxed{}` written while thinking earns nothing. After a
CLOSED prompt the whole text is the answer. With reward.think=off the whole text is read, as before.

Tools: a call written inside the thoughts runs (Qwen3 calls tools while it thinks) and the thoughts go on after the
output; a turn that a tool frame opens inside a block (`opened_at`: the template's text after a tool result ends in an
open tag) is a thinking turn like the first. The tags are matched as text: the model's text is the engine's
detokenized text, where a tag the tokenizer added (Qwen's `<think>`) and a tag spelled in several tokens read alike.

No torch, no vLLM: the rewarder's workers and the report can import it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple


class State(enum.Enum):
    """Where a completion starts, decided from its prompt (prompt_state)."""

    OPEN = "open"  # inside a block the prompt opened: the completion is thoughts until it closes it
    CLOSED = "closed"  # the prompt opened and closed a block (thinking off): the completion is the answer
    ABSENT = "absent"  # no block: the model may open one


class Split(NamedTuple):
    """A completion's two parts: `answer` is what the verifier reads (None: the block never closed, no answer);
    `thoughts` the block's text, tags included (None for an answer that did not think)."""

    thoughts: str | None
    answer: str | None

    @property
    def unclosed(self) -> bool:
        return self.answer is None


DEFAULT_TAGS = ("<think>", "</think>")


def prompt_state(prompt: str, tags: tuple[str, str], turn_end: str | None) -> State:
    """The block state at the end of a prompt's text (decoded with its special tokens): of the text after the last
    end of turn (`turn_end`, the tokenizer's EOS text; the whole prompt if it has none), the last tag decides: an open
    tag after every close is OPEN; a close is CLOSED; no tag is ABSENT. Earlier turns of a conversation (few-shot
    thoughts) do not count."""
    open_tag, close_tag = tags
    tail = prompt.rsplit(turn_end, 1)[-1] if turn_end else prompt
    opened, closed = tail.rfind(open_tag), tail.rfind(close_tag)
    if opened > closed:
        return State.OPEN
    return State.CLOSED if closed >= 0 else State.ABSENT


def split(text: str, state: State, tags: tuple[str, str], opened_at: tuple[int, ...] = ()) -> Split:
    """`text` (the model's own text) as thoughts and answer under reward.think=auto (module docstring). `opened_at`:
    places in `text` where a tool frame left the next turn inside a block."""
    open_tag, close_tag = tags
    body = text.lstrip()
    thinking = state is State.OPEN or bool(opened_at) or (
        state is State.ABSENT and (body.startswith(open_tag) or close_tag in text)
    )
    if not thinking:
        return Split(None, text)
    closed = text.rfind(close_tag)
    last_open = max(text.rfind(open_tag), *opened_at) if opened_at else text.rfind(open_tag)
    if closed < 0 or last_open > closed:  # the last block never closes: no answer
        return Split(text, None)
    end = closed + len(close_tag)
    return Split(text[:end], text[end:])


def answer_text(text: str, state: State, tags: tuple[str, str], mode_auto: bool, opened_at: tuple[int, ...] = ()) -> Split:
    """What the verifier reads: `split` with reward.think=auto; the whole text (no thoughts) with off."""
    return split(text, state, tags, opened_at) if mode_auto else Split(None, text)


def think_tokens(ids: list[int], thoughts: str | None, decode: Callable[[list[int]], str]) -> int:
    """How many of the model's tokens `ids` wrote the thoughts: the fewest whose text covers them (binary search on the
    decoded length; `decode` skips special tokens, as the engine's text does)."""
    if not thoughts:
        return 0
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) >= len(thoughts):
            hi = mid
        else:
            lo = mid + 1
    return lo


def length_metrics(prefix: str, answers: list[tuple[list[int], Split]], decode: Callable[[list[int]], str]) -> dict[str, float]:
    """`{prefix}think_mean` and `{prefix}answer_mean`: the model's tokens per answer spent thinking and answering, from
    each answer's own token ids (tool outputs left out) and its split (an unclosed block is all thoughts; an answer that
    did not think, all answer)."""
    think = [len(ids) if split.unclosed else think_tokens(ids, split.thoughts, decode) for ids, split in answers]
    n = max(len(answers), 1)
    return {f"{prefix}think_mean": sum(think) / n, f"{prefix}answer_mean": sum(len(ids) - k for (ids, _), k in zip(answers, think)) / n}


def unused_tags_note(tags: tuple[str, str], *, expected: bool, prompts_with_blocks: int, think_mean: float) -> str | None:
    """The one note a run gets when it expected thinking (reward.think_tags set by hand, or a tokenizer that has the
    open tag as a token of its own) but neither its prompts nor its first step's answers hold a block: the tags may be
    wrong for this model. None otherwise (most runs: a model that does not think, and no tags asked for)."""
    if not expected or prompts_with_blocks or think_mean > 0:
        return None
    return (f"reward.think=auto: no prompt and no answer of step 1 holds a {tags[0]}...{tags[1]} block, so every answer is "
            f"graded whole; if this model thinks in other tags, set reward.think_tags")
