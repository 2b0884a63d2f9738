"""The code verifier: where the program is read, the test record, how asserts become reports, how outputs compare,
the verdict of each kind of test and failure, partial credit, and its place in the reward pipeline (config, metrics,
the sandbox refusal). Hostile programs are tests/test_code_hostile.py's."""

from __future__ import annotations

import json
import re

import pytest
from conftest import compose_config, requires_sandbox

from rlvr.config import ConfigError, VerifierName, validate
from rlvr.rewards import Rewarder
from rlvr.types import Completion
from rlvr.verifiers import Outcome
from rlvr.verifiers.code import sandbox
from rlvr.verifiers.code import verifier as code


def fenced(program: str, label: str = "python") -> str:
    return f"Here is my solution.\n```{label}\n{program}\n```\nIt works."


def record(*tests: dict, **extra) -> str:
    return json.dumps({"tests": list(tests), **extra})


# serial: the sandbox's verdicts under limits of seconds are checked with no second test worker beside them (make test)
pytestmark = [requires_sandbox, pytest.mark.serial]

ADD = record({"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(2, 2) == 4"},
             {"assert": "assert abs(add(0.1, 0.2) - 0.3) < 1e-9"})  # fmt: skip


# --- where the program is --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, program", [
    ("```python\nx = 1\n```", "x = 1"),
    ("```py\nx = 1\n```", "x = 1"),
    ("```Python3\nx = 1\n```", "x = 1"),
    ("```\nx = 1\n```", "x = 1"),
    ("```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2"),  # the last block
    ("```python\nx = 1\n```\n```text\noutput: 1\n```", "x = 1"),  # the last *Python* block
    ("```python\nx = 1\n```\n```python\nx = 2", "x = 1"),  # an unclosed block (cut off) is not a program
    ("  ```python\n  def f():\n      return 1\n  ```", "  def f():\n      return 1"),  # indented fences
    ("```bash\nls\n```", None),
    ("x = 1", None),
])  # fmt: skip
def test_the_program_is_the_last_complete_python_block(text, program):
    assert code.extract_program(text) == program


def test_no_code_block_is_no_answer_without_running_anything():
    assert code.judge("def add(a, b): return a + b", ADD) == (Outcome.NO_ANSWER, 0.0, "no_code", 0)


# --- the record -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, says", [("not json", "not JSON"), ('{"tests": []}', "non-empty list"),
                                       ('{"tests": [{"assert": "x = 1"}]}', "no assert statement")])  # fmt: skip
def test_a_bad_record_is_a_dataset_error_not_a_verdict(bad, says):
    """(Each way a record can be wrong: tests/test_code_tasks.py, which tests rlvr.verifiers.code.record.)"""
    with pytest.raises(ValueError, match=says):
        code.judge(fenced("x = 1"), bad)


# --- asserts become reports -------------------------------------------------------------------------------------------


def test_an_assert_against_a_literal_is_a_value_site_whose_literal_stays_outside():
    source, expected = code.rewrite({"assert": "assert add(1, 2) == 123456789"})
    assert "123456789" not in source  # the sandbox never sees the expected value
    assert source == "__rlvr_value__(0, add(1, 2))"
    assert expected == [(True, 123456789)]


def test_a_literal_on_the_left_works_too_and_other_asserts_are_strict_truth_sites():
    source, expected = code.rewrite({"assert": "assert [1, (2, 3)] == f(x)\nassert f(1) != g(2)\nassert f(0)"})
    assert source.splitlines() == ["__rlvr_value__(0, f(x))", "__rlvr_truth__(1, __rlvr_ne__(f(1), g(2)))",
                                   "__rlvr_truth__(2, f(0))"]  # fmt: skip
    assert expected == [(True, [1, (2, 3)]), (False, None), (False, None)]


def test_asserts_in_check_and_its_loops_are_sites_and_each_must_be_reached():
    check = "def check(candidate):\n    assert candidate(1) == 2\n    for i in range(3):\n        assert candidate(i) == i + 1\n    assert candidate(0) == 1\n"
    source, expected = code.rewrite({"check": check, "entry_point": "inc"})
    assert source.endswith("check(inc)\n")
    assert [e[0] for e in expected] == [True, False, True]  # `i + 1` is not a literal: a truth site
    answer = record({"check": check, "entry_point": "inc"})
    assert code.judge(fenced("def inc(x):\n    return x + 1"), answer).outcome is Outcome.CORRECT
    branch = record({"assert": "if False:\n    assert inc(1) == 5\nassert inc(1) == 2"})  # a site never reached
    assert code.judge(fenced("def inc(x):\n    return x + 1"), branch).detail == "wrong_answer"


def test_the_program_cannot_trace_or_reach_into_the_harness():
    answer = record({"assert": "assert ok() == 1"})
    for attack in ("import sys\nsys.settrace(lambda *a: None)", "import gc\ngc.get_objects()",
                   "import ctypes", "def g(): pass\ng.__code__ = (lambda: 1).__code__"):  # fmt: skip
        program = f"def ok():\n    return 1\n{attack}"
        assert code.judge(fenced(program), answer).detail == "runtime_error", attack


def test_tests_use_the_programs_objects_as_before_though_they_live_in_its_process():
    """The judge runs the tests apart from the program: the program's classes, objects, generators, in-place changes,
    imports, exceptions and keyword arguments still behave for the tests as in one process."""
    program = """
import math
from collections import Counter
class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def __str__(self):
        return f"({self.a}, {self.b})"
    def __eq__(self, other):
        return isinstance(other, Pair) and (self.a, self.b) == (other.a, other.b)
def longest_chain(pairs):
    pairs = sorted(pairs, key=lambda p: p.b)
    end, n = -math.inf, 0
    for p in pairs:
        if p.a > end:
            end, n = p.b, n + 1
    return n
def sort_in_place(xs):
    xs.sort()
def squares(n):
    for i in range(n):
        yield i * i
def divide(a, b):
    if b == 0:
        raise ZeroDivisionError("b is 0")
    return a / b
def power(base, exp=2):
    return base ** exp
def letters(word):
    return Counter(word)
LIMIT = 10 ** 9 + 7
"""
    tests = [
        "assert longest_chain([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)]) == 3",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5",
        "assert str(Pair(1, 2)) == '(1, 2)' and Pair(1, 2) == Pair(1, 2) and Pair(1, 2) != Pair(2, 1)",
        "try:\n    divide(1, 0)\n    raised = ''\nexcept ZeroDivisionError as e:\n    raised = str(e)\nassert raised == 'b is 0'",
        "assert power(base=2, exp=10) == 1024 and power(3) == 9",
        "assert math.isclose(divide(1, 3) * 3, 1.0) and LIMIT % 7 == 1000000007 % 7",
        "assert letters('aab')['a'] == 2 and 'b' in letters('ab') and len(letters('abc')) == 3",
    ]
    answer = record(*({"assert": t} for t in tests))
    assert code.judge(fenced(program), answer)[:3] == (Outcome.CORRECT, 1.0, "passed")
    wrong = program.replace("xs.sort()", "xs.reverse()").replace("yield i * i", "yield i")
    assert code.judge(fenced(wrong), answer)[:3] == (Outcome.INCORRECT, 0.75, "wrong_answer")


def test_a_call_test_reports_the_return_value_of_the_function_or_solution_method():
    source, expected = code.rewrite({"call": "f", "args": [[1, 2], "a", None, True], "expected": 3})
    assert source == "__rlvr_value__(0, (f if 'f' in globals() else Solution().f)(*[[1, 2], 'a', None, True]))"
    assert expected == [(True, 3)]


@pytest.mark.parametrize("value", [0, -(10**50), 1.5, -0.0, float("inf"), 1 + 2j, "é\n\"\\", "\ud800", b"\xff", None,
                                   True, [1, [2]], (1, "a"), {1, 2}, frozenset({3}), {"k": [1.0, None]}, ()])  # fmt: skip
def test_the_strict_encoding_round_trips_built_in_values(value):
    from rlvr.verifiers.code import harness as code_runner

    encoded = json.loads(code_runner.to_json(code_runner.encode(value)))
    decoded = code.decode(encoded)
    assert decoded == value and type(decoded) is type(value)


def test_values_of_other_types_have_no_encoding():
    from rlvr.verifiers.code import harness as code_runner

    class Anything:
        def __eq__(self, other):
            return True

    class MyInt(int):
        pass

    assert code_runner.encode(Anything()) is None
    assert code_runner.encode(MyInt(3)) is None
    assert code_runner.encode([1, Anything()]) is None
    assert code_runner.strict_eq(Anything(), 3) is False and code_runner.strict_eq(3, 3.0) is True
    assert code_runner.truth(Anything()) is False and code_runner.truth([0]) is True


@pytest.mark.parametrize("forged", [["x"], ["i"], ["i", 5], ["l", [["q", 1]]], ["d", [[["i", "1"]]]], "s", [], 7])
def test_a_malformed_report_is_refused(forged):
    with pytest.raises(ValueError):
        code.decode(forged)


# --- outputs ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("got, expected, tol, same", [
    ("3\n", "3", 0, True),
    ("3  \n\n\n", "3\n", 0, True),
    ("1 2\n3\n", "1 2\n3", 0, True),
    ("1  2\n", "1 2\n", 0, False),  # inner whitespace counts without a float tolerance
    ("\n3\n", "3\n", 0, False),  # leading blank lines count
    ("3.0000001\n", "3", 1e-6, True),
    ("3.01\n", "3", 1e-6, False),
    ("1e9 x\n", "1000000001 x", 1e-6, True),  # relative
    ("nan\n", "nan", 1e-6, True),  # the same token
    ("inf\n", "1e308", 1e-6, False),
    ("1 2", "1 2 3", 1e-6, False),
])  # fmt: skip
def test_outputs_compare_as_judges_do(got, expected, tol, same):
    assert code.same_output(got, expected, tol) is same


# --- verdicts ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("program, outcome, share, detail", [
    ("def add(a, b):\n    return a + b", Outcome.CORRECT, 1.0, "passed"),
    ("def add(a, b):\n    return 3", Outcome.INCORRECT, 1 / 3, "wrong_answer"),
    ("def add(a, b):\n    return a - b", Outcome.INCORRECT, 0.0, "wrong_answer"),
    ("def add(a, b)\n    return a + b", Outcome.INCORRECT, 0.0, "compile_error"),
    ("import nothing_here\ndef add(a, b):\n    return a + b", Outcome.INCORRECT, 0.0, "runtime_error"),
    ("def add(a, b):\n    return a + b\nraise SystemExit(0)", Outcome.INCORRECT, 0.0, "runtime_error"),
    ("def add(a, b):\n    return [0] * 10**10", Outcome.INCORRECT, 0.0, "memory_limit"),
    ("def add(a, b):\n    return a + b if a < 2 else 1 / 0", Outcome.INCORRECT, 2 / 3, "runtime_error"),
])  # fmt: skip
def test_function_tests_give_the_outcome_share_and_detail(program, outcome, share, detail):
    verdict = code.judge(fenced(program), ADD)
    assert (verdict.outcome, verdict.detail) == (outcome, detail)
    assert verdict.score == pytest.approx(share)


def test_a_program_that_runs_past_its_time_is_a_timeout_and_the_wall_clock_bounds_it():
    import time

    start = time.monotonic()
    verdict = code.judge(fenced("def add(a, b):\n    while True:\n        pass"), ADD, time_limit_s=0.3, max_wall_s=1.0)
    assert (verdict.outcome, verdict.detail) == (Outcome.INCORRECT, "timeout")
    assert time.monotonic() - start < 1.0 + 1.0  # the wall-clock kill, plus the sandbox's start and teardown


def test_humaneval_style_check_calls_check_with_the_entry_point():
    check = ("def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"
             "    assert abs(candidate([0.5, 0.25]) - 0.75) < 1e-9\n")  # fmt: skip
    answer = record({"check": check, "entry_point": "total"}, setup="from typing import List")
    good = "def total(xs: List[float]) -> float:\n    return sum(xs)"
    assert code.judge(fenced(good), answer) == (Outcome.CORRECT, 1.0, "passed", 1)
    assert code.judge(fenced("def total(xs):\n    return len(xs)"), answer).outcome is Outcome.INCORRECT
    assert code.judge(fenced("def summe(xs):\n    return sum(xs)"), answer).detail == "runtime_error"  # NameError


def test_stdin_stdout_cases_run_each_in_its_own_process():
    answer = record({"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 6\n", "stdout": "11"},
                    {"stdin": "", "stdout": "fresh\n"})  # fmt: skip
    # a module-level counter would carry over if cases shared a process
    program = ("import sys\nseen = []\ndata = sys.stdin.read().split()\nseen.append(1)\n"
               "print(sum(map(int, data)) if data else ('fresh' if len(seen) == 1 else 'reused'))")  # fmt: skip
    assert code.judge(fenced(program), answer) == (Outcome.CORRECT, 1.0, "passed", 0)
    wrong = code.judge(fenced("print(3)"), answer)
    assert (wrong.outcome, wrong.detail, wrong.score) == (Outcome.INCORRECT, "wrong_answer", pytest.approx(1 / 3))
    assert code.judge(fenced("print(1/0)"), answer).detail == "runtime_error"
    assert code.judge(fenced("print(("), answer).detail == "compile_error"


def test_stdio_exit_status_zero_by_sys_exit_is_fine_and_nonzero_is_a_runtime_error():
    answer = record({"stdin": "2\n", "stdout": "4\n"})
    assert code.judge(fenced("print(int(input()) * 2)\nimport sys\nsys.exit(0)"), answer).outcome is Outcome.CORRECT
    assert code.judge(fenced("print(int(input()) * 2)\nimport sys\nsys.exit(3)"), answer).detail == "runtime_error"


def test_float_tolerance_applies_to_stdio_outputs():
    answer = record({"stdin": "", "stdout": "0.3333333\n"}, float_tol=1e-6)
    assert code.judge(fenced("print(1 / 3)"), answer).outcome is Outcome.CORRECT
    assert code.judge(fenced("print(0.334)"), answer).outcome is Outcome.INCORRECT


def test_call_tests_compare_tuples_as_lists_and_find_solution_methods():
    answer = record({"call": "swap", "args": [[1, 2]], "expected": [2, 1]})
    assert code.judge(fenced("def swap(p):\n    return (p[1], p[0])"), answer).outcome is Outcome.CORRECT
    assert code.judge(fenced("class Solution:\n    def swap(self, p):\n        return p[::-1]"), answer).outcome is Outcome.CORRECT
    assert code.judge(fenced("def swap(p):\n    return p"), answer).outcome is Outcome.INCORRECT


def test_setup_runs_before_the_program_in_its_namespace():
    answer = record({"assert": "assert area(2) == 4 * PI_ISH"}, setup="PI_ISH = 3")
    assert code.judge(fenced("def area(r):\n    return r * r * PI_ISH"), answer).outcome is Outcome.CORRECT


def test_mixed_function_and_stdio_tests_all_count():
    answer = record({"assert": "assert twice(2) == 4"}, {"stdin": "3\n", "stdout": "6\n"})
    program = "def twice(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(twice(int(input())))"
    assert code.judge(fenced(program), answer).outcome is Outcome.CORRECT
    half = code.judge(fenced("def twice(x):\n    return 2 * x"), answer)  # prints nothing on stdin
    assert (half.outcome, half.score) == (Outcome.INCORRECT, 0.5)


def test_verify_and_score_are_the_verdicts_outcome_and_share():
    program = fenced("def add(a, b):\n    return 3")
    assert code.verify(program, ADD) is Outcome.INCORRECT
    assert code.score(program, ADD) == pytest.approx(1 / 3)


def test_the_gold_check_runs_the_records_solution():
    assert code.check_gold(record({"assert": "assert f() == 1"}, solution="def f():\n    return 1")) is Outcome.CORRECT
    assert code.check_gold(record({"assert": "assert f() == 1"}, solution="def f():\n    return 2")) is Outcome.INCORRECT
    assert code.check_gold(record({"assert": "assert f() == 1"})) is None  # nothing to check


# --- the reward pipeline ----------------------------------------------------------------------------------------------


def make_cfg(*overrides: str):
    return validate(compose_config(*overrides))


def completion(text: str) -> Completion:
    return Completion(prompt_ids=[1], token_ids=[5, 6], text=text, finish_reason="stop", engine_logprobs=[0.0, 0.0])


def test_rewarder_scores_code_and_counts_each_detail():
    cfg = make_cfg("reward.verifier=code", "reward.workers=1", "reward.incorrect=-1.0", "reward.no_answer=-2.0")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    try:
        texts = [fenced("def add(a, b):\n    return a + b"), fenced("def add(a, b)\n"), "no code", fenced("def add(a, b): return 3")]
        rewards, correct, m, results, _ = rewarder.score([completion(t) for t in texts], [ADD] * 4)
    finally:
        rewarder.close()
    assert rewards.tolist() == [1.0, -1.0, -2.0, -1.0]
    assert correct.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert results == [Outcome.CORRECT, Outcome.INCORRECT, Outcome.NO_ANSWER, Outcome.INCORRECT]
    assert {k: v for k, v in m.items() if k.startswith("reward/detail/") and v} == {
        "reward/detail/passed": 0.25, "reward/detail/compile_error": 0.25, "reward/detail/no_code": 0.25,
        "reward/detail/wrong_answer": 0.25, "reward/detail/inner_checks": 2.0}  # fmt: skip
    assert set(code.DETAILS) <= {k.removeprefix("reward/detail/") for k in m}


def test_evaluation_splits_eval_by_the_code_verifiers_details():
    """rlvr eval and training's evaluations (rlvr.evaluation) count each detail, as training steps count reward/detail."""
    from rlvr.evaluation import evaluate
    from rlvr.types import Example

    programs = {0: "def add(a, b):\n    return a + b", 1: "def add(a, b)\n", 2: "def add(a, b):\n    while True: pass"}

    class Engine:  # prompt i answers programs[i % 3] greedily; sampled answers: the right program, then no code
        class tokenizer:  # noqa: N801 (the engine's attribute)
            @staticmethod
            def decode(ids, skip_special_tokens=False):
                return ""

        def greedy(self, prompts, *, max_tokens, stop):
            return [completion(fenced(programs[p[0] % 3])) for p in prompts]

        def generate(self, prompts, *, n, max_tokens, temperature, top_p, seeds, stop):
            return [[completion(fenced(programs[0])), completion("no code")] for _ in prompts]

    cfg = make_cfg("reward.verifier=code", "reward.workers=1", "eval.n=2", "reward.timeout_s=4",
                   "reward.code.time_limit_s=0.5")  # fmt: skip
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    examples = [Example(id=str(i), prompt="", answer=ADD, prompt_ids=(i,)) for i in range(6)]
    try:
        metrics, _ = evaluate(Engine(), examples, rewarder, cfg, None)
    finally:
        rewarder.close()
    third, half = pytest.approx(1 / 3), pytest.approx(0.5)
    assert {k: v for k, v in metrics.items() if "detail/" in k and v} == {
        "eval/detail/passed": third, "eval/detail/compile_error": third, "eval/detail/timeout": third,
        "eval/sampled_detail/passed": half, "eval/sampled_detail/no_code": half}  # fmt: skip
    assert {f"eval/detail/{d}" for d in code.DETAILS} <= set(metrics) and metrics["eval/accuracy"] == third


def test_partial_credit_is_the_share_of_tests_passed():
    cfg = make_cfg("reward.verifier=code", "reward.workers=0", "reward.partial=true")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    rewards, correct, _, _, _ = rewarder.score([completion(fenced("def add(a, b): return 3")),
                                             completion(fenced("def add(a, b): return a + b"))], [ADD, ADD])  # fmt: skip
    assert rewards.tolist() == pytest.approx([1 / 3, 1.0]) and correct.tolist() == [0.0, 1.0]


def test_without_bubblewrap_the_code_verifier_refuses_to_start_naming_the_package(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    cfg = make_cfg("reward.verifier=code", "reward.workers=0")
    with pytest.raises(ConfigError, match=r"bubblewrap.*apt-get install bubblewrap.*reward.code.sandbox=none"):
        Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)


def test_sandbox_none_runs_without_bubblewrap_and_warns(monkeypatch, capsys):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    cfg = make_cfg("reward.verifier=code", "reward.workers=0", "reward.code.sandbox=none")
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=VerifierName.arithmetic)
    assert "WITHOUT a sandbox" in capsys.readouterr().err
    assert rewarder.judge([fenced("def add(a, b):\n    return a + b")], [ADD]) == ([Outcome.CORRECT], ["passed"])


@pytest.mark.parametrize("override, says", [
    ("reward.code.time_limit_s=6", "below reward.timeout_s"),
    ("reward.code.time_limit_s=0", "must be > 0"),
    ("reward.code.memory_mb=10", "memory_mb >= 64"),
    ("reward.code.sandbox=docker", "sandbox"),
])  # fmt: skip
def test_code_limits_are_checked_at_start_up(override, says):
    with pytest.raises(ConfigError, match=None) as e:
        make_cfg("reward.verifier=code", override)
    assert says in str(e.value)


def test_the_gold_check_runs_the_functions_tasks_reference_solutions_in_the_sandbox():
    from rlvr import gold
    from rlvr.data import load_task

    cfg = make_cfg("data=code", "data.size=200", "data.eval_size=20", "reward.workers=0")
    train, held_out, verifier = load_task(cfg.data)
    rewarder = Rewarder(cfg.reward, cfg.algo, max_len=8, task_verifier=verifier)
    note = gold.startup_note(train + held_out, rewarder.gold_check(), 0.99, seed=0, **rewarder.gold_options)
    assert verifier is VerifierName.code and rewarder.gold_options == {"cap": 256, "threads": 4}
    assert note == "gold answers 100.0% readable" + ("" if len(train) + 20 <= 256 else " (a sample of 256)")


@pytest.mark.slow
@pytest.mark.real
def test_rlvr_train_runs_the_code_task_end_to_end(tmp_path, rlvr_cli):
    """SmolLM2 through the CLI on data=code: the gold check runs the task's reference solutions in the sandbox, the
    pool judges real programs, every detail reaches metrics.jsonl."""
    out = tmp_path / "run"
    result = rlvr_cli("train", "recipe=grpo", "model=smollm2_135m", "data=code", "data.size=64", "data.eval_size=4",
                      "trainer.max_steps=1", "algo.prompts_per_step=2", "algo.prompts_per_minibatch=2",
                      "rollout.max_new_tokens=96", "logger.progress=false", f"trainer.output_dir={out}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"code functions: \d+ training prompts, 4 held out; gold answers 100\.0% readable", result.stdout)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and "reward/detail/passed" in r)
    shares = [step[f"reward/detail/{d}"] for d in code.DETAILS]
    assert sum(shares) == pytest.approx(1.0) and step["reward/detail/sandbox_error"] == 0.0
