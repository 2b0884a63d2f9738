"""A test tool for the built-in tiny model, which writes digits and never code: a turn that ends in "1" is a call,
answered with "<k>+" (k = the answer's earlier calls). It makes real multi-turn answers out of the real engine, so
that the loop's multi-turn path runs on the model `make test` can afford. Not a tool users get: rollout.tools names
only rlvr's own."""

from __future__ import annotations

from rlvr.tools import ToolResult


class DigitTool:
    name = "digit"
    stop = ("1",)
    turn_end = False

    def parse(self, turn: str) -> list[str]:
        return ["1"] if turn.endswith("1") else []

    def run(self, request: str, earlier: list[str]) -> ToolResult:
        return ToolResult(f"{len(earlier)}+", "ok", 0.0)

    def format(self, outputs: list[str]) -> list[tuple[str, bool]]:
        return [(output, False) for output in outputs]
