"""Functions for tests/test_function_tools.py, named by import path (rollout.tools=[tool_functions:multiply]) as a
user names their own: each has the type hints and Google-style docstring a tool function needs, but `undocumented`."""

from __future__ import annotations

import time


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def lookup(word: str) -> dict:
    """Look a word up in a tiny dictionary.

    Args:
        word: the word to look up
    """
    table = {"cat": {"legs": 4, "sound": "meow"}}
    if word not in table:
        raise KeyError(f"no entry for {word!r}")
    return table[word]


def echo(text: str) -> str:
    """Return the text as it is.

    Args:
        text: any text, special-token text included
    """
    return text


def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: how long to sleep
    """
    time.sleep(seconds)
    return "awake"


def leave() -> str:
    """Exit the process (the tool must not let it)."""
    raise SystemExit(3)


def undocumented(x):
    return x


def hog(n: int) -> int:
    """Sum 0..n-1 in one C call, which holds the GIL throughout (a thread cannot be made to give it up).

    Args:
        n: how many integers
    """
    return sum(range(n))


def rows(n: int) -> list:
    """The same row n times (the model chooses n).

    Args:
        n: how many rows
    """
    return [{"name": "row", "value": 12345}] * n


def counter() -> int:
    """How many times this process has called it (a function's own state lives in its worker process)."""
    global _calls
    _calls += 1
    return _calls


_calls = 0
