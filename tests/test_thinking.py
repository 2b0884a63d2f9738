"""Thinking models (issue 49): the chat template's arguments and a template of the run's own at every render, the
prompt's thinking state, the answer graded and never the thoughts (every verifier, a user's reward function, the
evaluation and the samples), and token-exact tool frames under templates that rewrite history.

The templates are fixtures written for these tests from the real ones' documented behaviour
(tests/fixtures/templates: Qwen3's hybrid template, DeepSeek-R1-Distill's, and a compact one for the built-in model);
the tokenizer is the built-in character-level one given ChatML's special tokens (tests/test_function_tools.py), so
every id is plain to read. The runs through the CLI are tests/test_thinking_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_config, requires_sandbox
from scripted_engine import ScriptedIdsEngine
from test_function_tools import CALL, chat_tokenizer, function_tool, ids
from test_prompts import data_cfg

from rlvr import chat, prompts, sample_log, thinking
from rlvr.config import ConfigError, VerifierName, validate
from rlvr.function_tools import ChatFrame
from rlvr.multiturn import ToolSampler
from rlvr.rewards import Rewarder
from rlvr.thinking import Split, State
from rlvr.types import Completion, Example
from rlvr.verifiers import Outcome
from rlvr.verifiers import math as math_verifier

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
QWEN3 = (TEMPLATES / "qwen3_like.jinja").read_text()
R1 = (TEMPLATES / "r1_like.jinja").read_text()
TAGS = thinking.DEFAULT_TAGS
OFF = {"enable_thinking": False}


def r1_tokenizer():
    tok = chat_tokenizer(R1)
    tok.add_special_tokens({"eos_token": "<|end_of_sentence|>", "additional_special_tokens": ["<|im_start|>", "<|User|>", "<|Assistant|>"]})
    return tok


# --- the rule (rlvr.thinking) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "state"),
    [
        ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", State.ABSENT),  # Qwen3, thinking on
        ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", State.CLOSED),  # thinking off
        ("<|User|>q<|Assistant|><think>\n", State.OPEN),  # the R1 distills, QwQ
        ("A conversation. User: 2+2? Assistant: <think>", State.OPEN),  # an R1-Zero-style plain prompt
        # an earlier turn's block (a few-shot answer) is not where this completion starts
        ("<|im_start|>assistant\n<think>\nr\n</think>\n\n4<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
         State.ABSENT),
        ("<|im_start|>assistant\n<think>\nr<|im_end|>\n<|im_start|>assistant\n", State.ABSENT),
    ],
)
def test_the_prompt_decides_where_a_completion_starts(prompt, state):
    assert thinking.prompt_state(prompt, TAGS, "<|im_end|>") is state


@pytest.mark.parametrize(
    ("text", "state", "expected"),
    [
        # the issue's case: a box written while thinking, the answer cut off (or ended) inside the block
        ("<think>\nFirst try: 2+3 = \\boxed{5}. Hmm, wait, the question asks for 2*3, so", State.ABSENT,
         Split("<think>\nFirst try: 2+3 = \\boxed{5}. Hmm, wait, the question asks for 2*3, so", None)),
        ("<think>\nr \\boxed{5}\n</think>\n\nThe answer is \\boxed{6}.", State.ABSENT,
         Split("<think>\nr \\boxed{5}\n</think>", "\n\nThe answer is \\boxed{6}.")),
        ("  <think>r</think>6", State.ABSENT, Split("  <think>r</think>", "6")),  # opened after whitespace
        ("r \\boxed{5}</think>\n\n\\boxed{6}", State.OPEN, Split("r \\boxed{5}</think>", "\n\n\\boxed{6}")),
        ("r \\boxed{5} and on and on", State.OPEN, Split("r \\boxed{5} and on and on", None)),
        ("r</think>so <think>maybe \\boxed{6}", State.OPEN, Split("r</think>so <think>maybe \\boxed{6}", None)),  # re-opened
        ("The answer is \\boxed{6}.", State.ABSENT, Split(None, "The answer is \\boxed{6}.")),  # no block: all answer
        ("r</think>\\boxed{6}", State.ABSENT, Split("r</think>", "\\boxed{6}")),  # a close shows it was thinking
        ("<think>x</think> \\boxed{6}", State.CLOSED, Split(None, "<think>x</think> \\boxed{6}")),  # thinking off: all answer
    ],
)
def test_the_answer_is_the_text_after_the_last_block_and_an_unclosed_block_has_none(text, state, expected):
    assert thinking.split(text, state, TAGS) == expected
    assert thinking.answer_text(text, state, TAGS, mode_auto=False) == Split(None, text)  # reward.think=off


def test_a_turn_a_tool_frame_opened_is_a_thinking_turn():
    """A frame that ends inside a block (QwQ's generation prompt after tool results) starts the next turn thinking."""
    first = "r</think><tool_call>{}</tool_call>"
    assert thinking.split(first + "more thoughts", State.OPEN, TAGS, opened_at=(len(first),)).unclosed
    assert thinking.split(first + "t2</think>42", State.OPEN, TAGS, opened_at=(len(first),)) == Split(first + "t2</think>", "42")
    assert thinking.split("42", State.CLOSED, TAGS, opened_at=(0,)).unclosed


def test_custom_tags_and_their_config_checks():
    assert thinking.split("<reasoning>r</reasoning>7", State.ABSENT, ("<reasoning>", "</reasoning>")) == Split("<reasoning>r</reasoning>", "7")
    assert validate(compose_config("reward.think_tags=['<r>','</r>']")).reward.think_tags == ["<r>", "</r>"]
    for bad in ("reward.think_tags=['<r>']", "reward.think_tags=['<r>','<r>']", "reward.think_tags=['','</r>']"):
        with pytest.raises(ConfigError, match="reward.think_tags must be two different non-empty tags"):
            validate(compose_config(bad))


def test_think_tokens_are_the_fewest_whose_text_covers_the_thoughts():
    tok = chat_tokenizer()
    text = "<think>\nab\n</think>\n\n42"
    own = ids(tok, text)
    split = thinking.split(text, State.ABSENT, TAGS)
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    assert thinking.think_tokens(own, split.thoughts, decode) == len("<think>\nab\n</think>")  # one token per character
    metrics = thinking.length_metrics("r/", [(own, split), (ids(tok, "42"), Split(None, "42")), (ids(tok, "abc"), Split("abc", None))], decode)
    assert metrics == {"r/think_mean": (19 + 0 + 3) / 3, "r/answer_mean": (4 + 2 + 0) / 3}  # unclosed: all thoughts


# --- the rewarder: every verifier grades the answer, never the thoughts --------------------------------------------


def rewarder(*overrides: str, verifier: VerifierName = VerifierName.math) -> Rewarder:
    cfg = validate(compose_config("reward.workers=0", *overrides))
    return Rewarder(cfg.reward, cfg.algo, max_len=10_000, task_verifier=verifier)  # (no overlong penalty here)


def completion(text: str) -> Completion:
    return Completion([1], [5] * max(len(text), 1), text, "stop", [])


def test_the_issues_case_scores_no_answer_with_think_auto_and_correct_with_off():
    text = "<think>\nFirst try: 2+3 = \\boxed{5}. Hmm, wait, the question asks for 2*3, so"
    assert math_verifier.verify(text, "5") is Outcome.CORRECT  # the verifier alone reads the last box: a thought
    auto = rewarder("reward.verifier=math")
    scores = auto.score([completion(text), completion("<think>\nr \\boxed{5}\n</think>\n\n\\boxed{6}")], ["5", "6"])
    assert scores.results == [Outcome.NO_ANSWER, Outcome.CORRECT]
    assert scores.rewards.tolist() == [auto.value(Outcome.NO_ANSWER), auto.value(Outcome.CORRECT)]
    assert scores.metrics["reward/unclosed_think_frac"] == 0.5 and scores.metrics["reward/no_answer_frac"] == 0.5
    off = rewarder("reward.verifier=math", "reward.think=off")
    assert off.score([completion(text)], ["5"]).results == [Outcome.CORRECT]  # the whole text: today's behaviour


def test_a_prompt_that_opened_the_block_makes_the_whole_completion_thoughts_until_it_closes():
    auto = rewarder("reward.verifier=math")
    texts = ["so \\boxed{5}", "so \\boxed{5}</think>\\boxed{6}", "no box</think>\\boxed{5}"]
    scores = auto.score([completion(t) for t in texts], ["5", "5", "5"], [State.OPEN] * 3)
    assert scores.results == [Outcome.NO_ANSWER, Outcome.INCORRECT, Outcome.CORRECT]
    closed = auto.score([completion("<think>\\boxed{5}")], ["5"], [State.CLOSED])  # thinking off: the text is the answer
    assert closed.results == [Outcome.CORRECT]


def test_the_arithmetic_and_gym_verifiers_read_the_answer_part():
    arithmetic = rewarder("reward.verifier=arithmetic", verifier=VerifierName.arithmetic)
    assert arithmetic.score([completion("<think>46</think>45")], ["46"]).results == [Outcome.INCORRECT]
    from rlvr.tasks.gym import examples

    train, _ = examples(name="chain_sum", size=2, eval_size=1, seed=0, options={"min_terms": 2, "max_terms": 2})
    entry, gold = train[0].answer, train[0].shown_answer
    wrong = str(int(gold) + 1)
    gym = rewarder("reward.verifier=gym", verifier=VerifierName.gym)
    texts = [f"<think><answer>{gold}</answer> no wait</think><answer>{wrong}</answer>", f"<think>r</think><answer>{gold}</answer>"]
    assert gym.score([completion(t) for t in texts], [entry] * 2).results == [Outcome.INCORRECT, Outcome.CORRECT]


@requires_sandbox
def test_the_code_verifier_runs_the_last_program_after_the_thoughts():
    from test_verifier_code import ADD, fenced

    code = rewarder("reward.verifier=code", "reward.workers=1", verifier=VerifierName.code)
    try:
        good, bad = fenced("def add(a, b):\n    return a + b"), fenced("def add(a, b):\n    return 3")
        texts = [f"<think>{good}</think>{bad}", f"<think>{bad}</think>{good}", f"<think>{good}"]
        assert code.score([completion(t) for t in texts], [ADD] * 3).results == [Outcome.INCORRECT, Outcome.CORRECT, Outcome.NO_ANSWER]
    finally:
        code.close()


def test_a_user_reward_function_gets_the_answer_and_if_it_asks_the_thoughts(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    both = rewarder("reward.fn=user_rewards:thoughtful")
    scores = both.score([completion("<think>long thoughts</think>42"), completion("42"), completion("<think>cut")], ["42"] * 3)
    # thoughtful: 1 + len(thoughts) / 100 when the answer is right; it saw (answer, thoughts) = ("42", "<think>long...</think>")
    expected = [1.0 + len("<think>long thoughts</think>") / 100, 1.0, both.value(Outcome.NO_ANSWER)]  # unclosed: unscored
    assert scores.rewards.tolist() == pytest.approx(expected)
    plain = rewarder("reward.fn=user_rewards:exact")  # (completion, answer) only: the answer part
    assert plain.score([completion("<think>x</think>42")], ["42"]).results == [Outcome.CORRECT]


def test_samples_show_the_thoughts_and_the_answer_the_verifier_read():
    auto = rewarder("reward.verifier=math")
    tok = chat_tokenizer()
    texts = ["<think>r</think>\\boxed{6}", "<think>r", "\\boxed{6}"]
    examples = [Example(str(i), "q", "6", prompt_ids=(5,)) for i in range(3)]
    completions = [Completion([5], ids(tok, t), t, "stop", []) for t in texts]
    results = auto.score(completions, ["6"] * 3).results
    rows = sample_log.records("train", 1, examples, completions, results, [1.0, 0.0, 1.0], tok, auto)
    assert (rows[0]["thoughts"], rows[0]["answer_text"], rows[0]["extracted"]) == ("<think>r</think>", "\\boxed{6}", "6")
    assert (rows[1]["thoughts"], rows[1]["answer_text"], rows[1]["outcome"]) == ("<think>r", None, "no_answer")
    assert "thoughts" not in rows[2] and rows[2]["extracted"] == "6"


# --- the chat template and its arguments at every render ------------------------------------------------------------


def test_template_arguments_reach_the_prompt_and_decide_its_state():
    tok = chat_tokenizer(QWEN3)
    on = prompts.render([Example("a", "q", "1")], tok, data_cfg(), think_tags=TAGS)[0]
    off = prompts.render([Example("a", "q", "1")], tok, data_cfg(chat_template_kwargs=OFF), think_tags=TAGS)[0]
    assert tok.decode(list(on.prompt_ids)).endswith("<|im_start|>assistant\n") and on.think is State.ABSENT
    assert tok.decode(list(off.prompt_ids)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and off.think is State.CLOSED
    r1 = r1_tokenizer()
    opened = prompts.render([Example("a", "q", "1")], r1, data_cfg(chat_template_kwargs=OFF), think_tags=TAGS)[0]
    assert r1.decode(list(opened.prompt_ids)) == "<|User|>q<|Assistant|><think>\n" and opened.think is State.OPEN  # no switch
    # an argument the template does not read is no error; the plain path has no template to give them to
    assert prompts.render([Example("a", "q", "1")], tok, data_cfg(chat_template_kwargs={"unknown": 1}))[0].prompt_ids == on.prompt_ids


def test_template_arguments_that_break_the_template_or_that_rlvr_sets_are_config_errors():
    tok = chat_tokenizer("{% if strict %}{{ raise_exception('strict mode needs a system message') }}{% endif %}" + QWEN3)
    with pytest.raises(ConfigError, match=r"data.chat_template_kwargs=\{'strict': True\}.*strict mode needs a system message"):
        prompts.render([Example("a", "q", "1")], tok, data_cfg(chat_template_kwargs={"strict": True}))
    with pytest.raises(ConfigError, match="data.chat_template_kwargs: add_generation_prompt is set by rlvr"):
        prompts.render([Example("a", "q", "1")], tok, data_cfg(chat_template_kwargs={"add_generation_prompt": False}))
    with pytest.raises(ConfigError, match="invalid value for config key 'data.chat_template_kwargs'"):
        validate(compose_config("data.chat_template_kwargs=[enable_thinking]"))


def test_a_template_file_that_is_missing_or_does_not_parse_is_a_config_error_naming_the_key(tmp_path):
    assert chat.read_template(str(TEMPLATES / "qwen3_like.jinja")) == QWEN3 and chat.read_template(None) is None
    with pytest.raises(ConfigError, match=r"model.chat_template: cannot read '.*nowhere.jinja'"):
        chat.read_template(str(tmp_path / "nowhere.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ConfigError, match=r"model.chat_template: '.*broken.jinja' is not a chat template.*TemplateSyntaxError"):
        chat.read_template(str(broken))
    from rlvr.models import resolve_model_path

    cfg = validate(compose_config(f"model.chat_template={tmp_path / 'nowhere.jinja'}"))
    with pytest.raises(ConfigError, match="model.chat_template: cannot read"):  # where start-up reads it: before any model
        prompts.load(cfg, resolve_model_path("builtin:tiny-arith"), verbose=False)


# --- token-exact tool frames under templates that rewrite history ---------------------------------------------------


def _answer(tok, turns: list[str], kwargs: dict | None = None, *, state_prompt: tuple[int, ...] = (5,)):
    """One answer through the driver: the fake engine samples these turns, each ended by the model's end of turn."""
    tool = function_tool(tok, "multiply")
    tool.frame = ChatFrame(tok, tool.frame.schemas, 2, kwargs)
    engine = ScriptedIdsEngine(tok, [(ids(tok, t) + [tok.eos_token_id], None) for t in turns])
    s = ToolSampler(engine, [tool], max_turns=2, output_tokens=256, workers=1)  # type: ignore[arg-type]
    (c,) = s.generate([state_prompt], n=1, max_tokens=4000, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    tool.close()
    return c, engine


@pytest.mark.parametrize("kwargs", [None, OFF], ids=["thinking", "not_thinking"])
def test_qwen3_frames_are_token_exact_with_thinking_on_and_off(kwargs):
    """The learner's ids are the engine's: turn, the template's tool message, turn; the newline the template writes after
    <|im_end|> (never sampled: the engine stopped there) is the frame's first token. With thinking off the frame ends
    in the closed empty block, as Qwen3's generation prompt does, so the next turn is an answer, not thoughts."""
    tok = chat_tokenizer(QWEN3)
    thought = "<think>\nI multiply.\n</think>\n\n" if kwargs is None else ""
    first, second = f"{thought}<tool_call>\n{CALL}\n</tool_call>", ("<think>\nDone.\n</think>\n\n" if kwargs is None else "") + "It is 7006652."
    c, engine = _answer(tok, [first, second], kwargs)
    before, after = ChatFrame(tok, [], 1, kwargs).around(1)
    assert before == "\n<|im_start|>user\n<tool_response>\n"  # the separator after <|im_end|>: the template's, not sampled
    assert after == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + ("" if kwargs is None else "<think>\n\n</think>\n\n")
    turn1, turn2 = ids(tok, first) + [tok.eos_token_id], ids(tok, second) + [tok.eos_token_id]
    frame = ids(tok, before, markup=True) + ids(tok, "7006652") + ids(tok, after, markup=True)
    assert c.token_ids == turn1 + frame + turn2 and engine.prompts[1] == [5, *turn1, *frame]  # what the engine saw
    assert c.from_model == [True] * len(turn1) + [False] * len(frame) + [True] * len(turn2)
    # graded: the answer after the last block (thinking), or the whole text after the closed prompt (not thinking)
    state = State.ABSENT if kwargs is None else State.CLOSED
    assert thinking.split(c.text, state, TAGS).answer == ("\n\nIt is 7006652." if kwargs is None else c.text)
    # within one tool loop the template keeps the turn's reasoning: the conversation renders as the ids read, but for
    # the closed empty block Qwen3 leaves out of an earlier turn (thinking off): rlvr keeps what the engine saw
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": first},
                    {"role": "tool", "content": "7006652"}, {"role": "assistant", "content": second}]  # fmt: skip
    prompt = tok.apply_chat_template(conversation[:1], add_generation_prompt=True, tokenize=False, **(kwargs or {}))
    rendered = tok.apply_chat_template(conversation, tokenize=False, **(kwargs or {}))
    ours = prompt + tok.decode(c.token_ids) + "\n"
    assert rendered == (ours if kwargs is None else ours.replace("assistant\n<think>\n\n</think>\n\n<tool_call>", "assistant\n<tool_call>", 1))


def test_r1_frames_are_token_exact_and_the_template_strips_the_thoughts_rlvr_keeps():
    """R1-Distill's template opens the block in the prompt and strips the reasoning from every assistant turn of a
    conversation it renders; rlvr never re-renders: the ids keep the thoughts the model wrote and saw."""
    tok = r1_tokenizer()
    first, second = f"I multiply.\n</think>\n\n<tool_call>{CALL}</tool_call>", "It is 7006652."
    c, engine = _answer(tok, [first, second], None)
    before, after = ChatFrame(tok, [], 1).around(1)
    assert (before, after) == ("<|tool_outputs_begin|><|tool_output_begin|>", "<|tool_output_end|><|tool_outputs_end|>")
    turn1, turn2 = ids(tok, first) + [tok.eos_token_id], ids(tok, second) + [tok.eos_token_id]
    frame = ids(tok, before, markup=True) + ids(tok, "7006652") + ids(tok, after, markup=True)
    assert c.token_ids == turn1 + frame + turn2 and engine.prompts[1] == [5, *turn1, *frame]
    assert thinking.split(c.text, State.OPEN, TAGS).answer == f"\n\n<tool_call>{CALL}</tool_call>It is 7006652."
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\n" + first},
                    {"role": "tool", "content": "7006652"}, {"role": "assistant", "content": second}]  # fmt: skip
    rendered = tok.apply_chat_template(conversation, tokenize=False)
    ours = tok.apply_chat_template(conversation[:1], add_generation_prompt=True, tokenize=False) + tok.decode(c.token_ids)
    assert rendered == ours.replace("<think>\nI multiply.\n</think>", "", 1)  # exactly the thoughts, stripped


def test_a_call_written_inside_the_thoughts_runs_and_the_thoughts_go_on():
    """Qwen3 calls tools while it thinks: a <tool_call> before the block closes is run like any other, and the turn
    after its result is still graded only after the block's close."""
    tok = chat_tokenizer(QWEN3)
    first, second = f"<think>\nLet me check. <tool_call>{CALL}</tool_call>", "So it is \\boxed{7006652}.\n</think>\n\n\\boxed{7006652}"
    c, _ = _answer(tok, [first, second])
    assert [(k.status, k.output) for k in c.calls] == [("ok", "7006652")]
    assert thinking.split(c.text, State.ABSENT, TAGS) == Split(first + "So it is \\boxed{7006652}.\n</think>", "\n\n\\boxed{7006652}")
    c, _ = _answer(tok, [first, "So it is \\boxed{7006652}."])  # the answer ends inside the thoughts: none
    assert thinking.split(c.text, State.ABSENT, TAGS).unclosed


def test_a_frame_that_opens_a_block_makes_the_next_turn_thinking():
    """QwQ (and Qwen3's thinking-2507 models) open the block in every generation prompt, after tool results too."""
    qwq = QWEN3.replace('{{- "<|im_start|>assistant\\n" -}}', '{{- "<|im_start|>assistant\\n<think>\\n" -}}')
    tok = chat_tokenizer(qwq)
    first = f"I multiply.\n</think>\n\n<tool_call>{CALL}</tool_call>"
    c, _ = _answer(tok, [first, "Hmm, 7006652? Let me see"])
    assert c.think_opened_at == (len(first),)
    assert thinking.split(c.text, State.OPEN, TAGS, c.think_opened_at).unclosed
    c, _ = _answer(tok, [first, "Right.\n</think>\n\n\\boxed{7006652}"])
    assert thinking.split(c.text, State.OPEN, TAGS, c.think_opened_at).answer == "\n\n\\boxed{7006652}"


def test_every_frame_is_rendered_with_the_runs_template_arguments():
    tok = chat_tokenizer(QWEN3)
    assert ChatFrame(tok, [], 2, OFF).around(2)[-1].endswith("assistant\n<think>\n\n</think>\n\n")
    assert ChatFrame(tok, [], 2).around(2)[-1].endswith("assistant\n")


def test_one_note_when_thinking_was_expected_and_nothing_thought():
    note = thinking.unused_tags_note(("<reasoning>", "</reasoning>"), expected=True, prompts_with_blocks=0, think_mean=0.0)
    assert note is not None and "<reasoning>...</reasoning>" in note and "reward.think_tags" in note
    assert thinking.unused_tags_note(TAGS, expected=False, prompts_with_blocks=0, think_mean=0.0) is None  # most runs
    assert thinking.unused_tags_note(TAGS, expected=True, prompts_with_blocks=3, think_mean=0.0) is None
    assert thinking.unused_tags_note(TAGS, expected=True, prompts_with_blocks=0, think_mean=12.5) is None
