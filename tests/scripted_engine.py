"""ScriptedIdsEngine: a fake engine (unit tests of rlvr.multiturn only) that "samples" given token ids turn after turn.

Each turn is (ids, stop string): the Completion holds the ids as vLLM's would (an end-of-turn token the model sampled
stays in the ids), and their text as vLLM's detokenizer gives it, special tokens skipped."""

from __future__ import annotations

from rlvr.types import Completion


class ScriptedIdsEngine:
    def __init__(self, tokenizer, turns: list[tuple[list[int], str | None]]) -> None:
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop, keep_stop=False):
        out = []
        for prompt in prompts:
            ids, stop_string = self.turns.pop(0)
            self.prompts.append(list(prompt))
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append([Completion(list(prompt), ids, text, "stop", [-1.0] * len(ids), stop_string)])
        return out
