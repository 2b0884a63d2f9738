"""code_feedback (rollout.env=rlvr.envs.code_feedback:make, data=code): code repair with test feedback, as RLEF
(Gehring et al. 2024, arXiv 2410.02089) trains it.

Each task's tests are split once into public and hidden ones (seeded by the task's id and the `seed` option: the same
task always has the same split). The model's program (its answer's last ```python block, as the code verifier reads
it) runs on the public tests in the code verifier's sandbox; if one fails and attempts are left, the model is shown
which (the test, expected vs got, the last lines of a traceback) and writes the program again. The episode ends when
the public tests pass or after `attempts`; its reward is the hidden tests' pass rate of the final program, judged by
the code verifier itself (its strict comparisons, never the program's own printing), times discount^(k-1) for an
episode that ended at attempt k. Success: every hidden test passed.

HumanEval's one `check(candidate)` per task is split into one check per top-level assert (its other statements kept
in each) so that it has tests to split. The feedback is for the model only: a program that fools it (it runs in the
same sandboxed process as the feedback's own code) gains nothing, since the reward comes from the verifier.

Options (rollout.env_options): attempts (3), public (the share of tests shown, 0.5: at least one public and, where a
task has two or more, one hidden), discount (1.0), seed (0), time_limit_s (2.0 CPU seconds a test), memory_mb (512),
sandbox (true; false runs the programs WITHOUT a sandbox, with your rights).
"""

from __future__ import annotations

import ast
import random
import secrets
from typing import Any

from rlvr.verifiers import code as sandbox
from rlvr.verifiers.code.record import encode, parse
from rlvr.verifiers.code.verifier import extract_program, judge, same_output

NO_CODE = "No ```python block was found in your answer. Write the whole program in one ```python block."
SHOWN_CHARS = 300  # of one value, one traceback, one output shown

# The public function tests' runner: the program and each test run in one namespace, each result printed as one line
# behind a random mark (the program's own printing is not read), values as repr, tracebacks without the runner's frames.
_RUNNER = """\
import sys as _rs, traceback as _rt
_rmark, _rns = {mark!r}, {{"__name__": "__main__"}}
def _rshow(e):
    frames = [f for f in _rt.extract_tb(e.__traceback__) if f.filename in ("<program>", "<test>")]
    text = ("Traceback (most recent call last):\\n" + "".join(_rt.format_list(frames[-3:])) if frames else "")
    return text + "".join(_rt.format_exception_only(type(e), e))
try:
    exec(compile({setup!r}, "<setup>", "exec"), _rns)
    exec(compile({program!r}, "<program>", "exec"), _rns)
except BaseException as _re:
    print(_rmark, repr(("load", _rshow(_re))), flush=True)
    _rs.exit(0)
for _ri, (_rcode, _rexpr, _rwant) in enumerate({tests!r}):
    try:
        if _rexpr is None:
            exec(compile(_rcode, "<test>", "exec"), _rns)
            _rout = ("pass", None)
        else:
            _rgot = eval(compile(_rexpr, "<test>", "eval"), _rns)
            _rexp = eval(compile(_rwant, "<test>", "eval"), _rns)
            _rout = ("pass", None) if type(_rgot) is type(_rexp) and _rgot == _rexp else ("got", repr(_rgot))
    except AssertionError as _re:
        _rout = ("fail", _rshow(_re))
    except BaseException as _re:
        _rout = ("error", _rshow(_re))
    print(_rmark, repr((_ri, *_rout)), flush=True)
"""


def split_checks(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tests, a HumanEval `check` with several top-level asserts made one check per assert (its other statements
    kept in each, in order)."""
    out = []
    for test in tests:
        if "check" not in test:
            out.append(test)
            continue
        module = ast.parse(test["check"])
        found = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
        asserts = [s for s in found[0].body if isinstance(s, ast.Assert)] if found else []
        if len(asserts) < 2:
            out.append(test)
            continue
        for kept in asserts:
            body = [s for s in found[0].body if not isinstance(s, ast.Assert) or s is kept]
            single = ast.Module(body=[*(n for n in module.body if n is not found[0]),
                                      ast.FunctionDef(**{**found[0].__dict__, "body": body})], type_ignores=[])  # fmt: skip
            out.append({**test, "check": ast.unparse(single)})
    return out


def _feedback_test(test: dict[str, Any]) -> tuple[str, str | None, str | None, str]:
    """(code to run, expression, expected expression, what the model is shown) of a function test: an `assert X == Y`
    compares X with Y (shown expected vs got); a call test calls; any other assert, or a check, runs as it is."""
    if "call" in test:
        call = f"{test['call']}(*{test['args']!r})"
        return "", call, repr(test["expected"]), f"{test['call']}({', '.join(map(repr, test['args']))})"
    if "check" in test:
        asserts = [ast.unparse(n) for n in ast.walk(ast.parse(test["check"])) if isinstance(n, ast.Assert)]
        shown = "; ".join(asserts)[:SHOWN_CHARS] or "check(...)"
        return f"{test['check']}\ncheck({test['entry_point']})", None, None, shown
    source = test["assert"]
    tree = ast.parse(source)
    node = tree.body[0] if len(tree.body) == 1 else None
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq):
        return "", ast.unparse(node.test.left), ast.unparse(node.test.comparators[0]), source.strip()
    return source, None, None, source.strip()


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + " ..."


class CodeFeedback:
    def __init__(self, example: dict[str, Any], attempts: int, public: float, discount: float, seed: int,
                 time_limit_s: float, memory_mb: int, sandboxed: bool) -> None:  # fmt: skip
        if attempts < 1 or not 0 < discount <= 1 or not 0 < public < 1:
            raise ValueError(f"code_feedback needs attempts >= 1, discount in (0, 1] and public in (0, 1), got "
                             f"{attempts}, {discount}, {public}")  # fmt: skip
        try:
            record = parse(example["answer"])
        except ValueError as e:
            raise ValueError(f"code_feedback needs a code task (data=code, or data.tests_key): {example.get('id')!r}: {e}") from None
        tests = split_checks(record["tests"])
        order = list(range(len(tests)))
        random.Random(f"code_feedback:{seed}:{example.get('id')}").shuffle(order)
        shown = 1 if len(tests) == 1 else min(max(1, round(public * len(tests))), len(tests) - 1)
        self.public = [tests[i] for i in sorted(order[:shown])]
        hidden = [tests[i] for i in sorted(order[shown:])] or self.public
        self.hidden = encode({k: v for k, v in {**record, "tests": hidden}.items() if k != "solution"})
        self.setup, self.float_tol = record.get("setup", ""), float(record.get("float_tol", 0.0))
        self.attempts, self.discount = attempts, discount
        self.time_limit_s, self.memory_mb, self.sandboxed = time_limit_s, memory_mb, sandboxed
        self.attempt = 0

    def reset(self, *, seed: int) -> tuple[None, dict[str, Any]]:
        self.attempt = 0
        return None, {"public_tests": len(self.public)}

    def step(self, action: str) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        self.attempt += 1
        program = extract_program(action)
        passed, feedback = (False, NO_CODE) if program is None else self.run_public(program)
        if passed or self.attempt >= self.attempts:
            verdict = judge(action, self.hidden, time_limit_s=self.time_limit_s, memory_mb=self.memory_mb,
                            max_wall_s=4 * self.time_limit_s + 2, sandbox=self.sandboxed)  # fmt: skip
            reward = verdict.score * self.discount ** (self.attempt - 1)
            return None, reward, True, False, {"success": verdict.score == 1.0, "attempts": self.attempt,
                                               "hidden_pass_rate": verdict.score, "public_passed": passed}  # fmt: skip
        return feedback, 0.0, False, False, {"attempts": self.attempt}

    def run_public(self, program: str) -> tuple[bool, str]:
        """(whether every public test passed, what the model is told): each failing test with why."""
        lines: list[str] = []
        functions = [t for t in self.public if "stdin" not in t]
        cases = [t for t in self.public if "stdin" in t]
        try:
            if functions:
                lines += self._functions(program, functions)
            if cases:
                lines += self._cases(program, cases)
        except (sandbox.SandboxError, OSError) as e:
            lines.append(f"The tests could not be run: {_cut(str(e))}")
        if not lines:
            return True, ""
        return False, (f"Your program failed {len(lines)} of the {len(self.public)} public tests:\n\n" + "\n\n".join(lines)
                       + "\n\nFix the program and write it again, whole, in one ```python block.")  # fmt: skip

    def _limits(self, n: int) -> sandbox.Limits:
        return sandbox.Limits(cpu_s=self.time_limit_s * (n + 1), wall_s=2 * self.time_limit_s * (n + 1) + 1,
                              memory_bytes=self.memory_mb << 20, output_bytes=1 << 16)  # fmt: skip

    def _functions(self, program: str, tests: list[dict[str, Any]]) -> list[str]:
        specs = [_feedback_test(t) for t in tests]
        mark = f"\x1erlvr-{secrets.token_hex(6)}\x1e"
        runner = _RUNNER.format(mark=mark, setup=self.setup, program=program, tests=[s[:3] for s in specs])
        limits = self._limits(len(tests))
        result = sandbox.run_sandboxed({"mode": "stdio", "program": runner, "setup": "", "tests": [{"stdin": ""}]},
                                       limits, wall_s=limits.wall_s + 1.0, sandbox=self.sandboxed)  # fmt: skip
        case = next((e for e in result.events if e[0] == "case" and len(e) == 5), None)
        out = case[3] if case is not None and isinstance(case[3], str) else ""
        reports: dict[Any, tuple] = {}
        for line in out.split("\n"):
            if line.startswith(mark + " "):
                try:
                    report = ast.literal_eval(line[len(mark) + 1 :])
                except (ValueError, SyntaxError):
                    continue
                reports[report[0]] = report[1:]
        if "load" in reports:
            return [f"The program did not run:\n{_cut(str(reports['load'][0]).rstrip())}"]
        lines = []
        for i, (_, _, want, shown) in enumerate(specs):
            got = reports.get(i)
            if got is None:
                lines.append(f"Test: {shown}\nIt did not finish (over {self.time_limit_s:g} CPU seconds a test, or the "
                             f"program exited).")  # fmt: skip
            elif got[0] == "got":
                lines.append(f"Test: {shown}\nExpected: {_cut(str(want))}\nGot: {_cut(str(got[1]))}")
            elif got[0] in ("fail", "error"):
                lines.append(f"Test: {shown}\n{_cut(str(got[1]).rstrip())}")
        return lines

    def _cases(self, program: str, tests: list[dict[str, Any]]) -> list[str]:
        limits = sandbox.Limits(cpu_s=self.time_limit_s, wall_s=2 * self.time_limit_s + 1, memory_bytes=self.memory_mb << 20,
                                output_bytes=1 << 16)  # fmt: skip
        job = {"mode": "stdio", "program": program, "setup": self.setup, "tests": [{"stdin": t["stdin"]} for t in tests]}
        result = sandbox.run_sandboxed(job, limits, wall_s=limits.wall_s * len(tests) + 1.0, sandbox=self.sandboxed)
        outs = {e[1]: (e[2], e[3]) for e in result.events if e[0] == "case" and len(e) == 5}
        lines = []
        for i, test in enumerate(tests):
            kind, got = outs.get(i, ("timeout", ""))
            if kind is None and isinstance(got, str) and same_output(got, test["stdout"], self.float_tol):
                continue
            why = f" ({kind})" if kind else ""
            lines.append(f"Input:\n{_cut(test['stdin'])}\nExpected output:\n{_cut(test['stdout'])}\nGot{why}:\n{_cut(str(got))}")
        if any(e[0] == "compile" for e in result.events):
            return ["The program could not be compiled (a syntax error)."]
        return lines


def make(example: dict[str, Any], attempts: int = 3, public: float = 0.5, discount: float = 1.0, seed: int = 0,
         time_limit_s: float = 2.0, memory_mb: int = 512, sandbox: bool = True) -> CodeFeedback:  # fmt: skip
    return CodeFeedback(example, attempts, public, discount, seed, time_limit_s, memory_mb, sandbox)
