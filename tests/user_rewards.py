"""Sample user reward functions for the pool tests (module-level, so worker processes can import them)."""

from __future__ import annotations

import os
import threading
import time

from rlvr.verifiers import Outcome

NOT_A_FUNCTION = 42


def exact(completion: str, answer: str) -> Outcome:
    """CORRECT when the completion is the answer, after stripping."""
    return Outcome.CORRECT if completion.strip() == answer.strip() else Outcome.INCORRECT


def length_score(completion: str, answer: str) -> float:
    """A float reward: 1 / (1 + length difference)."""
    return 1.0 / (1.0 + abs(len(completion) - len(answer)))


def hang_on_hang(completion: str, answer: str) -> Outcome:
    """Sleeps (practically) forever when the completion is "hang"."""
    if completion == "hang":
        time.sleep(3600)
    return exact(completion, answer)


def raise_on_boom(completion: str, answer: str) -> Outcome:
    """Raises when the completion is "boom"."""
    if completion == "boom":
        raise RuntimeError("boom")
    return exact(completion, answer)


def exit_on_die(completion: str, answer: str) -> Outcome:
    """Kills its own process when the completion is "die" (as a segfault or the OOM killer would)."""
    if completion == "die":
        os._exit(3)
    return exact(completion, answer)


def bad_return(completion: str, answer: str) -> object:
    """Returns a value that is neither an Outcome nor a number."""
    return "yes"


def env_and_thread(completion: str, answer: str) -> float:
    """1.0 if the worker runs with OMP_NUM_THREADS=1 (and reports whether this is the main thread)."""
    ok = os.environ.get("OMP_NUM_THREADS") == "1"
    return float(ok) + (0.5 if threading.current_thread() is threading.main_thread() else 0.0)


def fake_verifier_gives_up(completion: str, answer: str) -> Outcome:
    """A fake verifier whose work budget runs out on "slow": it returns Outcome.TIMEOUT itself, with no pool timeout."""
    if completion == "slow":
        return Outcome.TIMEOUT
    return exact(completion, answer)


_warmed_up = False


def warm_up() -> None:
    """What a verifier worker calls as it starts (rlvr.verifiers.pool): here it only records that it was called."""
    global _warmed_up
    _warmed_up = True


def fake_verifier_needs_warm_up(completion: str, answer: str) -> Outcome:
    """A fake verifier that is CORRECT only in a process whose `warm_up` ran before it."""
    return Outcome.CORRECT if _warmed_up else Outcome.INCORRECT


def thoughtful(completion: str, answer: str, thoughts: str | None = None) -> float:
    """A reward function that asks for a thinking answer's thoughts (rlvr.rewards passes them): 1 + len(thoughts) / 100
    for a right answer, 0 otherwise."""
    return (1.0 + len(thoughts or "") / 100) if completion.strip() == answer.strip() else 0.0
