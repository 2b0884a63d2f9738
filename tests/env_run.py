"""`python tests/env_run.py train ...` is `rlvr train ...` (and `eval`) with tests/ on the import path, so that
rollout.env=env_examples:<factory> imports: the test environments are named by import path, as users name theirs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlvr.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry()
