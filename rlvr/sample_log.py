"""Sample rollouts as a person reads them (samples.jsonl, a wandb table), and the warning when the prompt format
is wrong: an instruct model prompted without its chat template, or a verifier that cannot find the answers.
"""

from __future__ import annotations

from typing import Any

from rlvr.rewards import Rewarder
from rlvr.types import Completion, Example
from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import Result

WARN_NO_ANSWER_FRAC = 0.9  # this share of completions without a readable answer means the format is wrong


def records(
    kind: str, step: int | None, examples: list[Example], completions: list[Completion], results: list[Result],
    rewards: list[float], tokenizer: Any, rewarder: Rewarder,
) -> list[dict[str, Any]]:
    """One row per completion: the prompt and completion exactly as the model saw and wrote them (special tokens
    included), the gold answer (a gym task's plain answer; its whole record in `answer_record`), the answer the verifier
    read, the outcome and the reward; for a thinking answer (rlvr.thinking) its two parts, `thoughts` and
    `answer_text` (what the verifier was given; null when the block never closed). `step` is None for a model
    evaluated outside a run (rlvr eval model.path=...)."""
    splits = rewarder.grade(completions, [e.think for e in examples])
    return [
        {
            "step": step,
            "kind": kind,  # "eval" (greedy, held out) | "eval_sampled" (rlvr eval, eval.n > 0) | "train" (sampled)
            "id": e.id,
            # an episode's own prompt: its environment's first observation may have replaced the example's
            "prompt": tokenizer.decode(list(e.prompt_ids if c.episode is None else c.prompt_ids), skip_special_tokens=False),
            "completion": tokenizer.decode(c.token_ids, skip_special_tokens=False),
            "gold": e.shown_answer,
            **({} if e.gold is None else {"answer_record": e.answer}),  # what the verifier is handed (gym: the JSON record)
            "extracted": rewarder.extract(split.answer),
            **({} if split.thoughts is None else {"thoughts": split.thoughts, "answer_text": split.answer}),
            "outcome": r.value if isinstance(r, Outcome) else r,
            "correct": rewarder.answered_right(c, r),
            "reward": reward,
            "tokens": c.generated,  # the model's own (tool outputs not counted)
            "finish_reason": c.finish_reason,
            **({} if c.from_model is None or (c.episode is not None and not c.calls) else {
                "tool_calls": describe_calls(c), "tool_tokens": len(c.token_ids) - c.generated - sum(k for w, k in c.segments if w == "env"),
                "hit_max_turns": c.hit_max_turns}),  # fmt: skip
            **({} if c.episode is None else {"episode": describe_episode(c), "turns": describe_turns(c, tokenizer)}),
        }
        for e, c, r, reward, split in zip(examples, completions, results, rewards, splits)
    ]


def describe_episode(completion: Completion) -> dict[str, Any]:
    """The answer's episode (rollout.env): its return, each step's reward, turns, success, how it ended and why it
    failed (null: it did not)."""
    e = completion.episode
    assert e is not None
    return {"return": e.returned, "rewards": list(e.rewards), "turns": e.turns, "success": e.success, "end": e.end,
            "error": e.error, "seconds": round(e.step_seconds, 3)}  # fmt: skip


def describe_turns(completion: Completion, tokenizer: Any) -> list[dict[str, str]]:
    """The answer turn by turn, each with who wrote it (model, env, tool), as the model saw it (special tokens kept)."""
    segments = completion.segments or (("model", len(completion.token_ids)),)
    turns, at = [], 0
    for who, count in segments:
        turns.append({"by": who, "text": tokenizer.decode(completion.token_ids[at : at + count], skip_special_tokens=False)})
        at += count
    return turns


def describe_calls(completion: Completion) -> list[dict[str, Any]]:
    """The answer's tool calls as a person reads them: each turn's code and its output."""
    return [{"tool": c.tool, "code": c.request, "output": c.output, "status": c.status, "seconds": round(c.seconds, 3)}
            for c in completion.calls]  # fmt: skip


def format_warning(where: str, no_answer_frac: float, rows: list[dict[str, Any]]) -> str | None:
    """A warning naming the share of completions without a readable answer, one of them as the model saw and wrote
    it, and the settings to check; None when fewer than WARN_NO_ANSWER_FRAC have none."""
    if no_answer_frac < WARN_NO_ANSWER_FRAC or not rows:
        return None
    shown = next((r for r in rows if r["outcome"] == Outcome.NO_ANSWER.value), rows[0])
    return (
        f"rlvr: warning: at {where}, {no_answer_frac:.0%} of completions have no answer the verifier can read (or end "
        f"at once), so almost no reward can reach the model. One of them, exactly as the model saw and wrote it:\n"
        f"----- prompt -----\n{shown['prompt']}\n----- completion ({shown['tokens']} tokens, {shown['finish_reason']}) "
        f"-----\n{shown['completion']}\n------------------\n"
        "Check data.format (an instruct model needs its chat template: auto or chat), data.prompt_template and "
        "data.system_prompt (ask for the answer in the form the verifier reads), reward.extract (where the math "
        "verifier looks for it), rollout.max_new_tokens (answers cut off) and model.path."
    )
