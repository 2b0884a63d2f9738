"""Environments (rollout.env): episodes where the world answers every turn and decides when they end and what they
were worth. rlvr.multiturn drives the turns; this module holds the protocol, its checks and the episodes' records.

The protocol, Gymnasium's, by import path (`rollout.env=package.module:make`):

    make(example: dict, **rollout.env_options) -> env     # one episode's environment: a fresh object per answer
    env.reset(*, seed: int) -> (observation: str | None, info: dict)
    env.step(action: str) -> (observation: str | None, reward: float, terminated: bool, truncated: bool, info: dict)
    env.close()                                            # optional; always called, once, when the episode is over

`example` is the prompt's row: id, prompt, answer, gold (None where it is the answer), messages (None or a chat row's
messages), verifier (the task's verifier name: how its answers are checked) and the task's own fields (data=env:
env_id and index). reset's observation None keeps the example's prompt; a string is the first user message, in place
of the prompt. `action` is the model's text of the turn it just ended (tool outputs inside the turn left out);
`observation` is the next user message, shown as the chat template renders a user message after the model's turn
(rlvr.multiturn). The episode's return is the sum of its step rewards (Gymnasium's return); the verifier's reward is
added unless reward.verifier=none. An episode is a success when its last info says `success: true` (an environment
that says nothing: when it terminated with a positive return).

Every answer of a group gets its own environment, reset with the group's seed (derived from the run's seed, the step,
the round and the prompt's place: a resumed run resets them alike), so the G answers GRPO compares face the same world.
reset, step and close run in threads, every episode of a turn at once, each within rollout.env_timeout_s: one that
raises, hangs past it, or returns something else than the protocol says ends its episode (`env/errors`, the sample says
why), never the run. A thread past its time cannot be killed: it is left to finish in the background. Environment code
runs in this process WITH THE USER'S RIGHTS (as reward.fn and function tools do): it is trusted code.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.config import ConfigError

PROTOCOL = "make(example) -> an object with reset(*, seed) and step(action) (rlvr/envs/__init__.py)"


class EnvError(Exception):
    """An episode's environment broke the protocol or failed: the episode ends, the run goes on."""


@dataclass(frozen=True)
class Step:
    """What one `step` returned, checked."""

    observation: str | None
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as the rewards, metrics and samples read it."""

    returned: float  # the sum of its step rewards
    turns: int  # the model's turns the environment stepped on
    success: bool
    error: str | None  # why the environment ended it early (an exception, a timeout, a wrong shape); None: it did not
    rewards: tuple[float, ...] = ()  # each step's reward, in order
    end: str = "running"  # terminated | truncated | max_turns | length | error | model (the model stopped answering)
    step_seconds: float = 0.0  # wall time of its reset, steps and close, summed


@dataclass
class Episode:
    """One answer's environment and where its episode stands."""

    env: Any
    seed: int
    rewards: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    error: str | None = None
    end: str = "running"
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.end != "running"

    def finish(self, end: str, error: str | None = None) -> None:
        if not self.done:
            self.end, self.error = end, error

    def record(self) -> EpisodeRecord:
        returned = float(sum(self.rewards))
        said = self.info.get("success") if isinstance(self.info, dict) else None
        success = bool(said) if said is not None else (self.terminated and returned > 0)
        return EpisodeRecord(returned, len(self.rewards), success and self.error is None, self.error, tuple(self.rewards),
                             self.end, self.seconds)  # fmt: skip


def load(path: str, key: str = "rollout.env") -> Callable[..., Any]:
    """The factory `path` names ("package.module:make"); ConfigError naming `key` when it cannot be imported or is not
    callable."""
    from rlvr.verifiers.pool import load_function

    if ":" not in path:
        raise ConfigError(f"{key}={path!r}: name the factory as package.module:function ({PROTOCOL})")
    try:
        factory = load_function(path)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return factory


def check(path: str, example: dict[str, Any], options: dict[str, Any]) -> None:
    """Before any model loads: the factory imports, builds an environment for `example` with `options`, and that has
    `reset` and `step` (it is closed again; nothing is stepped). ConfigError naming rollout.env otherwise."""
    factory = load(path)
    try:
        env = factory(example, **options)
    except Exception as e:  # the user's code: its failure is the run's configuration error, named
        raise ConfigError(f"rollout.env={path!r}: building an environment for the first training example "
                          f"({example.get('id')!r}, rollout.env_options={options}) raised {type(e).__name__}: {e}") from None  # fmt: skip
    missing = [name for name in ("reset", "step") if not callable(getattr(env, name, None))]
    try:
        if missing:
            raise ConfigError(f"rollout.env={path!r} made a {type(env).__name__}, which has no {' and no '.join(missing)} "
                              f"method: an environment has reset(*, seed) and step(action) ({PROTOCOL})")  # fmt: skip
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001  (a probe's close: what counts is that reset and step exist)
                pass


def start(factory: Callable[..., Any], example: dict[str, Any], options: dict[str, Any], seed: int) -> Episode:
    """A new episode's environment (not yet reset). A factory that raises gives an episode that ended in error."""
    try:
        return Episode(factory(example, **options), seed)
    except Exception as e:  # noqa: BLE001  (the user's code: this episode's error)
        episode = Episode(None, seed)
        episode.finish("error", f"make raised {type(e).__name__}: {str(e)[:300]}")
        return episode


def reset_result(value: Any) -> tuple[str | None, dict[str, Any]]:
    """reset's return, checked: (observation, info)."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise EnvError(f"reset returned {_shape(value)}, not (observation, info)")
    observation, info = value
    return _observation(observation, "reset"), _info(info, "reset")


def step_result(value: Any) -> Step:
    """step's return, checked: (observation, reward, terminated, truncated, info), reward a finite number."""
    if not (isinstance(value, tuple) and len(value) == 5):
        raise EnvError(f"step returned {_shape(value)}, not (observation, reward, terminated, truncated, info)")
    observation, reward, terminated, truncated, info = value
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvError(f"step returned the reward {reward!r}: a finite number is expected")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool) and type(flag).__name__ != "bool_":  # numpy's bool too
            raise EnvError(f"step returned {name}={flag!r}: True or False is expected")
    return Step(_observation(observation, "step"), float(reward), bool(terminated), bool(truncated), _info(info, "step"))


def _observation(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise EnvError(f"{where} returned an observation of type {type(value).__name__}: a str (or None) is expected")
    return value


def _info(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise EnvError(f"{where} returned info of type {type(value).__name__}: a dict is expected")
    return value


def _shape(value: Any) -> str:
    return f"a tuple of {len(value)}" if isinstance(value, tuple) else f"a {type(value).__name__}"


def run_all(calls: list[Callable[[], Any]], timeout_s: float) -> list[tuple[Any, str | None, float]]:
    """Run every call at once, each in its own thread, within `timeout_s` of the start: (its value, None, seconds), or
    (None, why it failed, seconds) for one that raised or was still running at the deadline (left running: a thread
    cannot be stopped)."""
    boxes: list[list[Any]] = [[] for _ in calls]
    start = time.monotonic()

    def work(call: Callable[[], Any], box: list[Any]) -> None:
        try:
            box.append((call(), None))
        except Exception as e:  # noqa: BLE001  (the user's code: that episode's error)
            box.append((None, f"{type(e).__name__}: {str(e)[:300]}"))
        box.append(time.monotonic() - start)

    threads = [threading.Thread(target=work, args=(call, box), daemon=True, name="rlvr-env") for call, box in zip(calls, boxes)]
    for thread in threads:
        thread.start()
    deadline = start + timeout_s
    out: list[tuple[Any, str | None, float]] = []
    for thread, box in zip(threads, boxes, strict=True):
        thread.join(max(0.0, deadline - time.monotonic()))
        if len(box) < 2:  # still running (or just finishing: its result is not taken)
            out.append((None, f"timed out after {timeout_s:g} s (rollout.env_timeout_s)", timeout_s))
        else:
            (value, error), seconds = box[0], box[1]
            out.append((value, error, seconds))
    return out


def close_all(episodes: list[Episode], timeout_s: float) -> None:
    """Close every episode's environment (those that have `close`), in parallel; a close that fails ends nothing more
    but is the episode's error if it had none."""
    todo = [e for e in episodes if e.env is not None and callable(getattr(e.env, "close", None))]
    for episode, (_, error, seconds) in zip(todo, run_all([e.env.close for e in todo], timeout_s), strict=True):
        episode.seconds += seconds
        if error is not None and episode.error is None:
            episode.error = f"close: {error}"


def metrics(prefix: str, records: list[EpisodeRecord], step_s: float) -> dict[str, float]:
    """`{prefix}turns_per_episode`, `return_mean`, `success_frac`, `errors` (a count) and `step_s` (the environments'
    wall time this round, all episodes' calls overlapping)."""
    n = max(len(records), 1)
    return {
        f"{prefix}turns_per_episode": sum(r.turns for r in records) / n,
        f"{prefix}return_mean": sum(r.returned for r in records) / n,
        f"{prefix}success_frac": sum(r.success for r in records) / n,
        f"{prefix}errors": float(sum(r.error is not None for r in records)),
        f"{prefix}step_s": step_s,
    }
