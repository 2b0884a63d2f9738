"""textarena's single-player games as environments (rollout.env=rlvr.envs.textarena:make data=env
data.env_id=GuessTheNumber-v0): those that need no word list or network run offline (GuessTheNumber-v0,
TowerOfHanoi-v0, Mastermind-v0, Minesweeper-v0, FrozenLake-v0; measured in docs/guide/environments.md).

The game's raw form is used (its "-raw" registration: no wrappers), so each observation is what the game said since
the model's last move (its messages joined by newlines; the model's own move is not echoed back), the first one its
rules. The reward comes when the game ends: the player's reward from the game's close (GuessTheNumber: 1 for a win,
the closeness of the last guess when the turns run out; an invalid move ends most games), and a win is a reward of 1
(`success`). Options (rollout.env_options): env_id (else the example's data.env_id) and the game's own keyword
arguments (`game: {max_turns: 10}`).

textarena draws from Python's global `random` (its reset seeds it): every call into a game runs under one lock with the
episode's own random state swapped in and rlvr's swapped back after, so episodes stepped in parallel stay reproducible
and rlvr's own draws are never disturbed.
"""

from __future__ import annotations

import random
import threading
from typing import Any

_LOCK = threading.Lock()
PLAYER_ACTION = 2  # textarena's ObservationType.PLAYER_ACTION: the player's own move, echoed back


class TextArenaGame:
    def __init__(self, env_id: str, game: dict[str, Any]) -> None:
        self.env_id = env_id
        self.random: Any = None
        self.env = self._in_game(lambda: _make(env_id, game))  # textarena's first import draws from `random` too
        self.closed = False

    def _in_game(self, call: Any) -> Any:
        """call() with the episode's random state in Python's global `random`, rlvr's restored after."""
        with _LOCK:
            ours = random.getstate()
            try:
                if self.random is not None:
                    random.setstate(self.random)
                return call()
            finally:
                self.random = random.getstate()
                random.setstate(ours)

    def _observation(self) -> str:
        _, messages = self.env.get_observation()
        return "\n".join(m[1] for m in messages if len(m) < 3 or getattr(m[2], "value", m[2]) != PLAYER_ACTION).strip()

    def reset(self, *, seed: int) -> tuple[str, dict[str, Any]]:
        def start() -> str:
            self.env.reset(num_players=1, seed=seed)
            return self._observation()

        return self._in_game(start), {"env_id": self.env_id}

    def step(self, action: str) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        def move() -> tuple[str | None, float, bool, bool, dict[str, Any]]:
            done, _ = self.env.step(action)
            if not done:
                return self._observation(), 0.0, False, False, {}
            rewards, game_info = self.env.close()
            self.closed = True
            reward = float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else 0.0
            info = game_info.get(0, {}) if isinstance(game_info, dict) else {}
            return None, reward, True, False, {"success": reward >= 1.0, "reason": str(info.get("reason", ""))}

        return self._in_game(move)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._in_game(self.env.close)
            except Exception:  # noqa: BLE001  (a game abandoned mid-way may refuse to close: nothing is lost)
                pass


def _make(env_id: str, game: dict[str, Any]) -> Any:
    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    return ta.make(f"{env_id}-raw" if f"{env_id}-raw" in ENV_REGISTRY else env_id, **game)


def make(example: dict[str, Any], env_id: str | None = None, game: dict[str, Any] | None = None) -> TextArenaGame:
    name = env_id or example.get("env_id")
    if not name:
        raise ValueError("rlvr.envs.textarena needs a game id: data=env data.env_id=GuessTheNumber-v0 (or "
                         "rollout.env_options={env_id: ...})")  # fmt: skip
    return TextArenaGame(str(name), dict(game or {}))
