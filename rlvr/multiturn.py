"""Answers of several turns (rollout.tools): the driver between the engine and the loop.

An answer is a sequence of segments: the engine's sampled tokens, a tool's output, sampled tokens again. Every row of a
round advances turn by turn together: one engine call samples the next turn of every row still running; the turn's
tool calls then run in parallel (rlvr.tools, in the sandbox); rows that finished wait. The answer's ids are the engine's
ids with each tool output's ids between them, each output encoded once (no special or added token forms from an
output's text, so a program cannot print an end-of-turn token or a chat tag into the answer); nothing is decoded and encoded again,
so the learner trains on exactly the ids the engine sampled, with the engine's logprobs. `Completion.from_model` marks
the model's tokens: tool outputs are context only (out of the loss, KL, entropy, mismatch checks and length counts).

rollout.max_new_tokens bounds the whole answer, tool outputs included, so the engine's context and the learner's
sequences are as long as without tools (the plan and the sync check need nothing new). An output longer than
rollout.tool.output_tokens, or than what is left of the answer's budget, is cut with a marker; an answer with no room
left for even a cut output ends there (finish_reason "length"); an answer that ends its turn on the budget's last
token finishes "stop", as the engine says without tools. A model that asks for one call more than
rollout.max_turns allows ends its answer at that call's closing fence (`hit_max_turns`).

`ToolSampler` has the engine's `generate` and `greedy`, so the loop's rollout (rlvr.collect) and the evaluation
(rlvr.evaluation) take either; `sampler(engine, cfg)` gives the engine itself when rollout.tools is empty.
"""

from __future__ import annotations

import dataclasses
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr import chat, function_tools, thinking, tools
from rlvr.config import CodeSandbox, Config
from rlvr.rollout import Engine
from rlvr.tools import PythonLimits, PythonTool, Tool, ToolResult
from rlvr.types import Completion, ToolCall

MAX_FENCE_TURNS = 16  # turns of one answer ended by a fence that held no call; past it the answer ends there
CUT_MARKER = "\n[output cut: {shown} of {total} tokens shown]"
_SURROGATE = re.compile("[\ud800-\udfff]")  # lone surrogates: not text any encoder takes
TURN_END = ""  # what an answer waits on after a turn the model ended itself, when a tool reads calls there


@dataclass
class _Answer:
    """One answer being written: its segments so far and where it stands."""

    prompt_ids: list[int]
    budget: int  # tokens for the whole answer (rollout.max_new_tokens)
    seed: int | None  # its continuations' seeds derive from it
    ids: list[int] = field(default_factory=list)  # sampled and tool-output ids, in order
    from_model: list[bool] = field(default_factory=list)  # [len(ids)]
    logprobs: list[float] = field(default_factory=list)  # [len(ids)]: the engine's, 0 on tool tokens
    text: str = ""  # the model's own text (tool outputs left out)
    since_call: str = ""  # the model's text since the last tool output: where the next call is looked for
    calls: list[ToolCall] = field(default_factory=list)
    stop_string: str | None = None
    finish: str = "stop"
    running: bool = True
    waiting_on: str | None = None  # the tool stop string that ended its last turn
    fence_turns: int = 0
    hit_max_turns: bool = False
    opened_at: list[int] = field(default_factory=list)  # places in `text` where a tool frame opened a thinking block

    @property
    def left(self) -> int:
        return self.budget - len(self.ids)

    def end(self, finish: str) -> None:
        self.finish, self.running, self.waiting_on = finish, False, None

    def take(self, turn: Completion, tool_stops: set[str], user_stops: set[str], turn_end_id: int | None) -> None:
        """Append a turn the engine sampled; decide whether the answer ended or waits on a tool (`turn_end_id`: a tool
        reads calls in turns the model ends itself with this token, the chat template's end of turn; a turn that
        stopped at another stop token, e.g. another EOS id of the generation config, ends the answer)."""
        n = len(turn.token_ids)
        self.ids += turn.token_ids
        self.from_model += [True] * n
        self.logprobs += list(turn.engine_logprobs[:n]) + [0.0] * (n - len(turn.engine_logprobs[:n]))
        text = turn.text
        if turn.stop_string in user_stops and turn.stop_string not in tool_stops and text.endswith(turn.stop_string):
            text = text[: -len(turn.stop_string)]  # as without tools: a user's stop string is not in the text
        self.text += text
        self.since_call += text
        self.stop_string = turn.stop_string
        # the engine's finish reason, as without tools: vLLM checks stop conditions before the length, so an end of turn
        # on the budget's last token is "stop" (a call there finds no room for its output: _serve_tools ends it "length")
        if turn.finish_reason == "length":
            self.end("length")
        elif turn.stop_string in tool_stops:
            self.waiting_on = turn.stop_string
        elif turn_end_id is not None and turn.stop_string is None and turn.token_ids[-1:] == [turn_end_id]:
            self.waiting_on = TURN_END
        else:
            self.end("stop")

    def add_output(self, ids: list[int]) -> None:
        self.ids += ids
        self.from_model += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.since_call = ""

    def completion(self, sampled: bool) -> Completion:
        return Completion(prompt_ids=self.prompt_ids, token_ids=self.ids, text=self.text, finish_reason=self.finish,
                          engine_logprobs=self.logprobs if sampled else [], stop_string=self.stop_string,
                          from_model=self.from_model, calls=tuple(self.calls), hit_max_turns=self.hit_max_turns,
                          think_opened_at=tuple(self.opened_at))  # fmt: skip


class ToolSampler:
    """The engine with tools: `generate` and `greedy` as Engine's, each answer written over several turns."""

    def __init__(self, engine: Engine, tools: list[Tool], *, max_turns: int, output_tokens: int, workers: int,
                 think_tags: tuple[str, str] = thinking.DEFAULT_TAGS) -> None:  # fmt: skip
        self.engine = engine
        self.think_tags = think_tags  # a frame that ends inside such a block starts a thinking turn (rlvr.thinking)
        self.tools = tools
        self.max_turns = max_turns
        self.output_tokens = output_tokens
        self.workers = workers
        self.tokenizer = engine.tokenizer
        self._added = _added_tokens(self.tokenizer)
        self.tool_seconds = 0.0  # wall time spent waiting on tool calls, summed over the sampler's life

    def close(self) -> None:
        """Stop what the tools keep running (the function tools' worker processes)."""
        for tool in self.tools:
            getattr(tool, "close", lambda: None)()

    def greedy(self, prompts: list[tuple[int, ...]], *, max_tokens: int, stop: list[str]) -> list[Completion]:
        return [g[0] for g in self.generate(prompts, n=1, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seeds=None, stop=stop)]

    def generate(
        self,
        prompts: list[tuple[int, ...]],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seeds: list[int] | None,
        stop: list[str],
    ) -> list[list[Completion]]:
        """`n` answers per prompt, as Engine.generate. The first turn is one engine call with the prompts' seeds (as
        without tools); a continuation's seed derives from (the prompt's seed, the sample, the turn)."""
        tool_stops = {s for tool in self.tools for s in tool.stop}
        turn_end_id = self.tokenizer.eos_token_id if any(tool.turn_end for tool in self.tools) else None
        user_stops = set(stop)
        stops = list(dict.fromkeys([*stop, *tool_stops]))
        answers = [[_Answer(list(p), max_tokens, None if seeds is None else seeds[i]) for _ in range(n)]
                   for i, p in enumerate(prompts)]  # fmt: skip
        first = self.engine.generate(prompts, n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                     seeds=seeds, stop=stops, keep_stop=True)  # fmt: skip
        for group, turns in zip(answers, first, strict=True):
            for answer, turn in zip(group, turns, strict=True):
                answer.take(turn, tool_stops, user_stops, turn_end_id)
        flat = [(a, j) for group in answers for j, a in enumerate(group)]
        for turn_number in range(1, 10**9):
            self._serve_tools([a for a, _ in flat if a.waiting_on is not None])
            going = [(a, j) for a, j in flat if a.running]
            if not going:
                break
            next_seeds = None if seeds is None else [
                int(np.random.SeedSequence([a.seed or 0, j, turn_number]).generate_state(1)[0]) & 0x7FFFFFFF for a, j in going
            ]  # fmt: skip
            outs = self.engine.generate([tuple(a.prompt_ids + a.ids) for a, _ in going], n=1,
                                        max_tokens=[a.left for a, _ in going], temperature=temperature, top_p=top_p,
                                        seeds=next_seeds, stop=stops, keep_stop=True)  # fmt: skip
            for (answer, _), (turn,) in zip(going, outs, strict=True):
                answer.take(turn, tool_stops, user_stops, turn_end_id)
        return [[a.completion(sampled=temperature > 0) for a in group] for group in answers]

    def _serve_tools(self, waiting: list[_Answer]) -> None:
        """Every answer whose turn may hold calls: run them (every call of every answer in parallel) and append what
        they return; or let it go on (a fence that closed no call), or end it (no call at its end of turn, over
        max_turns, or no room left)."""
        jobs: list[tuple[_Answer, Tool, list[str]]] = []
        for answer in waiting:
            stop, answer.waiting_on = answer.waiting_on, None
            found = next(((t, r) for t in self.tools if (t.turn_end if stop == TURN_END else stop in t.stop)
                          for r in [t.parse(answer.since_call)] if r), None)  # fmt: skip
            if found is None:
                answer.fence_turns += 1
                if stop == TURN_END or answer.fence_turns > MAX_FENCE_TURNS:
                    answer.end("stop")
                elif answer.left <= 0:  # a fence with no call, on the budget's last token: without tools, "length"
                    answer.end("length")
            elif len(answer.calls) + len(found[1]) > self.max_turns:
                answer.hit_max_turns = True
                answer.end("stop")
            else:
                jobs.append((answer, *found))
        calls = [(answer, tool, request) for answer, tool, requests in jobs for request in requests]
        if not calls:
            return
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(calls)))) as pool:
            results = iter(list(pool.map(lambda call: _call(call[1], call[2], call[0]), calls)))
        self.tool_seconds += time.monotonic() - start
        for answer, tool, requests in jobs:
            turn = [next(results) for _ in requests]
            answer.calls += [ToolCall(tool.name, q, r.output, r.status, r.seconds) for q, r in zip(requests, turn, strict=True)]
            shown = self._output_ids(tool, [r.output for r in turn], answer.left)
            if shown is None:  # not even cut outputs fit: the answer ends here
                answer.end("length")
                continue
            ids, markup = shown
            answer.add_output(ids)
            if thinking.prompt_state(markup, self.think_tags, getattr(self.tokenizer, "eos_token", None)) is thinking.State.OPEN:
                answer.opened_at.append(len(answer.text))  # the frame opened a block (QwQ's): the next turn thinks
            if answer.left <= 0:
                answer.end("length")

    def _output_ids(self, tool: Tool, outputs: list[str], left: int) -> tuple[list[int], str] | None:
        """The ids of what the model is shown after a turn's calls, encoded once, and the frame's markup text: each
        output cut to rollout.tool.output_tokens, then the longest ones further until all fits in what is left of the
        answer's budget (each keeps its first tokens, then a marker); None when no cut fits."""
        bodies = [self._encode(output) for output in outputs]
        caps = [self.output_tokens] * len(outputs)
        while True:
            shown = [self._cut(output, body, cap) for output, body, cap in zip(outputs, bodies, caps, strict=True)]
            if None in shown:
                return None
            pieces = tool.format(shown)  # type: ignore[arg-type]
            ids = [i for text, markup in pieces for i in self._encode(text, markup)]
            excess = len(ids) - left
            if excess <= 0:
                return ids, "".join(text for text, markup in pieces if markup)
            sizes = [len(self._encode(s)) for s in shown]  # type: ignore[arg-type]
            k = max(range(len(sizes)), key=sizes.__getitem__)
            caps[k] = min(sizes[k] - 1, sizes[k] - excess)
            if caps[k] < 0:
                return None

    def _cut(self, output: str, body: list[int], cap: int) -> str | None:
        """`output` as shown within `cap` tokens: whole, or its first tokens and a marker; None when no cut fits."""
        if len(body) <= cap:
            return output
        keep = min(len(body), cap)
        while keep >= 0:
            shown = self.tokenizer.decode(body[:keep]) + CUT_MARKER.format(shown=keep, total=len(body))
            size = len(self._encode(shown))
            if size <= cap:
                return shown
            keep = min(keep - 1, keep - (size - cap))
        return None

    def _encode(self, text: str, markup: bool = False) -> list[int]:
        """Markup (a chat template's frame) as the template means it: its special and added tokens are tokens. Tool
        output as plain text: no special token ("<|im_end|>" printed by a program) and no token the tokenizer added
        without marking it special (Qwen's <tool_call>, </tool_response>, <think>) can form from it, so no output can
        end the turn or forge chat structure. Special tokens are split by the tokenizer (split_special_tokens); added
        ones by encoding the text in pieces cut inside each place one would form (pieces meet only there)."""
        encode = self.tokenizer.encode
        if markup:  # verbose=False: a long output is encoded whole before it is cut (transformers would warn)
            return list(encode(text, add_special_tokens=False, split_special_tokens=False, verbose=False))  # type: ignore[call-arg]
        cuts = [0, *(m.start() + 1 for m in self._added.finditer(text)), len(text)] if self._added else [0, len(text)]
        return [i for a, b in zip(cuts, cuts[1:]) if b > a
                for i in encode(text[a:b], add_special_tokens=False, split_special_tokens=True, verbose=False)]  # type: ignore[call-arg]  # fmt: skip


def _added_tokens(tokenizer: Any) -> re.Pattern[str] | None:
    """Where a token the tokenizer added (special or not, two characters or more) starts in a text: a lookahead, so
    overlapping places are all found. None for a tokenizer without added tokens."""
    added = sorted((t for t in getattr(tokenizer, "get_added_vocab", dict)() if len(t) > 1), key=len, reverse=True)
    return re.compile("(?=" + "|".join(map(re.escape, added)) + ")") if added else None


def _call(tool: Tool, request: str, answer: _Answer) -> ToolResult:
    """One call; a tool that raises costs this answer an error output, never the run. The output is made valid text
    here, for every tool: a lone surrogate (a JSON escape such as "\\udcff" in the call, a surrogateescape-decoded
    file name in a result) is shown as U+FFFD, so that encoding it, and writing it to samples.jsonl, cannot fail."""
    earlier = [c for c in answer.calls if c.tool == tool.name]
    start = time.monotonic()
    try:
        result = tool.run(request, earlier)
    except Exception as e:  # noqa: BLE001  (the user's own tools too: their failure is the model's error output)
        result = ToolResult(f"[{tool.name} failed: {type(e).__name__}: {str(e)[:200]}]", "error", time.monotonic() - start)
    return dataclasses.replace(result, output=_SURROGATE.sub("\ufffd", result.output))


Sampler = Engine | ToolSampler  # what rlvr.collect and rlvr.evaluation sample from


def check(cfg: Config) -> None:
    """Before any model loads: the functions rollout.tools names import and can be described, and the python tool's
    sandbox works (ConfigError naming the entry, the package or the kernel setting)."""
    function_tools.load(list(cfg.rollout.tools))
    tools.check(list(cfg.rollout.tools), cfg.rollout.tool.sandbox is CodeSandbox.bwrap)


def build(names: list[str], limits: PythonLimits, tokenizer: Any, *, max_calls: int = 1, workers: int = 1,
          template_kwargs: dict | None = None) -> list[Tool]:  # fmt: skip
    """The tools rollout.tools names (checked by rlvr.config): the python tool, and the functions named by import path
    as one tool (rlvr.function_tools; `tokenizer`'s chat template, rendered with `template_kwargs`, frames their results,
    up to `max_calls` a turn; `workers` processes run them)."""
    built: list[Tool] = [PythonTool(limits)] if "python" in names else []
    if any(function_tools.is_function(name) for name in names):
        functions, schemas = function_tools.load(names)
        frame = function_tools.ChatFrame(tokenizer, schemas, max_calls, template_kwargs)
        built.append(function_tools.FunctionTools(functions, frame, limits.wall_s, workers))
    return built


def sampler(engine: Engine, cfg: Config) -> Sampler:
    """The engine itself (rollout.tools empty: single-turn answers, as always), or the engine with the tools."""
    r = cfg.rollout
    if not r.tools:
        return engine
    t = r.tool
    limits = PythonLimits(cpu_s=t.cpu_s, wall_s=t.timeout_s, memory_mb=t.memory_mb, sandbox=t.sandbox is CodeSandbox.bwrap)
    tokenizer = chat.use_template(engine.tokenizer, chat.read_template(cfg.model.chat_template))  # as the prompts'
    built = build(list(r.tools), limits, tokenizer, max_calls=r.max_turns, workers=t.workers,
                  template_kwargs=chat.template_kwargs(cfg.data.chat_template_kwargs))  # fmt: skip
    return ToolSampler(engine, built, max_turns=r.max_turns, output_tokens=t.output_tokens, workers=t.workers,
                       think_tags=(cfg.reward.think_tags[0], cfg.reward.think_tags[1]))  # fmt: skip


def uses_tools(sampler: Sampler) -> bool:
    """Whether answers are written with tools (rollout.tools): the one place that asks, for the loop, the evaluation
    and the teardown."""
    return isinstance(sampler, ToolSampler)


def tool_seconds(sampler: Sampler) -> float:
    """The wall time the sampler has spent waiting on tool calls so far (0 without tools)."""
    return sampler.tool_seconds if isinstance(sampler, ToolSampler) else 0.0


def close(sampler: Sampler) -> None:
    """Stop what a sampler's tools keep running (function workers); the engine itself is closed by its owner."""
    if isinstance(sampler, ToolSampler):
        sampler.close()


def metrics(prefix: str, completions: list[Completion]) -> dict[str, float]:
    """`{prefix}calls_per_answer`, `failed_call_frac` and `failed_calls_per_answer` (error, timeout, limit), `max_turns_frac` (answers that asked for
    more calls than rollout.max_turns), `call_s` (the calls' wall time, summed) and `output_tokens_per_answer`."""
    calls = [c for answer in completions for c in answer.calls]
    n = max(len(completions), 1)
    return {
        f"{prefix}calls_per_answer": len(calls) / n,
        f"{prefix}failed_call_frac": sum(c.status != "ok" for c in calls) / max(len(calls), 1),
        f"{prefix}failed_calls_per_answer": sum(c.status != "ok" for c in calls) / n,
        f"{prefix}max_turns_frac": sum(a.hit_max_turns for a in completions) / n,
        f"{prefix}call_s": sum(c.seconds for c in calls),
        f"{prefix}output_tokens_per_answer": sum(len(a.token_ids) - a.generated for a in completions) / n,
    }

