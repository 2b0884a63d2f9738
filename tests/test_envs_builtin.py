"""The built-in environments (rlvr/envs): math_retry, code_feedback (in the real sandbox) and the textarena adapter (the
real games), each through the protocol as the driver calls it."""

from __future__ import annotations

import random
import threading

import pytest

from rlvr import envs
from rlvr.envs import code_feedback, math_retry, textarena
from rlvr.tasks import code
from rlvr.types import Example
from rlvr.verifiers.code.record import encode, parse


def protocol(env, actions: list[str], seed: int = 0) -> tuple[str | None, list[envs.Step]]:
    """reset, then step through `actions` until the episode ends, each return checked as the driver checks it."""
    first, _ = envs.reset_result(env.reset(seed=seed))
    steps = []
    for action in actions:
        steps.append(envs.step_result(env.step(action)))
        if steps[-1].terminated or steps[-1].truncated:
            break
    return first, steps


# ---- math_retry ----


def test_math_retry_discounts_a_later_right_answer():
    row = Example("add-7-95", "07+95=", "102").row("arithmetic")
    first, steps = protocol(math_retry.make(row, attempts=3, discount=0.5), ["101", "102"])
    assert first is None and [s.observation for s in steps] == ["That is not right, try again.", None]
    assert [s.reward for s in steps] == [0.0, 0.5] and steps[-1].terminated and steps[-1].info["success"]


def test_math_retry_ends_after_its_attempts_with_nothing():
    row = Example("q", "What is 6*7?", "42").row("math")
    _, steps = protocol(math_retry.make(row, attempts=2, message="Again: {prompt}"), ["\\boxed{41}", "\\boxed{40}", "\\boxed{42}"])
    assert [s.observation for s in steps] == ["Again: What is 6*7?", None] and len(steps) == 2
    assert sum(s.reward for s in steps) == 0.0 and not steps[-1].info["success"]
    _, right = protocol(math_retry.make(row), ["The answer is \\boxed{42}."])
    assert right[0].reward == 1.0 and right[0].info == {"success": True, "attempts": 1}


def test_math_retry_refuses_a_task_it_cannot_check():
    with pytest.raises(ValueError, match="math_retry checks answers with the arithmetic, math or countdown verifier; this task's is 'code'"):
        math_retry.make(Example("x", "p", "a").row("code"))


# ---- code_feedback ----


def functions_task() -> Example:
    return code.functions_examples(3, 1, 0)[0][0]  # triangular numbers: 4 asserts on solve


def program(source: str) -> str:
    return f"Here it is:\n```python\n{source}\n```"


def test_code_feedback_splits_the_tests_once_seeded_by_the_task():
    row = functions_task().row("code")
    a, b = code_feedback.make(row), code_feedback.make(row)
    tests = parse(row["answer"])["tests"]
    assert a.public == b.public and len(a.public) == 2 and len(parse(a.hidden)["tests"]) == 2
    assert sorted(t["assert"] for t in a.public + parse(a.hidden)["tests"]) == sorted(t["assert"] for t in tests)
    others = {tuple(t["assert"] for t in code_feedback.make(row, seed=s).public) for s in range(8)}
    assert len(others) > 1  # the `seed` option draws another split


def test_code_feedback_shows_expected_and_got_then_rewards_the_hidden_tests():
    example = functions_task()
    solution = parse(example.answer)["solution"]
    env = code_feedback.make(example.row("code"), attempts=3, discount=0.5)
    first, steps = protocol(env, [program("def solve(n):\n    return 0"), program("def solve(n):\n    return 1 / 0"),
                                  program(solution)])  # fmt: skip
    public = [t["assert"] for t in env.public]
    shown = steps[0].observation
    assert shown.startswith("Your program failed 2 of the 2 public tests:") and public[0] in shown
    want = public[0].split("== ")[1]
    assert f"Expected: {want}\nGot: 0" in shown and "Fix the program" in shown
    assert 'File "<program>", line 2, in solve' in steps[1].observation and "ZeroDivisionError: division by zero" in steps[1].observation
    assert steps[2].terminated and steps[2].reward == 0.25 and steps[2].info["success"]  # 1.0 x 0.5^2


def test_code_feedback_rewards_the_final_programs_hidden_pass_rate():
    record = {"tests": [{"assert": f"assert solve({i}) == {i * i}"} for i in range(4)]}
    row = Example("squares", "Write solve(n) = n*n.", encode(record)).row("code")
    env = code_feedback.make(row, attempts=1)
    hidden = [t["assert"] for t in parse(env.hidden)["tests"]]
    cheat = "def solve(n):\n" + "".join(f"    if n == {t.split('(')[1].split(')')[0]}: return {t.split('== ')[1]}\n" for t in
                                         (p["assert"] for p in env.public)) + "    return -1"  # fmt: skip
    _, steps = protocol(env, [program(cheat)])
    assert steps[0].terminated and steps[0].reward == 0.0 and steps[0].info["public_passed"] and hidden  # memorized
    _, none = protocol(code_feedback.make(row, attempts=2), ["no code at all", "still none"])
    assert none[0].observation == code_feedback.NO_CODE and none[1].reward == 0.0 and none[1].terminated


def test_code_feedback_splits_a_humaneval_check_into_one_test_per_assert():
    check = "def check(candidate):\n    x = 2\n    assert candidate(x) == 4\n    assert candidate(3) == 9\n    assert candidate(0) == 0"
    tests = code_feedback.split_checks([{"check": check, "entry_point": "sq"}])
    assert len(tests) == 3 and all(t["check"].count("assert") == 1 and "x = 2" in t["check"] for t in tests)
    row = Example("sq", "Write sq(n).", encode({"tests": [{"check": check, "entry_point": "sq"}]})).row("code")
    _, steps = protocol(code_feedback.make(row, attempts=2), [program("def sq(n):\n    return n - 1"), program("def sq(n):\n    return n * n")])
    assert "AssertionError" in steps[0].observation and steps[1].reward == 1.0


def test_code_feedback_shows_stdin_tests_input_expected_and_got():
    record = {"tests": [{"stdin": f"{i}\n", "stdout": f"{2 * i}\n"} for i in range(1, 5)]}
    row = Example("double", "Double a number.", encode(record)).row("code")
    env = code_feedback.make(row, attempts=2)
    _, steps = protocol(env, [program("print(int(input()) + 1)"), program("print(int(input()) * 2)")])
    case = env.public[0]
    assert f"Input:\n{case['stdin']}\nExpected output:\n{case['stdout']}\nGot:\n{int(case['stdin']) + 1}" in steps[0].observation
    assert steps[1].reward == 1.0 and steps[1].info["success"]


def test_code_feedback_refuses_a_task_without_tests():
    with pytest.raises(ValueError, match="code_feedback needs a code task"):
        code_feedback.make(Example("x", "2+2?", "4").row("math"))


# ---- textarena ----


def guess_the_number(seed: int) -> tuple[list[str], float]:
    """Binary search through a real GuessTheNumber game: the observations seen and the final reward."""
    env = textarena.make({"env_id": "GuessTheNumber-v0"})
    first, _ = envs.reset_result(env.reset(seed=seed))
    seen, low, high = [first], 1, 20
    for _ in range(10):
        guess = (low + high) // 2
        step = envs.step_result(env.step(f"My guess: [{guess}]"))
        if step.terminated:
            env.close()
            return seen, step.reward
        seen.append(step.observation)
        low, high = (guess + 1, high) if "higher" in step.observation else (low, guess - 1)
    raise AssertionError("binary search did not finish in 10 guesses")


def test_a_textarena_game_is_played_through_the_protocol():
    seen, reward = guess_the_number(3)
    assert seen[0].startswith("You are Player 0. You are playing Guess The Number.") and "[5]" in seen[0]
    assert all(s in ("The target number is higher.", "The target number is lower.") for s in seen[1:])
    assert reward == 1.0
    assert guess_the_number(3) == (seen, reward)  # the seed decides the game


def test_textarena_leaves_rlvrs_random_alone_and_games_in_threads_reproducible():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    alone = {s: guess_the_number(s) for s in range(6)}
    assert [random.random() for _ in range(3)] == expected  # textarena's reseeding never reached rlvr's `random`
    together: dict[int, tuple] = {}
    threads = [threading.Thread(target=lambda s=s: together.__setitem__(s, guess_the_number(s))) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone and len({tuple(v[0]) for v in alone.values()}) > 1


def test_textarena_needs_a_game_id():
    with pytest.raises(ValueError, match="needs a game id: data=env data.env_id=GuessTheNumber-v0"):
        textarena.make({"id": "x"})
