"""The python tool (rlvr.tools) in the real sandbox, hostile calls included; the tool task (rlvr.tasks.calc); the
start-up check of the tool's sandbox; special-token text in an output stays text."""

from __future__ import annotations

import pytest
from conftest import compose_config, requires_sandbox

from rlvr import tools
from rlvr.config import ConfigError, validate
from rlvr.multiturn import ToolSampler
from rlvr.tasks import calc
from rlvr.types import ToolCall
from rlvr.verifiers import code as sandbox  # the code verifier's front, as rlvr.tools uses it
from rlvr.verifiers import math as math_verifier

# a generous wall clock (a call takes ~0.1 s quiet; a loaded machine once took a trivial call past 4 s), a short CPU limit
LIMITS = tools.PythonLimits(cpu_s=1.0, wall_s=15.0, memory_mb=256, sandbox=True)
SHORT_WALL = tools.PythonLimits(cpu_s=1.0, wall_s=3.0, memory_mb=256, sandbox=True)  # the sleeping call's limit


@pytest.fixture(scope="module")
def python() -> tools.PythonTool:
    return tools.PythonTool(LIMITS)


@requires_sandbox
def test_cells_share_state_and_show_the_last_expression(python):
    earlier = [ToolCall("python", cell, "", "ok", 0.1) for cell in ("x = 4821 * 7393\nprint('earlier output is not shown')", "import math")]
    result = python.run("y = x * 3\ny", earlier)
    assert (result.output, result.status) == ("106924959\n", "ok")
    assert python.run("print(1)\nNone", []).output == "1\n"  # None is not shown, as in a notebook


@requires_sandbox
def test_an_error_shows_the_cells_traceback_only(python):
    result = python.run("def f(n):\n    return 1 / n\nf(0)", [ToolCall("python", "raise ValueError('an earlier error is skipped')", "", "error", 0.1)])
    assert result.status == "error"
    assert result.output.startswith("Traceback (most recent call last):\n  File \"<cell 2>\", line 3")
    assert result.output.rstrip().endswith("ZeroDivisionError: division by zero") and "rlvr" not in result.output
    syntax = python.run("def f(:", [])
    assert syntax.status == "error" and "SyntaxError" in syntax.output


@requires_sandbox
@pytest.mark.parametrize(
    "code, status, shown",
    [
        ("while True:\n    pass", "timeout", "[timed out"),  # never returns: the CPU limit ends it
        ("import time\ntime.sleep(60)", "timeout", "[timed out"),  # sleeps: the wall clock ends it (SHORT_WALL)
        ("while True:\n    print('x' * 1000)", "limit", "[output cut"),  # floods its output
        ("import os\nos.fork()", "error", "PermissionError"),  # forks: refused by the seccomp filter
        ("x = bytearray(10**9)", "limit", "MemoryError"),  # over its address space
        ("open('/etc/passwd').read()", "error", "FileNotFoundError"),  # host files are not there
        ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", "error", "Error"),  # no network
        ("for i in range(64):\n    open(f'/tmp/f{i}', 'w').write('x' * (1 << 20))", "error", "No space left"),  # fills /tmp
        ("f = open('/tmp/big', 'w')\nfor i in range(64):\n    f.write('x' * (1 << 20))", "error", "File too large"),
    ],
)
def test_hostile_calls_are_contained_and_the_answer_goes_on(python, code, status, shown):
    tool = tools.PythonTool(SHORT_WALL) if "sleep" in code else python
    result = tool.run(code, [])
    assert result.status == status, result
    assert shown in result.output, result.output
    assert result.seconds < tool.limits.wall_s + 3


@requires_sandbox
def test_the_tool_runs_the_standard_library_only(python):
    assert "ModuleNotFoundError" in python.run("import torch", []).output
    assert python.run("import fractions, itertools\nfractions.Fraction(1, 3) + 1", []).output == "Fraction(4, 3)\n"


def test_a_missing_sandbox_is_a_config_error_before_any_model_loads(monkeypatch):
    def broken() -> None:
        raise sandbox.SandboxError("bubblewrap (bwrap) is not installed")

    monkeypatch.setattr(sandbox, "check_sandbox", broken)
    with pytest.raises(ConfigError, match=r"rollout.tools=\[python\] needs a working sandbox.*rollout.tool.sandbox=none"):
        tools.check(["python"], sandboxed=True)
    tools.check([], sandboxed=True)  # no tools: nothing to check
    tools.check(["python"], sandboxed=False)  # rollout.tool.sandbox=none: warned, not refused


def test_tool_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"rollout.tools: unknown tool 'bash'.*\['python'\]"):
        validate(compose_config("rollout.tools=[bash]"))
    with pytest.raises(ConfigError, match="rollout.max_turns"):
        validate(compose_config("rollout.tools=[python]", "rollout.max_turns=0"))
    assert validate(compose_config("rollout.max_turns=0")).rollout.tools == []  # without tools it is not read


def test_special_token_text_in_an_output_stays_text():
    """A program that prints the end-of-turn token's text cannot end the answer or forge chat structure: the output is
    encoded with special tokens split into plain text."""
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-arith"))

    class Holder:
        tokenizer = tok

    sampler = ToolSampler(Holder(), [], max_turns=1, output_tokens=64, workers=1)  # type: ignore[arg-type]
    ids = sampler._encode("12<eos>3")
    assert tok.eos_token_id not in ids and tok.decode(ids) == "12<eos>3"


def test_the_tool_task_is_seeded_held_out_and_exact():
    train, held_out = calc.examples(size=300, eval_size=50, seed=3, options=None)
    again, _ = calc.examples(size=300, eval_size=50, seed=3, options=None)
    assert train == again and len(held_out) == 50
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}
    for e in train[:30] + held_out:
        question = e.prompt.removeprefix("What is ").removesuffix("?")
        if " mod " in question:
            (base, exponent), modulus = question.split(" mod ")[0].split("^"), question.split(" mod ")[1]
            assert int(e.answer) == pow(int(base), int(exponent), int(modulus))
        else:  # products and sums, checked as Python reads them (the task's own arithmetic is exact integers)
            assert int(e.answer) == eval(question, {"__builtins__": {}})  # noqa: S307 (our own generated digits)
        assert math_verifier.verify(f"so \\boxed{{{e.answer}}}", e.answer).value == "correct"
    kinds = {e.prompt.count("+"), " mod " in e.prompt}
    assert len(kinds) >= 2
    small, _ = calc.examples(size=10, eval_size=5, seed=0, options={"digits": 2, "kinds": ["product"]})
    assert all(len(e.prompt.split()[2]) == 2 and "*" in e.prompt for e in small)


def test_the_tool_task_names_bad_options():
    with pytest.raises(ConfigError, match="data.options.digits"):
        calc.examples(size=10, eval_size=5, seed=0, options={"digits": 9})
    with pytest.raises(ConfigError, match="unknown option"):
        calc.examples(size=10, eval_size=5, seed=0, options={"digit": 3})
    with pytest.raises(ConfigError, match="data.options.kinds"):
        calc.examples(size=10, eval_size=5, seed=0, options={"kinds": ["division"]})


def _answer(limits: tools.PythonLimits, *cells: str):
    """One answer whose k-th turn is the python block `cells[k]` (then "Done."), run through the driver with the real
    python tool in the real sandbox: the calls' (status, output), in order."""
    from test_multiturn import FakeEngine

    turns = [f"```python\n{cell}\n```\n" for cell in cells] + ["Done."]
    engine = FakeEngine(lambda prompt, seed: turns[min(prompt.count("```output"), len(turns) - 1)])
    s = ToolSampler(engine, [tools.PythonTool(limits)], max_turns=len(cells), output_tokens=4096, workers=1)  # type: ignore[arg-type]
    (c,) = s.generate([(81,)], n=1, max_tokens=20000, temperature=1.0, top_p=1.0, seeds=[0], stop=[])[0]
    assert c.text.endswith("Done."), c.text
    return [(k.status, k.output) for k in c.calls]


@requires_sandbox
def test_a_cell_cut_for_flooding_its_output_does_not_stop_the_answers_later_calls():
    """Issue 54, defect 2: earlier cells were re-run whatever their status; a flood, cut after ~0.1 s by the output cap
    the first time, spun to the CPU limit on its silenced re-run, so `print(6*7)` and every later call timed out."""
    calls = _answer(LIMITS, "while True:\n    print('flood')", "print(6*7)", "print(7*8)")
    assert calls[0][0] == "limit" and "[output cut" in calls[0][1]
    assert calls[1:] == [("ok", "42\n"), ("ok", "56\n")]


@requires_sandbox
def test_a_cell_that_timed_out_or_spent_most_of_its_cpu_does_not_stop_the_answers_later_calls():
    """Issue 54, defect 2: a call's CPU limit covered its re-run cells, so two cells of 0.6 CPU seconds each under a
    1-second limit made the second (and every later call) time out. Each re-run cell now brings its own allowance; a
    cell that timed out is not re-run (the interpreter restarts, and says so)."""
    burn = "import time\n_t = time.process_time()\nwhile time.process_time() - _t < 0.6:\n    pass\nx = {}"
    calls = _answer(LIMITS, burn.format(1), burn.format(2), "print(x + 4)")
    assert calls == [("ok", ""), ("ok", ""), ("ok", "6\n")], calls
    calls = _answer(LIMITS, "x = 1", "while True:\n    pass", "print('x' in globals())")
    assert [s for s, _ in calls] == ["ok", "timeout", "ok"] and "the interpreter restarts" in calls[1][1]
    assert calls[2][1] == "False\n"  # after a timeout: a fresh interpreter


@requires_sandbox
def test_re_run_cells_draw_the_same_random_numbers_and_an_exit_is_said():
    """Issue 54, risk 7: a cell that drew random numbers showed one value and the next cell saw another; an interpreter
    that an earlier cell ended (os._exit) made every later call return '' with status ok. Now `random` is seeded per
    call (the same stream on every re-run) and a cell that ends the interpreter says so; later cells start afresh."""
    calls = _answer(LIMITS, "import random\nx = random.random()\nx", "print(x)", "import os\nos._exit(0)", "print(6*7)",
                    "print('x' in globals())")
    shown = calls[0][1].strip()
    assert calls[0][0] == "ok" and calls[1] == ("ok", shown + "\n")
    assert calls[2][0] == "error" and "the interpreter exited" in calls[2][1]
    assert calls[3:] == [("ok", "42\n"), ("ok", "False\n")]  # a fresh interpreter: the exit's earlier state is gone
