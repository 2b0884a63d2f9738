"""The multi-turn driver (rlvr.multiturn) with tools: turns, budgets, the call limit, masks and token-exactness.

The driver's own logic runs against FakeEngine (a scripted engine: named so, it stands for vLLM in unit tests only);
the token-exactness of a real multi-turn answer runs against the real vLLM engine and the real learner
(test_learner_logprobs_equal_the_engines_on_multi_turn_answers).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
import torch
from scripted_engine import ScriptedIdsEngine

from rlvr import algo
from rlvr.multiturn import CUT_MARKER, MAX_FENCE_TURNS, ToolSampler, metrics
from rlvr.tools import PythonTool, ToolResult
from rlvr.types import Completion, RolloutBatch


class CharTokenizer:
    """One id per character (ord): what an output encodes to is plain to read in the asserts."""

    pad_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = True, verbose: bool = True) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """A scripted stand-in for rlvr.rollout.Engine: each request's next turn comes from `script(prompt_text, seed)`,
    a text the fake "samples" one character per token (logprob -0.5 each), stopping at the first stop string (kept in
    the text, as keep_stop asks) or at max_tokens. Records every call."""

    def __init__(self, script) -> None:
        self.script = script
        self.tokenizer = CharTokenizer()
        self.calls: list[dict] = []

    def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop, keep_stop=False):
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        self.calls.append({"prompts": [self.tokenizer.decode(list(p)) for p in prompts], "n": n, "budgets": budgets,
                           "seeds": seeds, "stop": stop})  # fmt: skip
        out = []
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            group = []
            for j in range(n):
                text = self.script(self.tokenizer.decode(list(prompt)), None if seeds is None else (seeds[i], j))
                cut, reason, finish = text, None, "stop"
                hits = [(text.find(s) + len(s), s) for s in stop if s in text]
                if hits:
                    end, reason = min(hits)
                    cut = text[:end]
                if len(cut) > budget:
                    cut, reason, finish = cut[:budget], None, "length"
                ids = self.tokenizer.encode(cut)
                group.append(Completion(list(prompt), ids, cut, finish, [-0.5] * len(ids), stop_string=reason))
            out.append(group)
        return out


@dataclass
class EchoTool:
    """A test tool: a call is the text after the last "CALL " up to its stop string "!"; it answers "<OUT:call>"."""

    name: str = "echo"
    stop: tuple[str, ...] = ("!",)
    delay: float = 0.0
    turn_end: bool = False

    def parse(self, turn: str) -> list[str]:
        return [turn[turn.rindex("CALL ") + 5 : -1]] if "CALL " in turn and turn.endswith("!") else []

    def run(self, request: str, earlier: list[str]) -> ToolResult:
        time.sleep(self.delay)
        if request == "boom":
            raise RuntimeError("the tool broke")
        return ToolResult(f"{request}|{len(earlier)}", "ok", self.delay)

    def format(self, outputs: list[str]) -> list[tuple[str, bool]]:
        return [(f"<{output}>", False) for output in outputs]


def sampler(script, *, max_turns=4, output_tokens=64, tools=None) -> tuple[ToolSampler, FakeEngine]:
    engine = FakeEngine(script)
    return ToolSampler(engine, tools or [EchoTool()], max_turns=max_turns, output_tokens=output_tokens, workers=4), engine  # type: ignore[arg-type]


def by_turn(*turns: str):
    """A script that answers the k-th turn of an answer with turns[k] (k = the number of tool outputs so far)."""
    return lambda prompt, seed: turns[min(prompt.count("<"), len(turns) - 1)]


def test_an_answer_is_the_engines_tokens_with_the_outputs_between_them():
    s, engine = sampler(by_turn("think CALL a!", "then CALL b!", " done."))
    (answer,) = s.generate([tuple(b"Q: ")], n=1, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[7], stop=[])[0]
    assert engine.tokenizer.decode(answer.token_ids) == "think CALL a!<a|0>then CALL b!<b|1> done."
    writers = "".join("m" if m else "t" for m in answer.from_model)
    assert writers == "m" * 13 + "t" * 5 + "m" * 12 + "t" * 5 + "m" * 6
    assert answer.text == "think CALL a!then CALL b! done."  # the verifier reads the model's text only
    assert answer.engine_logprobs == [-0.5 if m else 0.0 for m in answer.from_model]
    assert [c.request for c in answer.calls] == ["a", "b"] and answer.generated == 31
    assert answer.finish_reason == "stop" and not answer.hit_max_turns
    # turn 2 continues from exactly the ids so far, within what is left of the budget, with a derived seed
    assert engine.calls[1]["prompts"] == ["Q: think CALL a!<a|0>"] and engine.calls[1]["budgets"] == [100 - 18]
    assert engine.calls[1]["n"] == 1 and engine.calls[0]["seeds"] == [7] and engine.calls[1]["seeds"] != [7]


def test_the_batch_masks_tool_outputs_and_keeps_the_ids():
    s, _ = sampler(by_turn("CALL x!", "ok"))
    groups = s.generate([tuple(b"P"), tuple(b"PP")], n=2, max_tokens=50, temperature=1.0, top_p=1.0, seeds=[1, 2], stop=[])
    flat = [c for g in groups for c in g]
    batch = RolloutBatch.from_completions(flat, [0.0] * 4, [False] * 4, pad_id=0)
    for i, c in enumerate(flat):
        p, r = len(c.prompt_ids), len(c.token_ids)
        assert batch.input_ids[i, p : p + r].tolist() == c.token_ids
        assert batch.response_mask[i, :r].tolist() == [float(m) for m in c.from_model]
        assert batch.response_mask[i, r:].sum() == 0
    assert batch.response_mask.sum(1).tolist() == [c.generated for c in flat] == [9, 9, 9, 9]


def test_rows_advance_together_one_engine_call_per_turn():
    """Rows that finished wait; the rows still running share one engine call per turn."""
    s, engine = sampler(lambda prompt, seed: "CALL go!" if prompt.startswith("A") and prompt.count("<") < 3 else "end")
    s.generate([tuple(b"A"), tuple(b"B"), tuple(b"A2")], n=2, max_tokens=100, temperature=1.0, top_p=1.0,
               seeds=[1, 2, 3], stop=[])  # fmt: skip
    assert [len(c["prompts"]) for c in engine.calls] == [3, 4, 4, 4]  # 4 "A" rows go on for three more turns


def test_calls_of_a_turn_run_in_parallel():
    tool = EchoTool(delay=0.3)
    s, _ = sampler(by_turn("CALL x!", "end"), tools=[tool])
    start = time.monotonic()
    s.generate([tuple(b"P")] * 4, n=2, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[1, 2, 3, 4], stop=[])
    elapsed = time.monotonic() - start
    assert elapsed < 8 * 0.3 * 0.75, elapsed  # 8 calls of 0.3 s on 4 workers: ~0.6 s, never 2.4 s one after another
    assert s.tool_seconds >= 0.5


def test_max_turns_ends_the_answer_at_the_call_past_it():
    s, _ = sampler(by_turn("CALL a!"), max_turns=2)
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=500, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert len(c.calls) == 2 and c.hit_max_turns and c.finish_reason == "stop"
    assert s.tokenizer.decode(c.token_ids) == "CALL a!<a|0>CALL a!<a|1>CALL a!"
    assert metrics("tools/", [c])["tools/max_turns_frac"] == 1.0


def test_a_fence_without_a_call_goes_on_and_a_loop_of_them_ends():
    # "x!" stops without a call: the answer goes on from there
    s, engine = sampler(lambda prompt, seed: "y" if "<" in prompt else " and CALL a!" if prompt.endswith("x!") else "x!")
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=500, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert s.tokenizer.decode(c.token_ids) == "x! and CALL a!<a|0>y" and len(c.calls) == 1
    s, engine = sampler(lambda prompt, seed: "x!")  # only fences that hold no call
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=500, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert len(engine.calls) == MAX_FENCE_TURNS + 1 and c.finish_reason == "stop" and not c.calls


def test_outputs_are_cut_to_the_output_budget_and_to_what_is_left():
    s, _ = sampler(by_turn("CALL " + "z" * 100 + "!", "end"), output_tokens=60)
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=500, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    shown = s.tokenizer.decode([t for t, m in zip(c.token_ids, c.from_model) if not m])
    kept = shown.index("\n") - 1
    # rollout.tool.output_tokens bounds the output as shown (marker included), not the tool's own frame around it
    assert shown == "<" + "z" * kept + CUT_MARKER.format(shown=kept, total=102) + ">" and len(shown) == 60 + 2 and kept > 10
    assert c.calls[0].output == "z" * 100 + "|0" and c.text.endswith("end")  # the record keeps the whole output
    # the answer's budget: 40 tokens, 26 written by the call: room for 14, less than any cut output: it ends there
    s, _ = sampler(by_turn("CALL " + "z" * 20 + "!", "end"), output_tokens=60)
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=40, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 26 and len(c.calls) == 1 and all(c.from_model)
    # a budget that ends exactly with the output: "length", nothing sampled after it
    s, _ = sampler(by_turn("CALL a!", "more"))
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=12, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert s.tokenizer.decode(c.token_ids) == "CALL a!<a|0>" and c.finish_reason == "length"


def test_a_tool_that_raises_costs_that_answer_an_error_output():
    s, _ = sampler(by_turn("CALL boom!", "fine"))
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=200, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert c.calls[0].status == "error" and "the tool broke" in c.calls[0].output and c.text.endswith("fine")
    assert metrics("tools/", [c])["tools/failed_call_frac"] == 1.0


def test_user_stop_strings_end_the_answer_outside_the_text():
    s, _ = sampler(by_turn("CALL a!", "so 7</answer> tail"))
    (c,) = s.generate([tuple(b"P")], n=1, max_tokens=200, temperature=1.0, top_p=1.0, seeds=[0], stop=["</answer>"])[0]
    assert c.text == "CALL a!so 7" and c.finish_reason == "stop" and c.stop_string == "</answer>"


def test_greedy_has_no_logprobs_and_no_seeds():
    s, engine = sampler(by_turn("CALL a!", "end"))
    (c,) = s.greedy([tuple(b"P")], max_tokens=100, stop=[])
    assert c.engine_logprobs == [] and all(call["seeds"] is None for call in engine.calls) and len(c.calls) == 1


def test_seeds_of_later_turns_are_reproducible_and_distinct_per_sample():
    seen: list = []
    s, engine = sampler(lambda prompt, seed: (seen.append(seed), "CALL a!" if "<" not in prompt else "end")[1])
    s.generate([tuple(b"P")], n=3, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[5], stop=[])
    first = [c["seeds"] for c in engine.calls]
    s.generate([tuple(b"P")], n=3, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[5], stop=[])
    assert [c["seeds"] for c in engine.calls[2:]] == first and len(set(first[1])) == 3


def test_a_masked_tokens_gradient_is_exactly_zero():
    """Tool-output tokens (mask 0) get no gradient from the loss, its KL term, in every aggregation; the loss's value
    does not depend on their logprobs at all."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0]], dtype=torch.float64)  # [N, T]
    old = torch.randn(2, 6, generator=g, dtype=torch.float64) - 2  # [N, T]
    ref = torch.randn(2, 6, generator=g, dtype=torch.float64) - 2  # [N, T]
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)  # [N]
    for aggregation in algo.Aggregation:
        for ratio in algo.Ratio:
            logp = (old + 0.3 * torch.randn(2, 6, generator=g, dtype=torch.float64)).requires_grad_()  # [N, T]
            loss, _ = algo.policy_loss(logp, old, adv, mask, ratio=ratio.value, clip_low=0.2, clip_high=0.28,
                                       aggregation=aggregation.value, max_len=6, ref_logprobs=ref, kl_coef=0.1)  # fmt: skip
            loss.backward()
            assert logp.grad is not None and torch.all(logp.grad[mask == 0] == 0), (aggregation, ratio)
            assert torch.any(logp.grad[mask == 1] != 0)
            moved = logp.detach().clone()
            moved[mask == 0] += 5.0  # a tool token's logprob, whatever it is
            again, _ = algo.policy_loss(moved, old, adv, mask, ratio=ratio.value, clip_low=0.2, clip_high=0.28,
                                        aggregation=aggregation.value, max_len=6, ref_logprobs=ref, kl_coef=0.1)  # fmt: skip
            assert again.item() == loss.item()


def test_python_fence_parsing():
    tool = PythonTool.__new__(PythonTool)
    assert tool.parse("Let me compute.\n```python\nx = 2\nx * 3\n```\n") == ["x = 2\nx * 3\n"]
    assert tool.parse("```py\nprint(1)\n```\n") == ["print(1)\n"]
    assert tool.parse("a\n```python\n```\n") == [""]
    assert tool.parse("text\n```\n") == []  # an opening bare fence
    assert tool.parse("```bash\nls\n```\n") == []  # another language's block
    assert tool.parse("```python\na = 1\n```\nthen\n```\n") == []  # that block closed before
    assert tool.parse("x ```python\na = 1\n```\n") == []  # a fence counts at the start of a line only
    assert tool.parse("```python\na = 1\n```") == []  # not a closing fence the engine stops at
    assert PythonTool.stop == ("\n```\n",)


def test_calls_are_threads_of_one_process_not_processes_of_their_own():
    """The driver runs tools from a thread pool: the python tool's sandbox is a child process per call; a plain tool
    (the user's own, later) runs in the trainer's process."""
    names: set[str] = set()

    class Record(EchoTool):
        def run(self, request: str, earlier: list[str]) -> ToolResult:
            names.add(threading.current_thread().name)
            return super().run(request, earlier)

    s, _ = sampler(by_turn("CALL x!", "end"), tools=[Record(delay=0.05)])
    s.generate([tuple(b"P")] * 4, n=1, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[1, 2, 3, 4], stop=[])
    assert names and threading.main_thread().name not in names


@pytest.mark.parametrize("n_calls", [0, 3])
def test_metrics_count_calls_failures_and_output_tokens(n_calls):
    s, _ = sampler(lambda prompt, seed: "CALL a!" if prompt.count("<") < n_calls else "end")
    groups = s.generate([tuple(b"P")], n=2, max_tokens=200, temperature=1.0, top_p=1.0, seeds=[0], stop=[])
    m = metrics("tools/", groups[0])
    assert m["tools/calls_per_answer"] == n_calls and m["tools/failed_call_frac"] == 0.0
    assert m["tools/output_tokens_per_answer"] == sum(len(f"<a|{k}>") for k in range(n_calls))


def test_without_tools_the_sampler_is_the_engine_itself():
    """rollout.tools=[] (the default): rollouts and evaluations call the engine exactly as before tools existed."""
    from conftest import compose_config

    from rlvr.config import validate
    from rlvr.multiturn import sampler as sampler_for

    engine = FakeEngine(by_turn("x"))
    assert sampler_for(engine, validate(compose_config())) is engine  # type: ignore[arg-type]
    with_tools = sampler_for(engine, validate(compose_config("rollout.tools=[python]", "rollout.max_turns=3")))  # type: ignore[arg-type]
    assert isinstance(with_tools, ToolSampler) and with_tools.max_turns == 3 and [t.name for t in with_tools.tools] == ["python"]


def bpe_tokenizer():
    """A real byte-level BPE tokenizer (the `tokenizers` library) trained here on a tool-use answer, with merges across
    what will be segment boundaries: the whole answer, encoded at once, is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["```python\nprint(6 * 7)\n```\n```output\n42\n```\nThe answer is 42."] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<unk>")


def test_an_answer_whose_text_would_encode_otherwise_trains_on_the_engines_ids():
    """Issue 42: the engine sampled the turns byte by byte (ids its sampler may well pick), the tool output is encoded
    once on its own; decoding the answer and encoding it again would give one merged token. The batch holds the
    engine's ids and the output's, and the next turn was sampled after exactly those ids."""
    tok = bpe_tokenizer()
    by_byte = [tok.convert_tokens_to_ids(ch) for ch in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(
        "```python\nprint(6 * 7)\n```\n")[0][0]]  # fmt: skip  # one id per byte-level character
    second = tok.encode("The answer is 42.", add_special_tokens=False)
    engine = ScriptedIdsEngine(tok, [(by_byte, "\n```\n"), (second + [tok.eos_token_id], None)])
    class Fixed(PythonTool):
        def run(self, request: str, earlier: list[str]) -> ToolResult:
            assert request == "print(6 * 7)\n"
            return ToolResult("42\n", "ok", 0.0)

    fixed = Fixed.__new__(Fixed)
    s = ToolSampler(engine, [fixed], max_turns=2, output_tokens=64, workers=1)  # type: ignore[arg-type]
    (c,) = s.generate([(5,)], n=1, max_tokens=100, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    output_ids = tok.encode("```output\n42\n```\n", add_special_tokens=False)
    assert c.token_ids == by_byte + output_ids + second + [tok.eos_token_id]
    assert engine.prompts[1] == [5, *by_byte, *output_ids]  # turn 2 was sampled after exactly these ids
    batch = RolloutBatch.from_completions([c], [1.0], [True], pad_id=tok.pad_token_id)
    assert batch.input_ids[0, 1:].tolist() == c.token_ids
    text = tok.decode(c.token_ids, skip_special_tokens=True)
    assert text == "```python\nprint(6 * 7)\n```\n```output\n42\n```\nThe answer is 42."
    assert tok.encode(text, add_special_tokens=False) != c.token_ids[:-1]  # what re-encoding would have trained on
    assert len(tok.encode(text, add_special_tokens=False)) == 1
