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

With rollout.env every answer is also an episode (rlvr.envs): each answer gets its own environment, reset with its
group's seed (a first observation may replace the prompt); a turn the model ends itself, with no tool call in it, is
the action of the environment's next step, whose observation is appended as the chat template renders a user message
after the model's turn (a ChatFrame with role "user", encoded as tool outputs are) until the episode terminates, is
truncated, errs, reaches rollout.max_turns steps or runs out of budget. Every episode of a turn steps at once, in
threads, each call within rollout.env_timeout_s.

`ToolSampler` has the engine's `generate` and `greedy`, so the loop's rollout (rlvr.collect) and the evaluation
(rlvr.evaluation) take either; `sampler(engine, cfg)` gives the engine itself when rollout.tools is empty and there
is no rollout.env.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr import chat, envs, function_tools, thinking, tools
from rlvr.config import CodeSandbox, Config
from rlvr.rollout import Engine
from rlvr.tools import Piece, PythonLimits, PythonTool, Tool, ToolResult
from rlvr.types import Completion, Example, ToolCall

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
    episode: envs.Episode | None = None  # its environment's episode (rollout.env)
    since_obs: str = ""  # the model's text since the environment's last observation: the action of its next step
    env_turn: bool = False  # its turn ended and holds no tool call: the environment steps on it
    segments: list[list[Any]] = field(default_factory=list)  # [who, count] runs of `ids` (Completion.segments)

    @property
    def left(self) -> int:
        return self.budget - len(self.ids)

    def end(self, finish: str) -> None:
        self.finish, self.running, self.waiting_on = finish, False, None

    @property
    def in_episode(self) -> bool:
        return self.episode is not None and not self.episode.done

    def _extend(self, who: str, ids: list[int]) -> None:
        self.ids += ids
        self.from_model += [who == "model"] * len(ids)
        if ids and self.segments and self.segments[-1][0] == who:
            self.segments[-1][1] += len(ids)
        elif ids:
            self.segments.append([who, len(ids)])

    def take(self, turn: Completion, tool_stops: set[str], user_stops: set[str], turn_end_id: int | None) -> None:
        """Append a turn the engine sampled; decide whether the answer ended or waits on a tool (`turn_end_id`: a tool
        reads calls in turns the model ends itself with this token, the chat template's end of turn; a turn that
        stopped at another stop token, e.g. another EOS id of the generation config, ends the answer) or on its
        environment (any turn the model ended itself, in an episode still going)."""
        n = len(turn.token_ids)
        self._extend("model", turn.token_ids)
        self.logprobs += list(turn.engine_logprobs[:n]) + [0.0] * (n - len(turn.engine_logprobs[:n]))
        text = turn.text
        if turn.stop_string in user_stops and turn.stop_string not in tool_stops and text.endswith(turn.stop_string):
            text = text[: -len(turn.stop_string)]  # as without tools: a user's stop string is not in the text
        self.text += text
        self.since_call += text
        self.since_obs += text
        self.stop_string = turn.stop_string
        # the engine's finish reason, as without tools: vLLM checks stop conditions before the length, so an end of turn
        # on the budget's last token is "stop" (a call there finds no room for its output: _serve_tools ends it "length")
        if turn.finish_reason == "length":
            self.end("length")
        elif turn.stop_string in tool_stops:
            self.waiting_on = turn.stop_string
        elif turn_end_id is not None and turn.stop_string is None and turn.token_ids[-1:] == [turn_end_id]:
            self.waiting_on = TURN_END
        elif self.in_episode:
            self.env_turn = True
        else:
            self.end("stop")

    def ended_turn(self) -> None:
        """Its turn ended and held no call: the environment steps on it, or (none) the answer ends."""
        if self.in_episode:
            self.env_turn = True
        else:
            self.end("stop")

    def add_output(self, ids: list[int], who: str = "tool") -> None:
        self._extend(who, ids)
        self.logprobs += [0.0] * len(ids)
        self.since_call = ""
        if who == "env":
            self.since_obs = ""

    def completion(self, sampled: bool) -> Completion:
        return Completion(prompt_ids=self.prompt_ids, token_ids=self.ids, text=self.text, finish_reason=self.finish,
                          engine_logprobs=self.logprobs if sampled else [], stop_string=self.stop_string,
                          from_model=self.from_model, calls=tuple(self.calls), hit_max_turns=self.hit_max_turns,
                          think_opened_at=tuple(self.opened_at), segments=tuple((w, c) for w, c in self.segments),
                          episode=None if self.episode is None else self.episode.record())  # fmt: skip


@dataclass
class EnvSetup:
    """What the driver needs of rollout.env (rlvr.envs): the factory and its options, the frame an observation is shown
    in, how a first observation becomes the prompt, and the limits."""

    factory: Callable[..., Any]
    options: dict[str, Any]
    timeout_s: float  # rollout.env_timeout_s, per reset, step and close
    frame: function_tools.ChatFrame | None  # the chat template's user message after the model's turn; None: plain text
    render: Callable[[Example, str], list[int]]  # an example with `observation` as its prompt -> the prompt's ids
    prompt_budget: int  # the most tokens of a prompt (what the engine's context leaves after the answer's)
    verifier: str | None = None  # the task's verifier name, in each example handed to the factory


class ToolSampler:
    """The engine with tools, an environment, or both: `generate` and `greedy` as Engine's, each answer written over
    several turns."""

    def __init__(self, engine: Engine, tools: list[Tool], *, max_turns: int, output_tokens: int, workers: int,
                 think_tags: tuple[str, str] = thinking.DEFAULT_TAGS, env: EnvSetup | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.think_tags = think_tags  # a frame that ends inside such a block starts a thinking turn (rlvr.thinking)
        self.tools = tools
        self.env = env
        self.max_turns = max_turns
        self.output_tokens = output_tokens
        self.workers = workers
        self.tokenizer = engine.tokenizer
        self._added = _added_tokens(self.tokenizer)
        self.tool_seconds = 0.0  # wall time spent waiting on tool calls, summed over the sampler's life
        self.env_seconds = 0.0  # wall time spent waiting on environments (reset, step, close), summed likewise

    def close(self) -> None:
        """Stop what the tools keep running (the function tools' worker processes)."""
        for tool in self.tools:
            getattr(tool, "close", lambda: None)()

    def greedy(self, prompts: list[tuple[int, ...]], *, max_tokens: int, stop: list[str],
               examples: list[Example] | None = None) -> list[Completion]:  # fmt: skip
        return [g[0] for g in self.generate(prompts, n=1, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seeds=None,
                                            stop=stop, examples=examples)]  # fmt: skip

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
        examples: list[Example] | None = None,
    ) -> list[list[Completion]]:
        """`n` answers per prompt, as Engine.generate. The first turn is one engine call with the prompts' seeds (as
        without tools); a continuation's seed derives from (the prompt's seed, the sample, the turn). With an
        environment (`examples`: the prompts' examples) every answer is an episode of its own environment, reset with
        its prompt's seed (greedy: one derived from the example's id), whose first observation may replace the prompt;
        the first turn is then one engine call of n=1 per answer, seeded from (the prompt's seed, the sample)."""
        tool_stops = {s for tool in self.tools for s in tool.stop}
        turn_end_id = self.tokenizer.eos_token_id if any(tool.turn_end for tool in self.tools) else None
        user_stops = set(stop)
        stops = list(dict.fromkeys([*stop, *tool_stops]))
        answers = [[_Answer(list(p), max_tokens, None if seeds is None else seeds[i]) for _ in range(n)]
                   for i, p in enumerate(prompts)]  # fmt: skip
        flat = [(a, j) for group in answers for j, a in enumerate(group)]
        if self.env is None:
            first = self.engine.generate(prompts, n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                         seeds=seeds, stop=stops, keep_stop=True)  # fmt: skip
            for group, turns in zip(answers, first, strict=True):
                for answer, turn in zip(group, turns, strict=True):
                    answer.take(turn, tool_stops, user_stops, turn_end_id)
        else:
            assert examples is not None and len(examples) == len(prompts), "an environment needs the prompts' examples"
            self._start_episodes(answers, examples, seeds)
            going = [(a, j) for a, j in flat if a.running]
            outs = self.engine.generate([tuple(a.prompt_ids) for a, _ in going], n=1, max_tokens=max_tokens,
                                        temperature=temperature, top_p=top_p, seeds=_seeds(going, 0, seeds),
                                        stop=stops, keep_stop=True) if going else []  # fmt: skip
            for (answer, _), (turn,) in zip(going, outs, strict=True):
                answer.take(turn, tool_stops, user_stops, turn_end_id)
        for turn_number in range(1, 10**9):
            self._serve_tools([a for a, _ in flat if a.waiting_on is not None])
            self._serve_env([a for a, _ in flat if a.env_turn])
            going = [(a, j) for a, j in flat if a.running]
            if not going:
                break
            outs = self.engine.generate([tuple(a.prompt_ids + a.ids) for a, _ in going], n=1,
                                        max_tokens=[a.left for a, _ in going], temperature=temperature, top_p=top_p,
                                        seeds=_seeds(going, turn_number, seeds), stop=stops, keep_stop=True)  # fmt: skip
            for (answer, _), (turn,) in zip(going, outs, strict=True):
                answer.take(turn, tool_stops, user_stops, turn_end_id)
        if self.env is not None:
            self._end_episodes([a for a, _ in flat])
        return [[a.completion(sampled=temperature > 0) for a in group] for group in answers]

    def _start_episodes(self, answers: list[list[_Answer]], examples: list[Example], seeds: list[int] | None) -> None:
        """One environment per answer, reset (all at once) with its prompt's seed; a first observation becomes the
        answer's prompt. An episode whose make or reset fails, or whose first observation is over the prompt budget,
        ends there: the answer is empty, its episode records why."""
        env = self.env
        assert env is not None
        for i, (group, example) in enumerate(zip(answers, examples, strict=True)):
            seed = seeds[i] if seeds is not None else zlib.crc32(example.id.encode()) & 0x7FFFFFFF
            row = example.row(env.verifier)
            for answer in group:
                answer.episode = envs.start(env.factory, row, env.options, seed)
        live = [(a, ex) for group, ex in zip(answers, examples, strict=True) for a in group if a.in_episode]
        called = self._call_envs([a for a, _ in live], lambda a: a.episode.env.reset(seed=a.episode.seed))
        for (answer, episode, value, error), (_, example) in zip(called, live, strict=True):
            try:
                if error is not None:
                    raise envs.EnvError(error)
                observation, episode.info = envs.reset_result(value)
                if observation is not None:
                    ids = self._render(example, _SURROGATE.sub("\ufffd", observation))
                    if len(ids) > env.prompt_budget:
                        raise envs.EnvError(f"its first observation makes a prompt of {len(ids)} tokens, over the "
                                            f"{env.prompt_budget} the engine's context leaves before the answer")  # fmt: skip
                    answer.prompt_ids = list(ids)
            except envs.EnvError as e:
                episode.finish("error", f"reset: {e}")
        for group in answers:
            for answer in group:
                if not answer.in_episode:
                    answer.end("stop")  # nothing sampled: its environment failed before the first turn

    def _serve_env(self, waiting: list[_Answer]) -> None:
        """Every answer whose turn ended in an episode still going: its environment steps on the turn's text (all
        at once); the observation is shown as the template's next user message and the model goes on, or the episode
        (and the answer) ends: terminated, truncated, rollout.max_turns steps, an error, or no room left."""
        if not waiting:
            return
        env = self.env
        assert env is not None
        for answer in waiting:
            answer.env_turn = False
        for answer, episode, value, error in self._call_envs(waiting, lambda a: a.episode.env.step(a.since_obs)):
            try:
                if error is not None:
                    raise envs.EnvError(error)
                step = envs.step_result(value)
            except envs.EnvError as e:
                episode.finish("error", f"step {len(episode.rewards) + 1}: {e}")
                answer.end("stop")
                continue
            episode.rewards.append(step.reward)
            episode.info = step.info
            episode.terminated = step.terminated
            if step.terminated or step.truncated or len(episode.rewards) >= self.max_turns:
                episode.finish("terminated" if step.terminated else "truncated" if step.truncated else "max_turns")
                answer.end("stop")
                continue
            ended_on_eos = answer.ids[-1:] == [self.tokenizer.eos_token_id]
            observation = _SURROGATE.sub("\ufffd", step.observation or "")  # valid text, as tool outputs (_call)
            shown = self._output_ids(functools.partial(self._observation_frame, ended_on_eos=ended_on_eos), [observation], answer.left)
            if shown is None:  # not even a cut observation fits: the answer ends here
                episode.finish("length")
                answer.end("length")
                continue
            self._append(answer, *shown, "env")
            if not answer.running:
                episode.finish("length")

    def _call_envs(self, answers: list[_Answer], call: Callable[[Any], Any]) -> list[tuple[_Answer, envs.Episode, Any, str | None]]:
        """call(answer) for every answer at once, on its episode's environment (envs.run_all, each within
        rollout.env_timeout_s), the time counted: (answer, episode, what it returned, why it failed or None), in order."""
        assert self.env is not None
        episodes = [a.episode for a in answers]
        start = time.monotonic()
        results = envs.run_all([functools.partial(call, a) for a in answers], self.env.timeout_s)
        self.env_seconds += time.monotonic() - start
        out = []
        for answer, episode, (value, error, seconds) in zip(answers, episodes, results, strict=True):
            assert episode is not None
            episode.seconds += seconds
            out.append((answer, episode, value, error))
        return out

    def _render(self, example: Example, observation: str) -> list[int]:
        """A first observation as the example's prompt; a render that fails is that episode's error."""
        assert self.env is not None
        try:
            return self.env.render(example, observation)
        except Exception as e:  # noqa: BLE001  (a template that cannot render this text: the episode's error, not the run's)
            raise envs.EnvError(f"its first observation could not be rendered as a prompt: {type(e).__name__}: {e}") from None

    def _observation_frame(self, outputs: list[str], *, ended_on_eos: bool) -> list[Piece]:
        """An observation as the model is shown it: the chat template's user message after the model's turn and the
        next assistant header (its end-of-turn token left out where the model sampled it), or the text alone (plain)."""
        (observation,) = outputs
        frame = self.env.frame if self.env is not None else None
        if frame is None:
            return [(observation, False)]
        before, after = frame.around(1)
        eos = getattr(self.tokenizer, "eos_token", None) or ""
        pieces = [(before if ended_on_eos else eos + before, True), (observation, False), (after, True)]
        return [p for p in pieces if p[0]]

    def _end_episodes(self, answers: list[_Answer]) -> None:
        """Close every environment (all at once); an episode still going ends with its answer (length, or the model
        stopped without a turn the environment steps on)."""
        episodes = [a.episode for a in answers if a.episode is not None]
        for answer in answers:
            if answer.in_episode:
                answer.episode.finish("length" if answer.finish == "length" else "model")  # type: ignore[union-attr]
        start = time.monotonic()
        envs.close_all(episodes, self.env.timeout_s if self.env is not None else 0.0)
        self.env_seconds += time.monotonic() - start

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
                if stop == TURN_END:
                    answer.ended_turn()
                elif answer.fence_turns > MAX_FENCE_TURNS:
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
            shown = self._output_ids(tool.format, [r.output for r in turn], answer.left)
            if shown is None:  # not even cut outputs fit: the answer ends here
                answer.end("length")
                continue
            self._append(answer, *shown, "tool")

    def _append(self, answer: _Answer, ids: list[int], markup: str, who: str) -> None:
        """Show the answer a frame (a tool's outputs, an observation) and let it go on, if any room is left."""
        answer.add_output(ids, who)
        if thinking.prompt_state(markup, self.think_tags, getattr(self.tokenizer, "eos_token", None)) is thinking.State.OPEN:
            answer.opened_at.append(len(answer.text))  # the frame opened a block (QwQ's): the next turn thinks
        if answer.left <= 0:
            answer.end("length")

    def _output_ids(self, format: Callable[[list[str]], list[Piece]], outputs: list[str], left: int) -> tuple[list[int], str] | None:
        """The ids of what the model is shown after a turn's calls, encoded once, and the frame's markup text: each
        output cut to rollout.tool.output_tokens, then the longest ones further until all fits in what is left of the
        answer's budget (each keeps its first tokens, then a marker); None when no cut fits."""
        bodies = [self._encode(output) for output in outputs]
        caps = [self.output_tokens] * len(outputs)
        while True:
            shown = [self._cut(output, body, cap) for output, body, cap in zip(outputs, bodies, caps, strict=True)]
            if None in shown:
                return None
            pieces = format(shown)  # type: ignore[arg-type]
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


def _seeds(going: list[tuple[_Answer, int]], turn: int, seeds: list[int] | None) -> list[int] | None:
    """The seeds of one engine call over answers still going: each from (its prompt's seed, its sample, the turn)."""
    if seeds is None:
        return None
    return [int(np.random.SeedSequence([a.seed or 0, j, turn]).generate_state(1)[0]) & 0x7FFFFFFF for a, j in going]


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


def check(cfg: Config, example: Example | None = None, verifier: str | None = None) -> None:
    """Before any model loads: the functions rollout.tools names import and can be described, and the python tool's
    sandbox works (ConfigError naming the entry, the package or the kernel setting); rollout.env's factory imports and
    makes, for `example` (the first training example), an environment with reset and step (rlvr.envs)."""
    function_tools.load(list(cfg.rollout.tools))
    tools.check(list(cfg.rollout.tools), cfg.rollout.tool.sandbox is CodeSandbox.bwrap)
    if cfg.rollout.env is not None and example is not None:
        envs.check(cfg.rollout.env, example.row(verifier), dict(cfg.rollout.env_options or {}))


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


def sampler(engine: Engine, cfg: Config, verifier: str | None = None) -> Sampler:
    """The engine itself (rollout.tools empty and no rollout.env: single-turn answers, as always), or the engine with
    the tools and the environment (`verifier`: the task's verifier name, told to the environment's factory)."""
    from rlvr import prompts

    r = cfg.rollout
    if not r.tools and r.env is None:
        return engine
    t = r.tool
    limits = PythonLimits(cpu_s=t.cpu_s, wall_s=t.timeout_s, memory_mb=t.memory_mb, sandbox=t.sandbox is CodeSandbox.bwrap)
    tokenizer = chat.use_template(engine.tokenizer, chat.read_template(cfg.model.chat_template))  # as the prompts'
    kwargs = chat.template_kwargs(cfg.data.chat_template_kwargs)
    built = build(list(r.tools), limits, tokenizer, max_calls=r.max_turns, workers=t.workers, template_kwargs=kwargs)
    env = None
    if r.env is not None:
        chat_turns = prompts.chat_format(cfg.data.format, tokenizer)
        frame = function_tools.ChatFrame(tokenizer, [], 1, kwargs, role="user", key="rollout.env") if chat_turns else None
        budget = getattr(engine, "max_model_len", 1 << 30) - r.max_new_tokens
        env = EnvSetup(envs.load(r.env), dict(r.env_options or {}), r.env_timeout_s, frame, prompts.renderer(cfg, tokenizer),
                       budget, verifier)  # fmt: skip
    return ToolSampler(engine, built, max_turns=r.max_turns, output_tokens=t.output_tokens, workers=t.workers,
                       think_tags=(cfg.reward.think_tags[0], cfg.reward.think_tags[1]), env=env)  # fmt: skip


def uses_tools(sampler: Sampler) -> bool:
    """Whether answers are written with tools (rollout.tools): the one place that asks, for the loop, the evaluation
    and the teardown."""
    return isinstance(sampler, ToolSampler) and bool(sampler.tools)


def uses_env(sampler: Sampler) -> bool:
    """Whether answers are episodes of an environment (rollout.env)."""
    return isinstance(sampler, ToolSampler) and sampler.env is not None


def episode_args(sampler: Sampler, examples: list[Example]) -> dict[str, Any]:
    """What generate and greedy take besides the prompts: their examples, when answers are episodes (rollout.env)."""
    return {"examples": examples} if uses_env(sampler) else {}


def env_seconds(sampler: Sampler) -> float:
    """The wall time the sampler has spent waiting on environments so far (0 without one)."""
    return sampler.env_seconds if isinstance(sampler, ToolSampler) else 0.0


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
        f"{prefix}output_tokens_per_answer": sum(len(a.token_ids) - a.generated - sum(k for w, k in a.segments if w == "env")
                                                 for a in completions) / n,
    }

