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
