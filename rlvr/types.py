"""The few types that cross module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from rlvr.thinking import State

if TYPE_CHECKING:
    from rlvr.envs import EpisodeRecord


@dataclass(frozen=True)
class Example:
    """One prompt with its ground-truth answer; `prompt_ids` are set once the prompt is rendered (rlvr.prompts)."""

    id: str
    prompt: str  # the prompt text (a `messages` row: its last user message)
    answer: str
    messages: tuple[dict[str, str], ...] | None = None  # a chat row's own messages ({role, content}), else None
    prompt_ids: tuple[int, ...] = ()  # the token ids the engine sees and the learner trains on
    gold: str | None = None  # the answer as a person reads it, where `answer` is a record for the verifier (gym); None = answer
    think: State = State.ABSENT  # where its completions start: inside a <think> block the prompt opened, or not (rlvr.thinking)
    extra: tuple[tuple[str, Any], ...] = ()  # the task's own fields, handed to an environment (data=env: env_id, index)

    def row(self, verifier: str | None = None) -> dict[str, Any]:
        """The example as an environment's factory receives it (rlvr.envs): its text fields, the task's verifier name
        and the task's own fields."""
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "gold": self.gold,
                "messages": None if self.messages is None else [dict(m) for m in self.messages], "verifier": verifier,
                **dict(self.extra)}  # fmt: skip

    @property
    def shown_answer(self) -> str:
        """The gold answer as samples.jsonl, wandb and the report show it."""
        return self.answer if self.gold is None else self.gold


@dataclass(frozen=True)
class ToolCall:
    """One tool call inside an answer (rlvr.tools): what the model asked for, what came back, how it went."""

    tool: str  # "python" | "functions"
    request: str  # the code, or the <tool_call> JSON, as the model wrote it
    output: str  # what the tool returned, whole (the model was shown it cut to rollout.tool.output_tokens)
    status: str  # "ok" | "error" (an exception, a non-zero exit) | "timeout" | "limit" (memory, output, budget)
    seconds: float  # wall time of the call


@dataclass(frozen=True)
class Completion:
    """One sampled answer to one prompt, as the engine returned it.

    With tools (rlvr.multiturn) an answer is several turns: the engine's sampled tokens, a tool's output, sampled tokens
    again. `token_ids` is all of them in order, exactly as the engine sampled them and the tool outputs were encoded
    (nothing decoded and encoded again); `from_model` says who wrote each token. Without tools `from_model` is None:
    every token is the model's."""

    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens (and tool outputs' tokens), EOS included when the engine stopped on it
    text: str  # what the verifier reads: the model's own text (tool outputs left out: a printed number is no answer)
    finish_reason: str  # "stop" | "length"
    engine_logprobs: list[float]  # sampled-token logprobs from the engine (pi_old with algo.pi_old=engine); 0 on tool tokens
    stop_string: str | None = None  # the stop string that ended the (last) turn, None for EOS or length
    from_model: list[bool] | None = None  # [len(token_ids)]: True where the engine sampled the token; None = all
    calls: tuple[ToolCall, ...] = ()  # the answer's tool calls, in order
    hit_max_turns: bool = False  # it asked for one more call than rollout.max_turns allows, and ended there
    think_opened_at: tuple[int, ...] = ()  # places in `text` where a tool frame opened a <think> block (rlvr.thinking)
    segments: tuple[tuple[str, int], ...] = ()  # who wrote token_ids, in runs: ("model" | "tool" | "env", count); () = the model
    episode: EpisodeRecord | None = None  # its environment's episode (rollout.env), None without one

    @property
    def model_ids(self) -> list[int]:
        """The ids the model wrote (tool outputs left out)."""
        return self.token_ids if self.from_model is None else [t for t, m in zip(self.token_ids, self.from_model) if m]

    @property
    def generated(self) -> int:
        """Tokens the model wrote (tool outputs not counted): the length overlong shaping and the length metrics use."""
        return len(self.token_ids) if self.from_model is None else sum(self.from_model)


@dataclass
class RolloutBatch:
    """N = B*G sampled responses as padded tensors, G consecutive rows per prompt.

    Row i is prompt + response, right-padded. Response token t of row i is input_ids[i, p_i + t]
    and is predicted by the logits at position p_i + t - 1 = response_index[i, t].
    """

    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] long
    response_ids: torch.Tensor  # [N, T] long, pad where response_mask is 0
    response_index: torch.Tensor  # [N, T] long, positions of the predicting logits (clamped in padding)
    response_mask: torch.Tensor  # [N, T] float: 1 on tokens that count (the model's, EOS included; not tool outputs)
    rewards: torch.Tensor  # [N] float
    correct: torch.Tensor  # [N] float, 1 where the verifier said correct
    truncated: torch.Tensor  # [N] bool, finish reason "length"
    engine_logprobs: torch.Tensor  # [N, T] float, the engine's sampled-token logprobs (0 in padding)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | slice) -> RolloutBatch:
        """The batch restricted to some rows (a slice or an index tensor)."""
        return RolloutBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def to(self, device: torch.device) -> RolloutBatch:
        return RolloutBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @staticmethod
    def from_completions(
        completions: list[Completion], rewards: list[float], correct: list[bool], pad_id: int
    ) -> RolloutBatch:
        """Pad a flat list of completions (G consecutive per prompt) into tensors."""
        n = len(completions)
        width = max(len(c.prompt_ids) + len(c.token_ids) for c in completions)
        t_max = max(1, max(len(c.token_ids) for c in completions))
        input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # [N, L]
        attention_mask = torch.zeros((n, width), dtype=torch.long)  # [N, L]
        response_ids = torch.full((n, t_max), pad_id, dtype=torch.long)  # [N, T]
        response_mask = torch.zeros((n, t_max))  # [N, T]
        engine_logprobs = torch.zeros((n, t_max))  # [N, T]
        starts = torch.zeros(n, dtype=torch.long)  # [N]
        for i, c in enumerate(completions):
            p, r = len(c.prompt_ids), len(c.token_ids)
            input_ids[i, : p + r] = torch.tensor(c.prompt_ids + c.token_ids)
            attention_mask[i, : p + r] = 1
            response_ids[i, :r] = torch.tensor(c.token_ids, dtype=torch.long)
            # tool outputs' tokens are context, not actions: out of the loss, KL, entropy and mismatch checks
            response_mask[i, :r] = 1.0 if c.from_model is None else torch.tensor(c.from_model, dtype=torch.float32)
            engine_logprobs[i, : len(c.engine_logprobs)] = torch.tensor(c.engine_logprobs)
            starts[i] = p
        response_index = (starts[:, None] - 1 + torch.arange(t_max)[None, :]).clamp(max=width - 1)  # [N, T]
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response_ids=response_ids,
            response_index=response_index,
            response_mask=response_mask,
            rewards=torch.tensor(rewards, dtype=torch.float32),
            correct=torch.tensor(correct, dtype=torch.float32),
            truncated=torch.tensor([c.finish_reason == "length" for c in completions]),
            engine_logprobs=engine_logprobs,
        )
