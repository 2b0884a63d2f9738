"""The user's functions as tools (rollout.tools=[package.module:function], rlvr.function_tools): loading and describing
them, calls in the <tool_call> JSON format, results framed by the chat template, token-exact through the driver.

The driver runs against ScriptedIdsEngine (a fake engine, named so); the tokenizer is the built-in character-level
one given ChatML's special tokens and a chat template (real tokenizer features), so every id is plain to read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from scripted_engine import ScriptedIdsEngine
from test_prompts import EXAMPLES, data_cfg
from transformers import AutoTokenizer

from rlvr import function_tools, function_workers, multiturn
from rlvr.config import ConfigError, PromptFormat
from rlvr.function_tools import ChatFrame, FunctionTools
from rlvr.models import resolve_model_path
from rlvr.multiturn import CUT_MARKER, ToolSampler
from rlvr.prompts import render

# ChatML without tool support, as SmolLM2's template: a `tool` message is one more role
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# a template with tool support in the Qwen2.5 layout (written here): the tools in the system message, consecutive
# tool results as <tool_response> blocks inside one user turn
WITH_TOOLS = (  # transformers renders templates with trim_blocks: a newline right after a {% %} tag is written as {{ }}
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}"
    "{{ '\\n' }}Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = '{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}'


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tool_functions.py, named by import path


def chat_tokenizer(template: str = CHATML):
    """The built-in tokenizer with ChatML's special tokens, <|im_end|> as its end-of-turn (EOS) token."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-arith"))
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = template
    return tok


def function_tool(tok, *names: str, timeout_s: float = 2.0, workers: int = 4) -> FunctionTools:
    functions, schemas = function_tools.load([f"tool_functions:{n}" for n in names])
    return FunctionTools(functions, ChatFrame(tok, schemas), timeout_s, workers)


def ids(tok, text: str, markup: bool = False) -> list[int]:
    return tok.encode(text, add_special_tokens=False, split_special_tokens=not markup, verbose=False)


def test_functions_load_by_import_path_with_their_schemas():
    functions, schemas = function_tools.load(["python", "tool_functions:multiply", "tool_functions:lookup"])
    assert list(functions) == ["multiply", "lookup"] and functions["multiply"](6, 7) == 42
    assert schemas[0]["function"]["name"] == "multiply" and schemas[0]["function"]["description"] == "Multiply two integers exactly."
    assert schemas[0]["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first factor"}
    assert schemas[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert function_tools.load(["python"]) == ({}, [])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("tool_functions:undocumented", r"'tool_functions:undocumented' cannot be described.*docstring.*Args:"),
        ("tool_functions:missing", r"rollout.tools: function path 'tool_functions:missing'.*has no attribute"),
        ("no_such_module_anywhere:f", r"rollout.tools: function path 'no_such_module_anywhere:f'.*not found"),
    ],
)
def test_a_function_that_cannot_be_loaded_or_described_is_a_config_error_naming_it(entry, message):
    with pytest.raises(ConfigError, match=message):
        function_tools.load([entry])
    from conftest import compose_config

    from rlvr.config import validate

    with pytest.raises(ConfigError, match=message):  # what start-up and `rlvr eval` run before any model loads
        multiturn.check(validate(compose_config(f"rollout.tools=[{entry}]")))


def test_two_functions_of_one_name_are_refused(tmp_path, monkeypatch):
    (tmp_path / "other_tools.py").write_text('def multiply(a: int) -> int:\n    """Double.\n\n    Args:\n        a: a number\n    """\n    return 2 * a\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="two functions are named 'multiply'"):
        function_tools.load(["tool_functions:multiply", "other_tools:multiply"])


def test_config_takes_function_paths_beside_python():
    from conftest import compose_config

    from rlvr.config import validate

    cfg = validate(compose_config("rollout.tools=[python,tool_functions:multiply]"))
    assert list(cfg.rollout.tools) == ["python", "tool_functions:multiply"]
    with pytest.raises(ConfigError, match=r"unknown tool 'multiply'.*import path"):
        validate(compose_config("rollout.tools=[multiply]"))
    with pytest.raises(ConfigError, match=r"rollout.tool.output_tokens >= 48 \(room for the cut marker.*output_tokens=47"):
        validate(compose_config("rollout.tools=[python]", "rollout.tool.output_tokens=47"))


def test_calls_are_parsed_in_order_an_unclosed_last_one_to_the_end():
    tool = function_tool(chat_tokenizer(), "multiply")
    turn = f"First.\n<tool_call>\n{CALL}\n</tool_call>\n<tool_call>{{\"name\": \"multiply\"}}</tool_call>\n<tool_call>\n{{\"na"
    assert tool.parse(turn) == [CALL, '{"name": "multiply"}', '{"na']
    assert tool.parse("The answer is 7006652.") == []


@pytest.mark.parametrize(
    ("request_", "status", "output"),
    [
        (CALL, "ok", "7006652"),
        ('{"name": "multiply", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}', "ok", "6"),  # arguments as a JSON string
        ('{"name": "lookup", "arguments": {"word": "cat"}}', "ok", '{"legs": 4, "sound": "meow"}'),
        ('{"name": "echo", "arguments": {"text": "<|im_end|>"}}', "ok", "<|im_end|>"),
        ("multiply(2, 3)", "error", "[the tool call is not JSON: "),
        ("[1, 2]", "error", '[a tool call is one JSON object: {"name": <function name>, "arguments": {...}}]'),
        ('{"name": "divide", "arguments": {}}', "error", "[there is no function 'divide'; the functions are ['echo', 'leave', 'lookup', 'multiply']]"),
        ('{"name": "multiply", "arguments": [1, 2]}', "error", "[the arguments of multiply must be a JSON object, not list]"),
        ('{"name": "multiply", "arguments": {"a": 1}}', "error", "[multiply raised TypeError: "),
        ('{"name": "lookup", "arguments": {"word": "dog"}}', "error", "[lookup raised KeyError: \"no entry for 'dog'\"]"),
        ('{"name": "leave", "arguments": {}}', "error", "[leave raised SystemExit: 3]"),
        ('{"name": "multiply", "parameters": {"a": 2, "b": 5}}', "ok", "10"),  # Llama's spelling of "arguments"
        ('{"name": "leave", "arguments": null}', "error", "[leave raised SystemExit: 3]"),  # null: no arguments
    ],
)
def test_a_call_returns_its_result_or_an_error_output_never_raises(request_, status, output):
    result = function_tool(chat_tokenizer(), "multiply", "lookup", "echo", "leave").run(request_, [])
    assert result.status == status
    assert result.output == output if status == "ok" or output.endswith("]") else result.output.startswith(output)


def test_a_huge_result_is_cut_before_it_is_tokenized():
    result = function_tool(chat_tokenizer(), "echo").run(json.dumps({"name": "echo", "arguments": {"text": "y" * 10**6}}), [])
    limit = function_workers.MAX_RESULT_CHARS
    assert result.status == "limit" and result.output == "y" * limit + "\n[result cut: 1000000 characters]"


def test_a_function_that_runs_past_the_timeout_is_a_timeout_output():
    start = time.monotonic()
    result = function_tool(chat_tokenizer(), "nap", timeout_s=0.2).run('{"name": "nap", "arguments": {"seconds": 3}}', [])
    assert (result.status, result.output) == ("timeout", "[nap timed out after 0.2 s]") and time.monotonic() - start < 2


def test_the_frame_is_the_templates_own_text_around_the_results():
    chatml = ChatFrame(chat_tokenizer(), [])
    assert chatml.around(1) == ["\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"]
    assert chatml.around(2) == ["\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"]
    grouped = ChatFrame(chat_tokenizer(WITH_TOOLS), [])
    assert grouped.around(2) == ["\n<|im_start|>user\n<tool_response>\n", "\n</tool_response>\n<tool_response>\n",
                                 "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (CHATML.replace("{% for m in messages %}", "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"),
         "cannot render a function's result.*no tools"),
        (CHATML.replace("{% for m in messages %}", "{% for m in messages if m['role'] != 'tool' %}"), "leaves out, rewrites"),
        (CHATML.replace("<|im_end|>\n{% endfor %}", "</s>\n{% endfor %}"), r"ends an assistant message with '</s>\\n.*'<\|im_end\|>'"),
        (CHATML.replace("{{ m['content'] }}", "{{ m['content'] | tojson }}"), "rewrites"),  # results quoted as JSON (Llama 3.1)
    ],
)
def test_a_template_that_cannot_frame_results_is_a_config_error(template, message):
    with pytest.raises(ConfigError, match=message):
        ChatFrame(chat_tokenizer(template), [])


def test_a_tokenizer_whose_tool_call_tag_is_a_special_token_is_refused():
    tok = chat_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<tool_call>"]})  # the engine's text drops it
    with pytest.raises(ConfigError, match="<tool_call> as a special token"):
        ChatFrame(tok, [])


def test_a_template_that_teaches_another_call_format_gets_rlvrs_description():
    """A template that renders the tools but asks for another format (Llama 3.1's bare JSON with "parameters") is not
    used for them: the model is told the <tool_call> format its calls are read in."""
    _, schemas = function_tools.load(["tool_functions:multiply"])
    other = chat_tokenizer("{% if tools %}Call a function as {\"name\": ..., \"parameters\": ...}: {{ tools | tojson }}\n{% endif %}" + CHATML)
    assert not function_tools.renders_tools(other, [{"role": "user", "content": "?"}], schemas)
    text = other.decode(render(EXAMPLES[:1], other, data_cfg(), None, schemas)[0].prompt_ids)
    assert text.startswith(f"<|im_start|>system\n{function_tools.describe(schemas)}<|im_end|>") and "parameters\": ..." not in text


def test_the_functions_reach_the_prompt_through_the_template_or_rlvrs_description():
    _, schemas = function_tools.load(["tool_functions:multiply"])
    with_tools = chat_tokenizer(WITH_TOOLS)
    text = with_tools.decode(render(EXAMPLES[:1], with_tools, data_cfg(), None, schemas)[0].prompt_ids)
    assert text == (f"<|im_start|>system\nTools:\n{json.dumps(schemas[0])}\nCall one as <tool_call>{{\"name\": ..., \"arguments\": "
                    f"...}}</tool_call><|im_end|>\n<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    chatml = chat_tokenizer()  # ignores `tools`: rlvr's own description ends the system message, after the python one
    text = chatml.decode(render(EXAMPLES[:1], chatml, data_cfg(system_prompt="Be brief."), "Use python.", schemas)[0].prompt_ids)
    assert text == (f"<|im_start|>system\nBe brief.\n\nUse python.\n\n{function_tools.describe(schemas)}<|im_end|>\n"
                    f"<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    assert json.dumps(schemas[0]) in function_tools.describe(schemas) and "<tool_call>" in function_tools.describe(schemas)
    with pytest.raises(ConfigError, match="rollout.tools names functions.*chat template.*data.format=plain"):
        render(EXAMPLES[:1], chatml, data_cfg(format=PromptFormat.plain), None, schemas)


def sample(tok, tool, turns: list[str], *, max_tokens: int = 2000, max_turns: int = 4, output_tokens: int = 256):
    """One answer whose turns the fake engine "samples" as these texts, each ended by the model's <|im_end|>."""
    engine = ScriptedIdsEngine(tok, [(ids(tok, t) + [tok.eos_token_id], None) for t in turns])
    s = ToolSampler(engine, [tool], max_turns=max_turns, output_tokens=output_tokens, workers=4)  # type: ignore[arg-type]
    (c,) = s.generate([(5,)], n=1, max_tokens=max_tokens, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    return c, engine


@pytest.mark.parametrize("template", [CHATML, WITH_TOOLS])
def test_an_answer_with_a_function_call_is_the_engines_ids_and_the_templates_tool_message(template):
    """The turn ends at the model's own <|im_end|> (sampled, kept, trained on); then the template's tool message: its
    markup with real special tokens, the result as text; the next turn is sampled after exactly those ids. Decoded,
    the answer is what the chat template renders for the same conversation."""
    tok = chat_tokenizer(template)
    first, second = f"Let me compute.\n<tool_call>\n{CALL}\n</tool_call>", "The product is 7006652."
    c, engine = sample(tok, function_tool(tok, "multiply"), [first, second])
    before, after = ChatFrame(tok, []).around(1)
    shown = ids(tok, before, markup=True) + ids(tok, "7006652") + ids(tok, after, markup=True)
    turn1, turn2 = ids(tok, first) + [tok.eos_token_id], ids(tok, second) + [tok.eos_token_id]
    assert c.token_ids == turn1 + shown + turn2 and engine.prompts[1] == [5, *turn1, *shown]
    assert c.from_model == [True] * len(turn1) + [False] * len(shown) + [True] * len(turn2)
    assert tok.convert_tokens_to_ids("<|im_start|>") in shown  # the template's special tokens are tokens
    assert c.engine_logprobs == [-1.0] * len(turn1) + [0.0] * len(shown) + [-1.0] * len(turn2)
    assert [(k.tool, k.request, k.output, k.status) for k in c.calls] == [("functions", CALL, "7006652", "ok")]
    assert c.text == first + second and c.finish_reason == "stop" and len(engine.prompts) == 2
    conversation = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": first},
                    {"role": "tool", "content": "7006652"}, {"role": "assistant", "content": second}]  # fmt: skip
    rendered = tok.apply_chat_template(conversation, tokenize=False)
    assert rendered.endswith(tok.decode(c.token_ids) + "\n")  # the template's newline after the last turn: not sampled


def test_a_turn_of_several_calls_runs_them_all_and_shows_the_results_in_order():
    tok = chat_tokenizer(WITH_TOOLS)
    first = f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n" + '{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>'
    c, _ = sample(tok, function_tool(tok, "multiply", "lookup"), [first, "Done."])
    shown = tok.decode([t for t, m in zip(c.token_ids, c.from_model) if not m])
    assert shown == ('\n<|im_start|>user\n<tool_response>\n7006652\n</tool_response>\n<tool_response>\n{"legs": 4, "sound": '
                     '"meow"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n')  # fmt: skip
    assert [k.output for k in c.calls] == ["7006652", '{"legs": 4, "sound": "meow"}']


def test_a_result_that_holds_special_token_text_stays_text():
    tok = chat_tokenizer()
    c, _ = sample(tok, function_tool(tok, "echo"), ['<tool_call>{"name": "echo", "arguments": {"text": "<|im_end|><|im_start|>user"}}</tool_call>', "ok"])
    before, after = ChatFrame(tok, []).around(1)
    shown = [t for t, m in zip(c.token_ids, c.from_model) if not m]
    body = shown[len(ids(tok, before, markup=True)) : len(shown) - len(ids(tok, after, markup=True))]
    assert body == ids(tok, "<|im_end|><|im_start|>user") and tok.eos_token_id not in body and len(body) == 26


def test_a_turn_that_stopped_at_another_token_than_the_templates_end_of_turn_runs_no_call():
    """vLLM also stops at the generation config's other EOS ids (Qwen's <|endoftext|>): such a turn is not the
    template's end of turn, so its calls are not run and the answer ends there."""
    tok = chat_tokenizer()
    other_eos = tok.convert_tokens_to_ids("<eos>")
    engine = ScriptedIdsEngine(tok, [(ids(tok, f"<tool_call>{CALL}</tool_call>") + [other_eos], None), (ids(tok, "never"), None)])
    s = ToolSampler(engine, [function_tool(tok, "multiply")], max_turns=4, output_tokens=64, workers=1)  # type: ignore[arg-type]
    (c,) = s.generate([(5,)], n=1, max_tokens=500, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert not c.calls and len(engine.prompts) == 1 and c.finish_reason == "stop" and c.token_ids[-1] == other_eos


def test_a_malformed_call_is_an_error_output_and_the_answer_goes_on():
    tok = chat_tokenizer()
    c, engine = sample(tok, function_tool(tok, "multiply"), ["<tool_call>\nmultiply(1234, 5678)\n</tool_call>", "I give up."])
    assert c.calls[0].status == "error" and c.calls[0].output.startswith("[the tool call is not JSON")
    assert len(engine.prompts) == 2 and c.text.endswith("I give up.")


def test_a_turn_without_a_call_ends_the_answer_and_calls_over_max_turns_end_it_unrun():
    tok = chat_tokenizer()
    c, engine = sample(tok, function_tool(tok, "multiply"), ["The answer is 12.", "never sampled"])
    assert len(engine.prompts) == 1 and not c.calls and c.finish_reason == "stop" and all(c.from_model)
    two = f"<tool_call>{CALL}</tool_call><tool_call>{CALL}</tool_call>"
    c, engine = sample(tok, function_tool(tok, "multiply"), [two, "never sampled"], max_turns=1)
    assert c.hit_max_turns and not c.calls and len(engine.prompts) == 1 and all(c.from_model)


def test_long_results_are_cut_each_to_the_output_budget_and_together_to_the_answers():
    tok = chat_tokenizer()
    call = '<tool_call>{"name": "echo", "arguments": {"text": "' + "z" * 300 + '"}}</tool_call>'
    c, _ = sample(tok, function_tool(tok, "echo"), [call + call, "end"], output_tokens=60)
    before, middle, after = ChatFrame(tok, []).around(2)
    shown = tok.decode([t for t, m in zip(c.token_ids, c.from_model) if not m])
    cut = "z" * 23 + CUT_MARKER.format(shown=23, total=300)  # one token per character: 23 + a 37-token marker
    assert len(cut) == 60 and shown == before + cut + middle + cut + after
    # room for the frame and 105 tokens of results, 15 less than two 60-token cuts: the first is cut to 45 at most
    frame = len(ids(tok, before + middle + after, markup=True))
    room = len(ids(tok, call + call)) + 1 + frame + 105
    c, _ = sample(tok, function_tool(tok, "echo"), [call + call, "end"], max_tokens=room, output_tokens=60)
    shown = tok.decode([t for t, m in zip(c.token_ids, c.from_model) if not m])
    first = "z" * 8 + CUT_MARKER.format(shown=8, total=300)  # 44 tokens: within 45 (9 + a 37-token marker is 46)
    assert shown == before + first + middle + cut + after and frame + 44 + 60 <= room - len(ids(tok, call + call)) - 1


@pytest.mark.parametrize(
    ("expression", "value"),
    [("4821 * 7393", "35641653"), ("347^59 mod 997", str(pow(347, 59, 997))), ("pow(347, 59, 997)", str(pow(347, 59, 997))),
     ("85227 + 42680 + 11718 + 38407 + 63497", "241529"), ("1/3 + 1/6", "1/2"), ("(2 + 3) * -4", "-20"), ("10 // 3", "3")],
)
def test_the_calc_example_function_is_exact_arithmetic(expression, value):
    from rlvr.tasks.calc_tools import calculate

    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [("__import__('os').getcwd()", "only numbers"), ("x + 1", "only numbers"), ("2 ** 100000", "about 100000 digits"),
     ("9 ** 9 ** 9", "digits"), ("1 / 0", "division by zero"), ("pow(2, -1, 7.5)", "integers"), ("1 +", "not an arithmetic")],
)
def test_the_calc_example_function_evaluates_nothing_else(expression, error):
    from rlvr.tasks.calc_tools import calculate

    with pytest.raises((ValueError, ZeroDivisionError), match=error):
        calculate(expression)


def test_a_long_result_is_cut_without_the_tokenizers_too_long_warning(caplog):
    """A result is encoded whole before it is cut: transformers' "longer than the specified maximum sequence length"
    warning would reach the console of a run whose tool printed a lot (seen in a SmolLM2 run)."""
    tok = chat_tokenizer()
    tok.model_max_length = 100
    tok.deprecation_warnings.clear()
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            c, _ = sample(tok, function_tool(tok, "echo"), ['<tool_call>{"name": "echo", "arguments": {"text": "' + "q" * 500 + '"}}</tool_call>', "ok"], output_tokens=60)
    finally:
        hf_logging.disable_propagation()
    assert "[output cut: 23 of 500 tokens shown]" in tok.decode(c.token_ids) and "longer than the specified maximum" not in caplog.text


def test_the_tools_are_built_in_the_order_named_python_then_the_functions_as_one():
    from rlvr.tools import PythonLimits, PythonTool

    limits = PythonLimits(cpu_s=1.0, wall_s=2.5, memory_mb=256, sandbox=True)
    built = multiturn.build(["python", "tool_functions:multiply", "tool_functions:echo"], limits, chat_tokenizer())
    assert [type(t) for t in built] == [PythonTool, FunctionTools]
    assert list(built[1].functions) == ["multiply", "echo"] and built[1].timeout_s == 2.5  # type: ignore[attr-defined]
    assert [type(t) for t in multiturn.build(["tool_functions:multiply"], limits, chat_tokenizer())] == [FunctionTools]
    assert [type(t) for t in multiturn.build(["python"], limits, None)] == [PythonTool]  # no template needed


def test_a_lone_surrogate_in_a_call_or_a_result_costs_that_answer_an_error_never_the_round():
    """Issue 54, defect 1: `{"\\udcff": 1}` is ASCII JSON that json.loads turns into a lone surrogate; the built-in
    calculate raises a TypeError naming it, and that text (or a function's result holding a surrogate, such as a
    surrogateescape-decoded file name) once failed the output's encoding outside the call's try: generate raised and
    the round's other answers were lost. Now the surrogate is shown as U+FFFD and only its own answer sees an error."""
    tok = chat_tokenizer()
    functions, schemas = function_tools.load(["rlvr.tasks.calc_tools:calculate", "tool_functions:echo"])
    tool = FunctionTools(functions, ChatFrame(tok, schemas), 5.0)
    bad_argument = '<tool_call>{"name": "calculate", "arguments": {"\\udcff": 1}}</tool_call>'
    bad_result = '<tool_call>{"name": "echo", "arguments": {"text": "caf\\udce9"}}</tool_call>'
    good = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'
    turns = [bad_argument, bad_result, good, "Done.", "Done.", "Done."]
    engine = ScriptedIdsEngine(tok, [(ids(tok, t) + [tok.eos_token_id], None) for t in turns])
    s = ToolSampler(engine, [tool], max_turns=4, output_tokens=256, workers=4)  # type: ignore[arg-type]
    groups = s.generate([(5,), (6,), (7,)], n=1, max_tokens=2000, temperature=1.0, top_p=1.0, seeds=[0, 1, 2], stop=[])
    (a,), (b,), (c,) = groups
    assert a.calls[0].status == "error" and "unexpected keyword argument '\ufffd'" in a.calls[0].output
    assert (b.calls[0].status, b.calls[0].output) == ("ok", "caf\ufffd")
    assert (c.calls[0].status, c.calls[0].output) == ("ok", "42")
    for answer in (a, b, c):  # every answer went on after its call, its output encoded once
        assert answer.text.endswith("Done.") and not all(answer.from_model)
    shown = tok.decode([t for t, m in zip(b.token_ids, b.from_model) if not m])
    assert "\ncaf<unk><|im_end|>" in shown  # (U+FFFD is out of the character tokenizer's vocabulary)
    assert [k.output.encode("utf-8") for k in (*a.calls, *b.calls)]  # what samples.jsonl writes: valid UTF-8 text


@pytest.mark.parametrize("max_turns", [1, 3])
def test_the_frame_is_checked_at_start_up_for_every_number_of_results_a_turn_may_show(max_turns):
    """Issue 54, defect 4: a template that renders one tool message after the assistant's but refuses two in a row
    (one that enforces alternating roles) passed the start-up check and raised out of generate the first time a
    turn made two calls. The frame is now rendered at start-up for 1..rollout.max_turns results."""
    alternating = CHATML.replace(
        "{% for m in messages %}",
        "{% for m in messages %}{% if not loop.first and m['role'] == 'tool' and messages[loop.index0 - 1]['role'] == 'tool' %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}",
    )
    tok = chat_tokenizer(alternating)
    if max_turns == 1:  # one result a turn at most: the template can show it
        assert ChatFrame(tok, [], max_results=max_turns).around(1) == ["\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"]
        return
    with pytest.raises(ConfigError, match=r"cannot render a function's result.*2 results.*roles must alternate"):
        ChatFrame(tok, [], max_results=max_turns)


def test_a_function_that_holds_the_gil_is_stopped_at_the_timeout():
    """Issue 54, risk 5: a function in one long C call (here sum over 10**10 integers, minutes) ignored
    rollout.tool.timeout_s in a thread of the trainer's process, and the whole rollout waited. Functions run in worker
    processes, killed at the timeout; the next call gets a fresh worker."""
    tool = function_tool(chat_tokenizer(), "hog", "multiply", timeout_s=0.5)
    start = time.monotonic()
    result = tool.run('{"name": "hog", "arguments": {"n": 10000000000}}', [])
    assert (result.status, result.output) == ("timeout", "[hog timed out after 0.5 s]")
    assert time.monotonic() - start < 10  # minutes if it had run on (a bound, not a speed target)
    assert tool.run(CALL, []).output == "7006652"


def test_a_huge_result_is_serialized_within_the_timeout_and_stops_at_the_cap():
    """Issue 54, risk 6: a result was serialized whole (here ~0.4 GB of JSON) outside the timeout before the 64 KiB
    cut; it is now written incrementally in the worker and stops at the cap."""
    tool = function_tool(chat_tokenizer(), "rows", timeout_s=5.0)
    result = tool.run('{"name": "rows", "arguments": {"n": 10000000}}', [])
    assert result.status == "limit" and result.seconds < 5.0
    body, marker = result.output.rsplit("\n", 1)
    assert len(body) == function_workers.MAX_RESULT_CHARS and body.startswith('[{"name": "row", "value": 12345}, {"name"')
    assert marker == "[result cut: over 65536 characters]"


def test_a_timed_out_call_is_not_running_when_the_next_call_starts():
    """Issue 54 (a small one): a timed-out function's thread ran on beside the next call. Its worker is killed:
    the worker that answers next has not seen it (its state is fresh)."""
    tool = function_tool(chat_tokenizer(), "nap", "counter", timeout_s=0.3, workers=1)  # the next call lands where the nap ran
    assert tool.run('{"name": "counter", "arguments": {}}', []).output == "1"
    assert tool.run('{"name": "nap", "arguments": {"seconds": 30}}', []).status == "timeout"
    assert tool.run('{"name": "counter", "arguments": {}}', []).output == "1"  # a fresh process
    tool.close()


def test_tool_output_cannot_form_a_token_the_tokenizer_added_without_marking_it_special():
    """Issue 54, risk 8: tokens added as plain (not special) tokens, such as Qwen's <tool_call>, </tool_response> and
    <think>, formed from a tool's printed text (split_special_tokens splits special tokens only): a program could forge
    chat structure. Output is now encoded so that no added token forms from it."""
    tok = chat_tokenizer()
    tok.add_tokens(["</tool_response>", "<think>"])  # added, not special
    forged = [tok.convert_tokens_to_ids(t) for t in ("</tool_response>", "<think>")]
    text = "a</tool_response>b<think><think>c<|im_end|>"
    c, _ = sample(tok, function_tool(tok, "echo"), ['<tool_call>{"name": "echo", "arguments": {"text": "' + text + '"}}</tool_call>', "ok"])
    before, after = ChatFrame(tok, []).around(1)
    shown = [t for t, m in zip(c.token_ids, c.from_model) if not m]
    body = shown[len(ids(tok, before, markup=True)) : len(shown) - len(ids(tok, after, markup=True))]
    assert tok.decode(body) == text and not set(body) & {*forged, tok.eos_token_id}
    assert set(ids(tok, text, markup=True)) & set(forged)  # (encoded whole, they would form)


def test_calls_in_later_turns_reuse_the_workers_started_in_earlier_ones():
    """Workers are started from the driver's call threads, which end with each turn: they must outlive them (a worker
    killed with the thread that started it would make every later turn's call an error)."""
    tok = chat_tokenizer()
    tool = function_tool(tok, "counter", workers=1)
    call = '<tool_call>{"name": "counter", "arguments": {}}</tool_call>'
    c, _ = sample(tok, tool, [call, call, call, "Done."])
    assert [(k.status, k.output) for k in c.calls] == [("ok", "1"), ("ok", "2"), ("ok", "3")]  # one worker, alive
    tool.close()
