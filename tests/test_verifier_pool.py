"""rlvr.verifiers.pool: order, per-sample timeouts (Outcome.TIMEOUT), errors, worker replacement, load_function."""

from __future__ import annotations

import time

import pytest
import user_rewards

from rlvr.verifiers import Outcome
from rlvr.verifiers.pool import PoolStats, VerifierPool, load_function

# serial: the sandbox's verdicts under limits of seconds are checked with no second test worker beside them (make test)
pytestmark = pytest.mark.serial

C, W, N, T = Outcome.CORRECT, Outcome.INCORRECT, Outcome.NO_ANSWER, Outcome.TIMEOUT
TIMEOUT_S = 1.0


def test_results_in_order_in_process_and_in_workers() -> None:
    pairs = [(str(i), str(i if i % 3 else -1)) for i in range(50)]
    expected = [C if i % 3 else W for i in range(50)]
    with VerifierPool(user_rewards.exact, workers=0, timeout_s=TIMEOUT_S) as pool:
        assert pool.score(pairs) == (expected, PoolStats())
    with VerifierPool("user_rewards:exact", workers=2, timeout_s=TIMEOUT_S) as pool:
        assert pool.score(pairs) == (expected, PoolStats())
        assert pool.score([]) == ([], PoolStats())


def test_stuck_sample_times_out_and_the_pool_recovers() -> None:
    pairs = [("a", "a"), ("b", "x"), ("hang", "hang"), ("c", "c"), ("d", "d"), ("e", "x")]
    with VerifierPool("user_rewards:hang_on_hang", workers=2, timeout_s=TIMEOUT_S) as pool:
        start = time.monotonic()
        results, stats = pool.score(pairs)
        elapsed = time.monotonic() - start
        assert results == [C, W, T, C, C, W]  # the verifier gave up, not the model: a timeout, not "no answer"
        assert stats == PoolStats(timeouts=1, errors=0)
        assert TIMEOUT_S <= elapsed < TIMEOUT_S + 3.0
        # the stuck worker was killed and replaced: a second batch (with another hang) still works
        results, stats = pool.score([("hang", "hang")] + [("f", "f")] * 20)
        assert results == [T] + [C] * 20
        assert stats == PoolStats(timeouts=1, errors=0)
        assert pool.score([("g", "g")] * 20) == ([C] * 20, PoolStats())


def test_every_sample_timing_out_still_returns() -> None:
    with VerifierPool(user_rewards.hang_on_hang, workers=2, timeout_s=0.5) as pool:
        start = time.monotonic()
        results, stats = pool.score([("hang", "x")] * 3)
        assert results == [T] * 3 and stats.timeouts == 3
        assert time.monotonic() - start < 3 * 0.5 + 6.0  # replacements start while the others run


def test_a_verifier_that_gives_up_by_itself_is_passed_on_not_counted() -> None:
    # its own work budget ran out (rlvr.rewards counts TIMEOUT results); stats.timeouts is the pool's kills alone
    pairs = [("a", "a"), ("slow", "slow"), ("c", "x")]
    for workers in (0, 1):
        with VerifierPool("user_rewards:fake_verifier_gives_up", workers=workers, timeout_s=TIMEOUT_S) as pool:
            assert pool.score(pairs) == ([C, T, W], PoolStats())


def test_raising_and_bad_values_count_as_errors() -> None:
    pairs = [("a", "a"), ("boom", "boom"), ("c", "x")]
    for workers in (0, 2):
        with VerifierPool("user_rewards:raise_on_boom", workers=workers, timeout_s=TIMEOUT_S) as pool:
            assert pool.score(pairs) == ([C, N, W], PoolStats(timeouts=0, errors=1))
    with VerifierPool("user_rewards:bad_return", workers=1, timeout_s=TIMEOUT_S) as pool:
        assert pool.score([("a", "a")] * 3) == ([N] * 3, PoolStats(errors=3))


def test_a_worker_that_dies_is_replaced() -> None:
    pairs = [("a", "a"), ("die", "die"), ("c", "c"), ("d", "x")] * 2
    with VerifierPool("user_rewards:exit_on_die", workers=2, timeout_s=TIMEOUT_S) as pool:
        assert pool.score(pairs) == ([C, N, C, W] * 2, PoolStats(errors=2))
        assert pool.score([("e", "e")] * 4) == ([C] * 4, PoolStats())


def test_float_rewards_and_worker_environment() -> None:
    with VerifierPool("user_rewards:length_score", workers=2, timeout_s=TIMEOUT_S) as pool:
        assert pool.score([("abc", "abc"), ("abc", "a")]) == ([1.0, 1 / 3], PoolStats())
    with VerifierPool("user_rewards:env_and_thread", workers=1, timeout_s=TIMEOUT_S) as pool:
        assert pool.score([("", "")]) == ([1.5], PoolStats())  # OMP_NUM_THREADS=1, runs on a main thread


def test_math_verify_inside_workers_and_threads() -> None:
    """math-verify's own SIGALRM timeouts raise off the main thread; ours are disabled, so both work."""
    import threading

    from rlvr.verifiers.math import is_equivalent

    pairs = [("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{x^2+2x+1}", "(x+1)^2"), ("\\boxed{3}", "4")]
    with VerifierPool("rlvr.verifiers.math:verify", workers=2, timeout_s=5.0) as pool:
        assert pool.score(pairs) == ([C, C, W], PoolStats())
    fresh = [("\\boxed{\\frac{2}{7}}", "4/14"), ("\\boxed{y^2-1}", "(y-1)(y+1)"), ("\\boxed{0.3}", "1/3")]  # not cached
    found: list[bool] = []
    thread = threading.Thread(target=lambda: found.extend(is_equivalent(c, a) for c, a in fresh))
    thread.start()
    thread.join(timeout=30)
    assert found == [True, True, False]


def test_load_function_errors_name_the_path() -> None:
    assert load_function("user_rewards:exact") is user_rewards.exact
    cases = {
        "user_rewards.exact": "package.module:function",
        "no_such_module_xyz:f": "not found",
        "user_rewards:no_such_function": "no attribute",
        "user_rewards:NOT_A_FUNCTION": "not callable",
    }
    for path, reason in cases.items():
        with pytest.raises(ValueError, match=reason) as info:
            load_function(path)
        assert path in str(info.value)
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        VerifierPool("no_such_module_xyz:f", workers=2, timeout_s=TIMEOUT_S)
    with pytest.raises(ValueError, match="cannot be sent"):
        VerifierPool(lambda c, a: 1.0, workers=2, timeout_s=TIMEOUT_S)


def test_each_worker_runs_its_verifier_modules_warm_up_before_the_first_sample() -> None:
    # (in-process, workers=0, nothing is started: the verifier warms up lazily itself, as the math one does)
    with VerifierPool("user_rewards:fake_verifier_needs_warm_up", workers=2, timeout_s=TIMEOUT_S) as pool:
        assert pool.score([("a", "a")] * 4) == ([C] * 4, PoolStats())
