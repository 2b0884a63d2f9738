"""`python tests/digit_tool_run.py train ...` is `rlvr train ...` whose rollouts and evaluations call the digit test
tool (tests/digit_tool.py) instead of rollout.tools' python: the CLI, the loop, DAPO's refill, checkpoints and resume
on real multi-turn answers of the built-in tiny model. rollout.tools must be set (the run takes the tools path)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digit_tool import DigitTool  # noqa: E402

from rlvr import multiturn  # noqa: E402
from rlvr.cli import entry  # noqa: E402


def digit_sampler(engine, cfg, verifier=None):  # type: ignore[no-untyped-def]
    r = cfg.rollout
    return multiturn.ToolSampler(engine, [DigitTool()], max_turns=r.max_turns, output_tokens=r.tool.output_tokens,
                                 workers=r.tool.workers)  # fmt: skip


multiturn.sampler = digit_sampler  # type: ignore[assignment]

if __name__ == "__main__":
    entry()
