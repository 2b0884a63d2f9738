"""Verifier for code: run the completion's program against the row's tests in a sandbox (sandbox.py beside this file).
(~360 lines, one job: the verifier's side of the sandbox, reading the program and the record in, a Verdict out.)

The program is the completion's last complete fenced code block labelled ```python, ```py, ```python3 or unlabelled;
a completion without one has NO_ANSWER. The answer is the row's test record, JSON (writable by hand)::

    {"tests": [TEST, ...],          required, 1 to MAX_TESTS
     "setup": "import math",        optional: run before the program, in its namespace (MBPP's test_setup_code)
     "solution": "def f(x): ...",   optional: a reference solution; the start-up gold check runs it
     "float_tol": 1e-6}             optional: stdin/stdout outputs compared token by token as floats within this

    TEST is one of
    {"assert": "assert f(2) == 4"}                                    statements run after the program (MBPP)
    {"check": "def check(candidate): ...", "entry_point": "f"}        check(f) is called (HumanEval)
    {"stdin": "1 2\\n", "stdout": "3\\n"}                               the program's stdout for this input (APPS, TACO)
    {"call": "f", "args": [1, 2], "expected": 3}                      f(*args) == expected (APPS' fn_name); a class
                                                                      Solution's method f when no function f exists

Where a verdict comes from: never from the program's exit status or its own printing.
- stdin/stdout: each case runs in a fresh process; its stdout comes back and is compared here (trailing whitespace of
  each line and trailing blank lines ignored; with float_tol, token by token, numbers within float_tol absolute or
  relative). The expected outputs never enter the sandbox.
- call tests, and every assert of the form `assert X == LITERAL` (or `LITERAL == X`; a literal is what
  ast.literal_eval reads): the sandbox reports X's value in a strict encoding (exact built-in types only: an object
  whose __eq__ always says True has no encoding and fails), and it is compared here with the literal, which never
  enters the sandbox. Call tests compare tuples as lists (JSON has no tuples).
- Other asserts (`assert abs(f(x) - 0.5) < 1e-6`, `assert f(x)`, `assert f(a) == f(b)`, HumanEval's `check`) are
  evaluated inside the sandbox by the harness, with `==` / `!=` rewritten to a strict comparison and truth taken only
  of built-in values, in a process apart from the program's: the test code runs in the harness, the program in a
  process it forked, which has no descriptor but its pipes to the harness; each call into the program comes back as
  a value in the strict encoding (or a handle to an object without one). What the program writes anywhere it can
  reach changes only what its own functions return. They are counted in `reward/detail/inner_checks`. An object that
  is not a plain value (an instance of the program's class, a Counter, a Fraction) stays in the program's process:
  the tests call it, iterate it, index it, read its attributes and str() it there; it equals another of the
  program's objects when its __eq__ says exactly True, never an object the test built, and `isinstance(x,
  TheProgramsClass)` is not available to the tests. A test that passes the program a function of its own fails.
- A test passes only when the harness reports it finished without an exception, every value matched, every truth
  held, and every assert was reached at least once (a skipped line is not a pass). Before the program runs, its
  process installs an audit hook that refuses trace and profile functions, the garbage collector's object
  lists, rewriting a function's __code__, and ctypes.

Outcomes: every test passed = CORRECT; else INCORRECT (a timeout, a crash or a compile error of the model's program
is its answer failing); no code block = NO_ANSWER; the sandbox itself failing = NO_ANSWER with detail sandbox_error.
`judge` returns a Verdict with the share of tests passed (reward.partial) and the detail counted in the metrics.
"""

from __future__ import annotations

import ast
import functools
import math
import time
from typing import Any

import rlvr.verifiers.code.record as code_record
from rlvr.verifiers import Outcome, Verdict
from rlvr.verifiers.code.sandbox import Limits, SandboxError, interpreter, run, runner_code

MAX_PROGRAM_CHARS = 50_000
SCAN_CHARS = 100_000  # the completion's tail searched for code blocks
LANGUAGES = ("", "python", "py", "python3")  # fence labels read as Python
DETAILS = ("passed", "wrong_answer", "no_code", "compile_error", "runtime_error", "timeout", "output_limit",
           "memory_limit", "sandbox_error")  # fmt: skip


def extract_program(completion: str) -> str | None:
    """The last complete fenced Python (or unlabelled) block's text; None when there is none."""
    found: str | None = None
    label: str | None = None  # the open fence's label; None outside a block
    lines: list[str] = []
    for line in completion[-SCAN_CHARS:].split("\n"):
        stripped = line.strip()
        if label is None and stripped.startswith("```"):
            label, lines = stripped[3:].strip().lower(), []
        elif label is not None and stripped == "```":
            if label in LANGUAGES:
                found = "\n".join(lines)
            label = None
        elif label is not None:
            lines.append(line)
    return found if found is None or len(found) <= MAX_PROGRAM_CHARS else found[:MAX_PROGRAM_CHARS]


def parse_record(answer: str) -> dict[str, Any]:
    """The test record (rlvr.verifiers.code.record); ValueError naming the first problem (a dataset bug)."""
    return code_record.parse(answer)


class _Sites(ast.NodeTransformer):
    """Rewrites a test's asserts into reports (see the module docstring) and remembers what each site expects."""

    def __init__(self) -> None:
        self.expected: list[tuple[bool, Any]] = []  # per site: (is a value site, the literal it must equal)

    def visit_Assert(self, node: ast.Assert) -> ast.Expr:
        test, site = node.test, len(self.expected)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            for observed, literal in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
                try:
                    value = ast.literal_eval(literal)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                self.expected.append((True, value))
                return self._report("__rlvr_value__", site, observed, node)
        self.expected.append((False, None))
        return self._report("__rlvr_truth__", site, _Strict().visit(test), node)

    @staticmethod
    def _report(hook: str, site: int, expr: ast.expr, node: ast.Assert) -> ast.Expr:
        call = ast.Call(ast.Name(hook, ast.Load()), [ast.Constant(site), expr], [])
        return ast.copy_location(ast.Expr(call), node)


class _Strict(ast.NodeTransformer):
    """`a == b` -> __rlvr_eq__(a, b), `a != b` -> __rlvr_ne__(a, b)."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq | ast.NotEq):
            hook = "__rlvr_eq__" if isinstance(node.ops[0], ast.Eq) else "__rlvr_ne__"
            return ast.copy_location(ast.Call(ast.Name(hook, ast.Load()), [node.left, node.comparators[0]], []), node)
        return node


def rewrite(test: dict[str, Any]) -> tuple[str, list[tuple[bool, Any]]]:
    """(the code the harness runs for one function test, each site's expectation). Every site must be reached."""
    sites = _Sites()
    if "call" in test:
        target = f"({test['call']} if '{test['call']}' in globals() else Solution().{test['call']})"
        sites.expected.append((True, test["expected"]))
        return f"__rlvr_value__(0, {target}(*{test['args']!r}))", sites.expected
    tree = ast.fix_missing_locations(sites.visit(ast.parse(test["assert"] if "assert" in test else test["check"])))
    code = ast.unparse(tree)
    if "check" in test:
        code += f"\ncheck({test['entry_point']})\n"
    return code, sites.expected


def decode(encoded: Any, depth: int = 0) -> Any:
    """The harness's strict encoding back to a value; ValueError for anything malformed (a forged report)."""
    if depth > 40 or not isinstance(encoded, list) or not encoded or not isinstance(encoded[0], str):
        raise ValueError("malformed value")
    tag, rest = encoded[0], encoded[1:]
    if tag == "b" and len(rest) == 1 and (rest[0] is None or isinstance(rest[0], bool)):
        return rest[0]
    if tag == "i" and len(rest) == 1 and isinstance(rest[0], str):
        return int(rest[0], 16)
    if tag == "f" and len(rest) == 1 and isinstance(rest[0], str):
        return float.fromhex(rest[0])
    if tag == "c" and len(rest) == 2 and all(isinstance(x, str) for x in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "s" and len(rest) == 1 and isinstance(rest[0], str):
        return rest[0].encode("latin-1").decode("utf-8", "surrogatepass")
    if tag == "y" and len(rest) == 1 and isinstance(rest[0], str):
        return rest[0].encode("latin-1")
    if tag in ("l", "t", "e", "z") and len(rest) == 1 and isinstance(rest[0], list):
        items = [decode(x, depth + 1) for x in rest[0]]
        return {"l": list, "t": tuple, "e": set, "z": frozenset}[tag](items)
    if tag == "d" and len(rest) == 1 and isinstance(rest[0], list):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in rest[0]}
    raise ValueError("malformed value")


def _listed(value: Any) -> Any:
    """Tuples as lists, all the way down (call tests' expectations come from JSON)."""
    if isinstance(value, list | tuple):
        return [_listed(v) for v in value]
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    return value


def same_output(got: str, expected: str, float_tol: float) -> bool:
    """A judge's comparison: lines without trailing whitespace, trailing blank lines ignored; with float_tol > 0,
    whitespace-separated tokens, numbers equal within float_tol (absolute or relative)."""
    if float_tol <= 0:
        return [line.rstrip() for line in got.rstrip().split("\n")] == [line.rstrip() for line in expected.rstrip().split("\n")]
    ours, theirs = got.split(), expected.split()
    return len(ours) == len(theirs) and all(a == b or _close(a, b, float_tol) for a, b in zip(ours, theirs))


def _close(a: str, b: str, tol: float) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isfinite(x) and math.isfinite(y) and abs(x - y) <= tol * max(1.0, abs(y))


_FAILURES = {"memory": "memory_limit", "timeout": "timeout", "output": "output_limit", "AssertionError": "wrong_answer"}


def judge(completion: str, answer: str, *, time_limit_s: float = 2.0, memory_mb: int = 1024, max_wall_s: float = 4.5,
          sandbox: bool = True) -> Verdict:  # fmt: skip
    """Run the completion's program against the record's tests (see the module docstring)."""
    record = parse_record(answer)
    program = extract_program(completion)
    if program is None:
        return Verdict(Outcome.NO_ANSWER, 0.0, "no_code")
    tests = record["tests"]
    results: list[str] = ["passed"] * len(tests)  # per test: "passed" or why it failed
    functions = [i for i, t in enumerate(tests) if "stdin" not in t]
    cases = [i for i, t in enumerate(tests) if "stdin" in t]
    base = Limits(cpu_s=time_limit_s, wall_s=2 * time_limit_s + 1, memory_bytes=memory_mb << 20)
    inner, start = 0, time.monotonic()
    try:
        if functions:
            inner = _run_functions(program, record, functions, results, base, max_wall_s, sandbox)
        if cases:  # what is left of the sample's wall-clock budget
            _run_cases(program, record, cases, results, base, max(max_wall_s - (time.monotonic() - start), 0.1), sandbox)
    except SandboxError:
        return Verdict(Outcome.NO_ANSWER, 0.0, "sandbox_error")
    failed = [r for r in results if r != "passed"]
    share = 1 - len(failed) / len(tests)
    return Verdict(Outcome.INCORRECT if failed else Outcome.CORRECT, share, failed[0] if failed else "passed", inner)


def _run_functions(program: str, record: dict, which: list[int], results: list[str], base: Limits, max_wall_s: float,
                   sandbox: bool) -> int:  # fmt: skip
    """The assert / check / call tests in one sandbox run; returns how many inner (truth) sites were reported."""
    rewritten = [rewrite(record["tests"][i]) for i in which]
    limits = Limits(**{**base.__dict__, "cpu_s": base.cpu_s * len(which)})
    wall = min(max_wall_s, 2 * limits.cpu_s + 1)
    job = {"mode": "functions", "program": program, "setup": record.get("setup", ""), "tests": [c for c, _ in rewritten],
           "test_cpu_s": base.cpu_s}  # fmt: skip
    run_result = run(job, limits, wall_s=wall, sandbox=sandbox)
    events = run_result.events
    if not events or events[0] != ["ready"]:
        raise SandboxError(run_result.stderr or "the harness did not start")
    fail_all = _whole_run_failure(events, run_result)
    seen: dict[int, set[int]] = {t: set() for t in range(len(which))}
    ok = {t: True for t in range(len(which))}
    done: dict[int, str | None] = {}
    inner = 0
    for event in events[1:]:
        kind, args = event[0], event[1:]
        if kind in ("value", "truth") and len(args) == 3 and args[0] in seen and isinstance(args[1], int):
            t, site, reported = args
            if not 0 <= site < len(rewritten[t][1]):
                ok[t] = False
                continue
            is_value, literal = rewritten[t][1][site]
            seen[t].add(site)
            if is_value != (kind == "value"):
                ok[t] = False
            elif kind == "truth":
                inner += 1
                ok[t] = ok[t] and reported is True
            else:
                ok[t] = ok[t] and _matches(reported, literal, listed="call" in record["tests"][which[t]])
        elif kind == "done" and len(args) == 2 and args[0] in seen:
            done[args[0]] = args[1]
    for t, i in enumerate(which):
        if fail_all:
            results[i] = fail_all
        elif t not in done:
            results[i] = _cut_short(run_result, limits.cpu_s)
        elif (failure := done[t]) is not None:
            results[i] = _FAILURES.get(str(failure), "runtime_error")
        elif not ok[t] or len(seen[t]) < len(rewritten[t][1]):  # a site never reached: skipped, not passed
            results[i] = "wrong_answer"
    return inner


def _whole_run_failure(events: list[list], run_result: Any) -> str | None:
    """compile_error / runtime_error / memory_limit when the program itself did not load."""
    for event in events[1:2]:
        if event[0] == "compile":
            return "compile_error"
        if event[0] == "load":  # its process ran out of memory, CPU (killed at its limit) or output, or raised
            kind = event[1] if len(event) == 2 and event[1] in ("memory", "timeout", "output") else None
            return _FAILURES[kind] if kind else "runtime_error"
    return None


def _cut_short(run_result: Any, cpu_limit: float) -> str:
    """Why a test never finished: the wall clock, the output cap, the CPU limit (SIGXCPU, or SIGKILL at the hard
    limit, after at least that long), or the process died otherwise (a crash, a kill of its own)."""
    if run_result.timed_out:
        return "timeout"
    if run_result.output_cut:
        return "output_limit"
    killed = run_result.exit_code in (-9, 128 + 9, -24, 128 + 24)  # bwrap passes its child's signal on as 128 + N
    return "timeout" if killed and run_result.seconds >= 0.9 * cpu_limit else "runtime_error"


def _matches(reported: Any, literal: Any, *, listed: bool) -> bool:
    try:
        value = decode(reported)
    except (ValueError, OverflowError, TypeError, RecursionError):
        return False
    if listed:
        value, literal = _listed(value), _listed(literal)
    try:
        return bool(value == literal)
    except RecursionError:
        return False


def _run_cases(program: str, record: dict, which: list[int], results: list[str], base: Limits, max_wall_s: float,
               sandbox: bool) -> None:  # fmt: skip
    """The stdin/stdout tests in one sandbox run (each case its own process)."""
    tests = record["tests"]
    job = {"mode": "stdio", "program": program, "setup": record.get("setup", ""),
           "tests": [{"stdin": tests[i]["stdin"]} for i in which]}  # fmt: skip
    run_result = run(job, base, wall_s=max_wall_s, sandbox=sandbox)
    events = run_result.events
    if not events or events[0] != ["ready"]:
        raise SandboxError(run_result.stderr or "the harness did not start")
    if len(events) > 1 and events[1][0] == "compile":
        for i in which:
            results[i] = "compile_error"
        return
    reported = {e[1]: e[2:] for e in events[1:] if e[0] == "case" and len(e) == 5 and isinstance(e[1], int)}
    tol = float(record.get("float_tol", 0.0))
    for t, i in enumerate(which):
        if t not in reported:
            results[i] = _cut_short(run_result, base.cpu_s)
            continue
        kind, out, cut = reported[t]
        got = out.encode("latin-1", "replace").decode("utf-8", "replace") if isinstance(out, str) else ""
        if cut:
            results[i] = "output_limit"
        elif kind is not None:
            results[i] = _FAILURES.get(kind, "runtime_error")
        elif not same_output(got, tests[i]["stdout"], tol):
            results[i] = "wrong_answer"


def verify(completion: str, answer: str, **options: Any) -> Outcome:
    """CORRECT when the completion's program passes every test of `answer` (the test record)."""
    return judge(completion, answer, **options).outcome


def score(completion: str, answer: str, **options: Any) -> float:
    """The share of the record's tests the program passes (reward.partial)."""
    return judge(completion, answer, **options).score


def extract(completion: str) -> str | None:
    """The program the verifier runs (for samples and warnings)."""
    return extract_program(completion)


def check_gold(answer: str) -> Outcome | None:
    """The record's own solution run against its tests (None: the record has no solution)."""
    record = parse_record(answer)
    if "solution" not in record:
        return None
    return judge(f"```python\n{record['solution']}\n```", answer).outcome


@functools.cache
def warm_up() -> None:
    """Compile the harness and find the interpreter once per worker, before its first sample."""
    runner_code()
    interpreter()
