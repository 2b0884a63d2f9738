"""Environments (rlvr.envs, rollout.env) in the multi-turn driver: the protocol's checks, episodes turn by turn, the
observation's frame, seeds, limits, every way an environment can fail, and the rewards they give.

The driver's logic runs against EosEngine (a scripted stand-in for vLLM, unit tests only); the real engine, learner and
CLI run in tests/test_envs_run.py.
"""

from __future__ import annotations

import sys
import time
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import env_examples  # noqa: E402
from env_examples import Scripted, add_chain, hangs, raises  # noqa: E402

from rlvr import envs  # noqa: E402
from rlvr.config import ConfigError  # noqa: E402
from rlvr.multiturn import CUT_MARKER, EnvSetup, ToolSampler  # noqa: E402
from rlvr.types import Completion, Example, RolloutBatch  # noqa: E402

EOS = "$"


class EosTokenizer:
    """One id per character (ord); "$" is the end-of-turn token, left out of decoded text as vLLM skips specials."""

    pad_token_id = 0
    eos_token = EOS
    eos_token_id = ord(EOS)

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = True, verbose: bool = True) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == ord(EOS)))


class EosEngine:
    """A scripted stand-in for rlvr.rollout.Engine: each request's next turn is `script(context_text, seed)`, sampled
    one character per token (logprob -0.5), ending at the first "$" (the end-of-turn token: kept in the ids, not in the
    text), at the first stop string (kept) or at the budget. Records every call."""

    def __init__(self, script) -> None:
        self.script, self.tokenizer, self.calls = script, EosTokenizer(), []

    def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop, keep_stop=False):
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        self.calls.append({"prompts": [self.tokenizer.decode(list(p), False) for p in prompts], "n": n, "seeds": seeds})
        out = []
        for prompt, budget in zip(prompts, budgets, strict=True):
            group = []
            for j in range(n):
                text = self.script(self.tokenizer.decode(list(prompt), False), j)
                ends = [(text.index(EOS) + 1, None)] if EOS in text else []
                ends += [(text.index(s) + len(s), s) for s in stop if s in text]  # a stop string stays (keep_stop)
                end, reason = min(ends, key=lambda e: e[0]) if ends else (len(text), None)
                cut, finish = text[:end], "stop"
                if len(cut) > budget:
                    cut, reason, finish = cut[:budget], None, "length"
                ids = self.tokenizer.encode(cut)
                group.append(Completion(list(prompt), ids, self.tokenizer.decode(ids), finish, [-0.5] * len(ids), reason))
            out.append(group)
        return out


def render(example: Example, text: str) -> list[int]:
    return [ord(ch) for ch in f"[{text}]"]


def sampler(script, factory, *, options=None, max_turns=8, timeout_s=2.0, output_tokens=64, budget=10_000, frame=None):
    engine = EosEngine(script)
    setup = EnvSetup(factory, options or {}, timeout_s, frame, render, budget, "arithmetic")
    return ToolSampler(engine, [], max_turns=max_turns, output_tokens=output_tokens, workers=4, env=setup), engine  # type: ignore[arg-type]


def examples(*answers: str) -> list[Example]:
    return [Example(f"ex{i}", f"Q{i}", a, prompt_ids=tuple(ord(c) for c in f"Q{i}:")) for i, a in enumerate(answers)]


def run(s: ToolSampler, exs: list[Example], n: int = 1, seeds=(11,), max_tokens=200) -> list[list[Completion]]:
    return s.generate([e.prompt_ids for e in exs], n=n, max_tokens=max_tokens, temperature=1.0, top_p=1.0,
                      seeds=list(seeds)[: len(exs)], stop=[], examples=exs)  # fmt: skip


def answers_each(*turns: str):
    """A script answering the k-th turn with turns[k] (k = the "=" signs the context holds past its prompt)."""
    return lambda context, j: turns[min(context.count("="), len(turns) - 1)]


def test_an_episode_is_the_engines_turns_with_the_observations_between_them():
    s, engine = sampler(answers_each("042$", "017$", "099$"), add_chain)
    (c,) = run(s, examples("042"), seeds=[5])[0]
    import random

    rng = random.Random(5)  # AddChain's problems come from the reset seed: the group's
    (p1, g1), (p2, _) = env_examples.problem(rng), env_examples.problem(rng)
    tok = engine.tokenizer
    assert tok.decode(c.token_ids, False) == f"042${p1}017${p2}099$"  # plain frame: the observation alone after the EOS
    assert c.text == "042017099"  # the model's own text: what a verifier reads
    writers = "".join({"model": "m", "env": "e"}[w] * k for w, k in c.segments)
    assert writers == "m" * 4 + "e" * 6 + "m" * 4 + "e" * 6 + "m" * 4
    assert c.from_model == [w == "m" for w in writers] and c.generated == 12
    assert c.engine_logprobs == [-0.5 if m else 0.0 for m in c.from_model]
    e = c.episode
    assert e.rewards == (1.0, float(g1 == "017"), 0.0) and e.returned == sum(e.rewards) and e.turns == 3
    assert e.end == "terminated" and e.error is None and e.success is (e.returned == 3)
    # turn 2 continues from exactly the ids so far (prompt, turn, observation), one engine call per turn
    assert engine.calls[1]["prompts"] == [f"Q0:042${p1}"] and len(engine.calls) == 3
    # the batch trains on the model's tokens only: observations are context
    batch = RolloutBatch.from_completions([c], [e.returned], [e.success], pad_id=0)
    assert batch.response_mask[0].tolist() == [float(m) for m in c.from_model]


def test_a_group_shares_its_seed_and_greedy_episodes_derive_one_from_the_id():
    made: list[Scripted] = []

    def factory(example):
        made.append(Scripted(example, [(None, 1.0, True, False, {})]))
        return made[-1]

    s, engine = sampler(answers_each("1$"), factory)
    run(s, examples("1", "2"), n=3, seeds=[21, 22])
    assert [m.seed for m in made] == [21, 21, 21, 22, 22, 22]
    # each answer's first turn has a seed of its own, derived from (the prompt's seed, the sample)
    first = engine.calls[0]
    assert first["n"] == 1 and len(first["seeds"]) == 6 and len(set(first["seeds"])) == 6
    made.clear()
    s.greedy([e.prompt_ids for e in examples("1")], max_tokens=10, stop=[], examples=examples("1"))
    assert made[0].seed == zlib.crc32(b"ex0") & 0x7FFFFFFF


def test_a_first_observation_replaces_the_prompt():
    s, engine = sampler(answers_each("x$"), lambda ex: Scripted(ex, [(None, 1.0, True, False, {})], first="guess 1-9"))
    (c,) = run(s, examples("1"))[0]
    assert engine.calls[0]["prompts"] == ["[guess 1-9]"] and c.prompt_ids == render(examples("1")[0], "guess 1-9")


def test_the_action_is_the_models_text_of_the_turn_and_the_return_sums_the_rewards():
    env = {}

    def factory(example):
        env["it"] = Scripted(example, [("again", 0.25, False, False, {}), ("more", -0.5, False, False, {}),
                                       (None, 2.0, True, False, {"success": True})])  # fmt: skip
        return env["it"]

    s, _ = sampler(lambda ctx, j: f"turn{ctx.count('$')}$", factory)
    (c,) = run(s, examples("1"))[0]
    assert env["it"].actions == ["turn0", "turn1", "turn2"]
    assert c.episode.returned == pytest.approx(1.75) and c.episode.success and c.episode.turns == 3


@pytest.mark.parametrize(("script", "end"), [
    ([("o", 0.0, False, True, {})], "truncated"),  # the environment truncated it
    ([("o", 0.0, False, False, {})] * 9, "max_turns"),  # rollout.max_turns steps
])  # fmt: skip
def test_an_episode_ends_truncated_or_at_max_turns(script, end):
    s, _ = sampler(answers_each("a$"), lambda ex: Scripted(ex, script), max_turns=3)
    (c,) = run(s, examples("1"))[0]
    assert c.episode.end == end and c.episode.turns == (1 if end == "truncated" else 3)
    assert not c.episode.success and c.finish_reason == "stop"


def test_a_model_out_of_budget_ends_its_episode_at_length():
    s, _ = sampler(lambda ctx, j: "abcdefgh$", lambda ex: Scripted(ex, [("observation", 0.0, False, False, {})]))
    (c,) = run(s, examples("1"), max_tokens=30)[0]
    # two turns and an observation (29 tokens); the next observation finds no room: the answer and the episode end
    assert c.finish_reason == "length" and len(c.token_ids) == 29 and c.episode.end == "length" and c.episode.turns == 2


@pytest.mark.parametrize(("step", "why"), [
    (raises, "step 1: ValueError: the world broke"),
    (lambda: ("o", 1.0, False), "step 1: step returned a tuple of 3, not (observation, reward, terminated, truncated, info)"),
    (lambda: ("o", float("nan"), False, False, {}), "step 1: step returned the reward nan: a finite number is expected"),
    (lambda: (7, 1.0, False, False, {}), "step 1: step returned an observation of type int: a str (or None) is expected"),
    (lambda: ("o", 1.0, "no", False, {}), "step 1: step returned terminated='no': True or False is expected"),
    (lambda: ("o", 1.0, False, False, []), "step 1: step returned info of type list: a dict is expected"),
])  # fmt: skip
def test_a_step_that_breaks_the_protocol_ends_that_episode_only(step, why):
    def factory(example):
        return Scripted(example, [step] if example["id"] == "ex0" else [(None, 1.0, True, False, {})])

    env_examples.CLOSED.clear()
    s, _ = sampler(answers_each("a$"), factory)
    bad, good = (g[0] for g in run(s, examples("1", "2"), seeds=[1, 2]))
    assert bad.episode.error == why and bad.episode.end == "error" and bad.episode.returned == 0 and not bad.episode.success
    assert good.episode.error is None and good.episode.returned == 1.0 and good.episode.success
    assert sorted(env_examples.CLOSED) == ["ex0", "ex1"]  # close runs for every episode, failed or not


def test_a_step_past_its_limit_ends_its_episode_and_the_others_go_on():
    s, _ = sampler(answers_each("a$"), lambda ex: Scripted(ex, [hangs] if ex["id"] == "ex0" else [(None, 1.0, True, False, {})]),
                   timeout_s=0.3)  # fmt: skip
    start = time.monotonic()
    slow, fine = (g[0] for g in run(s, examples("1", "2"), seeds=[1, 2]))
    assert time.monotonic() - start < 2.0  # the hung step is left behind, not waited for
    assert slow.episode.error == "step 1: timed out after 0.3 s (rollout.env_timeout_s)" and fine.episode.success


def test_steps_of_a_turn_run_at_once():
    def slow_step():
        time.sleep(0.3)
        return None, 1.0, True, False, {}

    s, _ = sampler(answers_each("a$"), lambda ex: Scripted(ex, [slow_step]))
    start = time.monotonic()
    done = run(s, examples(*"12345678"), seeds=range(8))
    assert time.monotonic() - start < 0.3 * 8 / 2 and all(g[0].episode.success for g in done)


def test_a_failing_make_or_reset_gives_an_empty_answer_and_the_run_goes_on():
    def factory(example):
        if example["id"] == "ex0":
            raise RuntimeError("cannot build the world")
        return Scripted(example, [(None, 1.0, True, False, {})], reset_fails=example["id"] == "ex1")

    s, engine = sampler(answers_each("a$"), factory)
    made, reset, fine = (g[0] for g in run(s, examples("1", "2", "3"), seeds=[1, 2, 3]))
    assert made.episode.error == "make raised RuntimeError: cannot build the world" and made.token_ids == []
    assert reset.episode.error == "reset: RuntimeError: no world today" and reset.token_ids == []
    assert engine.calls[0]["prompts"] == ["Q2:"] and fine.episode.success
    batch = RolloutBatch.from_completions([made, fine], [0.0, 1.0], [False, True], pad_id=0)
    assert batch.response_mask[0].sum() == 0  # an empty answer trains on nothing


def test_a_first_observation_over_the_prompt_budget_ends_that_episode():
    s, _ = sampler(answers_each("a$"), lambda ex: Scripted(ex, [(None, 1.0, True, False, {})], first="x" * 50), budget=20)
    (c,) = run(s, examples("1"))[0]
    assert c.episode.error == ("reset: its first observation makes a prompt of 52 tokens, over the 20 the engine's "
                               "context leaves before the answer") and c.token_ids == []  # fmt: skip


def test_a_huge_observation_is_cut_to_the_output_budget():
    s, _ = sampler(answers_each("a$", "b$"), lambda ex: Scripted(ex, [("=" * 500, 0.0, False, False, {}), (None, 0.0, True, False, {})]),
                   output_tokens=60)  # fmt: skip
    (c,) = run(s, examples("1"))[0]
    shown = "".join(chr(i) for i, m in zip(c.token_ids, c.from_model, strict=True) if not m)
    kept = shown.index("\n")  # one token per character: the observation's first tokens, then the marker
    assert len(shown) <= 60 and kept > 10 and shown == "=" * kept + CUT_MARKER.format(shown=kept, total=500)
    assert c.episode.turns == 2


def test_the_chat_frame_is_the_templates_user_message_after_the_models_turn():
    from test_function_tools import chat_tokenizer, ids

    from rlvr.function_tools import ChatFrame

    tok = chat_tokenizer()
    frame = ChatFrame(tok, [], 1, role="user", key="rollout.env")
    assert frame.around(1) == ["\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"]
    engine = EosEngine(lambda ctx, j: "1")
    engine.tokenizer = tok
    setup = EnvSetup(lambda ex: None, {}, 1.0, frame, render, 100, None)
    s = ToolSampler(engine, [], max_turns=4, output_tokens=64, workers=1, env=setup)  # type: ignore[arg-type]
    ended, stopped = (s._output_ids(lambda o, e=e: s._observation_frame(o, ended_on_eos=e), ["<|im_end|>12"], 100)
                      for e in (True, False))  # fmt: skip
    # markup's special tokens are tokens; the observation's text cannot end the turn: it is split to plain text
    assert ended[0] == ids(tok, "\n<|im_start|>user\n", True) + ids(tok, "<|im_end|>12") + ids(tok, "<|im_end|>\n<|im_start|>assistant\n", True)
    assert stopped[0] == [tok.eos_token_id] + ended[0]  # a turn that did not end on the EOS gets it from the frame


def test_check_names_an_environment_that_cannot_be_used():
    example = {"id": "x"}
    for path, words in [("env_examples:nowhere", "rollout.env"), ("env_examples", "package.module:function"),
                        ("env_examples:NOT_A_FUNCTION", "is a int, not callable"),
                        ("env_examples:no_step", "made a NoStep, which has no step method"),
                        ("env_examples:make_raises", "raised RuntimeError: cannot build the world")]:  # fmt: skip
        with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
            envs.check(path, example, {})
    envs.check("env_examples:add_chain", {"id": "x", "answer": "1"}, {"turns": 2})


def test_config_errors_for_environment_keys():
    from conftest import compose_config

    from rlvr.config import validate

    for overrides, words in [(["data=env"], "data.task=env gives prompts for an environment: set rollout.env"),
                             (["reward.verifier=none"], "reward.verifier=none leaves the reward"),
                             (["rollout.env=nomodule", "reward.verifier=none"], "package.module:function"),
                             (["rollout.env=a.b:c", "rollout.env_timeout_s=0"], "rollout.env_timeout_s > 0")]:  # fmt: skip
        with pytest.raises(ConfigError, match=words):
            validate(compose_config(*overrides))


def rewarder(verifier: str):
    from conftest import compose_config

    from rlvr.config import VerifierName, validate
    from rlvr.rewards import Rewarder

    cfg = validate(compose_config(f"reward.verifier={verifier}", "rollout.env=env_examples:add_chain", "reward.workers=0"))
    return Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)


def episode_answer(text: str, returned: float, success: bool) -> Completion:
    record = envs.EpisodeRecord(returned, 2, success, None, (returned,), "terminated")
    return Completion([1], [2, 3], text, "stop", [-0.1, -0.1], episode=record)


def test_rewards_are_the_return_alone_or_added_to_the_verifiers():
    answers = [episode_answer("042", 0.5, False), episode_answer("777", 2.0, True)]
    alone = rewarder("none").score(answers, ["042", "042"])
    assert alone.rewards.tolist() == [0.5, 2.0] and alone.correct.tolist() == [0.0, 1.0]  # success is correct
    added = rewarder("arithmetic").score(answers, ["042", "042"])
    assert added.rewards.tolist() == [1.5, 2.0] and added.correct.tolist() == [1.0, 0.0]  # the verifier's correct


def test_metrics_count_turns_returns_successes_and_errors():
    records = [envs.EpisodeRecord(1.0, 2, True, None), envs.EpisodeRecord(0.0, 4, False, "step 1: x"),
               envs.EpisodeRecord(-1.0, 3, False, None)]  # fmt: skip
    m = envs.metrics("env/", records, 1.5)
    assert m == {"env/turns_per_episode": 3.0, "env/return_mean": 0.0, "env/success_frac": pytest.approx(1 / 3),
                 "env/errors": 1.0, "env/step_s": 1.5}  # fmt: skip


def test_tools_inside_a_turn_and_the_environment_between_turns():
    """A turn may call a tool (its output goes on in the same turn); the environment steps once the turn ends."""
    from test_multiturn import EchoTool

    actions: list[str] = []

    def factory(example):
        env = Scripted(example, [("next", 1.0, False, False, {}), (None, 2.0, True, False, {})])
        actions.append(env)  # type: ignore[arg-type]
        return env

    turns = {0: "CALL a!", 1: "first$", 2: "second$"}
    engine = EosEngine(lambda ctx, j: turns[ctx.count("<") + ctx.count("next")])
    setup = EnvSetup(factory, {}, 2.0, None, render, 10_000, None)
    s = ToolSampler(engine, [EchoTool()], max_turns=4, output_tokens=64, workers=2, env=setup)  # type: ignore[arg-type]
    (c,) = run(s, examples("1"))[0]
    assert engine.tokenizer.decode(c.token_ids, False) == "CALL a!<a|0>first$nextsecond$"
    assert [w for w, _ in c.segments] == ["model", "tool", "model", "env", "model"]
    assert actions[0].actions == ["CALL a!first", "second"]  # the action is the turn's own text, the tool output left out
    assert c.episode.returned == 3.0 and [call.request for call in c.calls] == ["a"]


def test_hostile_observations_and_a_failing_render_end_nothing_but_their_episode():
    """A lone surrogate in an observation is shown as U+FFFD (it could not be encoded or logged otherwise); a first
    observation the template cannot render ends that episode, not the run."""
    s, _ = sampler(answers_each("a$", "b$"), lambda ex: Scripted(ex, [("bad \udcff byte", 0.0, False, False, {}), (None, 1.0, True, False, {})]))
    (c,) = run(s, examples("1"))[0]
    shown = "".join(chr(i) for i, m in zip(c.token_ids, c.from_model, strict=True) if not m)
    assert shown == "bad \ufffd byte" and c.episode.returned == 1.0 and c.episode.error is None

    def broken_render(example, text):
        raise ValueError("the template refused")

    s, _ = sampler(answers_each("a$"), lambda ex: Scripted(ex, [(None, 1.0, True, False, {})], first="hello"))
    s.env.render = broken_render  # type: ignore[union-attr]
    (c,) = run(s, examples("1"))[0]
    assert c.episode.error == "reset: its first observation could not be rendered as a prompt: ValueError: the template refused"
    assert c.token_ids == []
