"""Shared test settings: two cores, so every heavy test runs alone with explicit thread counts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm_cli

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def compose_config(*overrides: str):
    """The raw composed config (Hydra's compose API over the shipped recipe tree), before validation."""
    from rlvr.config import compose_tree

    return compose_tree("config", ["trainer.output_dir=/tmp/unused", *overrides])


def run_rlvr(*args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None,
             fresh: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -m rlvr ...` as a process of its own (the CLI as users run it), forked from a server that has already
    imported rlvr (tests/warm_cli.py: the ~8 s of imports are paid once per session, not once per command); with
    `fresh`, a new interpreter (for a test about what the process does while or after it imports)."""
    if not fresh:
        return warm_cli.warm().run(["-m", "rlvr", *args], cwd=cwd, env=env, timeout=timeout)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"} if env is None else env
    return subprocess.run([sys.executable, "-m", "rlvr", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def _warm_cli_server():
    yield
    warm_cli.close()


def _sandbox_missing() -> str | None:
    """Why the code verifier's sandbox cannot run here (None: it can)."""
    from rlvr.verifiers import code

    try:
        code.check_sandbox()
    except code.SandboxError as e:
        return str(e)
    return None


# the code verifier's tests run real programs in bubblewrap (`make install` installs it, as it does Chromium); without
# it they skip, naming the package, like the report's browser test
requires_sandbox = pytest.mark.skipif((missing := _sandbox_missing()) is not None, reason=f"{missing}")


@pytest.fixture
def rlvr_cli():
    return run_rlvr


SHORT_RUN = ["recipe=dapo", "trainer.max_steps=2", "trainer.eval_every=1", "trainer.save_every=1", "data.eval_size=64",
             "logger.progress=false"]  # fmt: skip


@pytest.fixture(scope="session")
def short_run(tmp_path_factory) -> Path:
    """A real 2-step DAPO run (vLLM, evaluations and checkpoints at every step), shared by the tests that read one."""
    out = tmp_path_factory.mktemp("short_run") / "run"
    result = run_rlvr("train", *SHORT_RUN, f"trainer.output_dir={out}", cwd=out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    (out.parent / "console.stdout").write_text(result.stdout)  # what the person saw (tests/test_console.py)
    (out.parent / "console.stderr").write_text(result.stderr)
    return out


def on_bf16_midpoints(t):
    """`t` (float32) moved onto bf16 rounding midpoints: each value halfway between its bf16 rounding and the next bf16
    value away from zero (zeros stay), as 8% of the packaged SmolLM2's weights are (dequantized from a 4-bit GGUF).
    Round-to-nearest-even then sends each weight to its even neighbour, and any update, however small, decides it."""
    import torch

    low = t.to(torch.bfloat16)  # [same]
    high = (low.view(torch.int16) + 1).view(torch.bfloat16)  # the next bf16 value away from zero
    mid = (low.float() + high.float()) / 2  # exact in float32: one bit more than bf16's mantissa
    return torch.where(t == 0, t, mid)


@pytest.fixture(scope="session")
def midpoint_model(tmp_path_factory) -> Path:
    """The built-in model's folder with every weight on a bf16 rounding midpoint (on_bf16_midpoints), not `builtin:`, so
    that its settings come from the device rules and the tests' overrides."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from rlvr.models import resolve_model_path

    folder = tmp_path_factory.mktemp("midpoints") / "model"
    shutil.copytree(resolve_model_path("builtin:tiny-arith"), folder)
    state = load_file(folder / "model.safetensors")
    save_file({k: on_bf16_midpoints(v) if v.dtype == torch.float32 else v for k, v in state.items()},
              folder / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    return folder


# The longest files first (measured, docs/measured/test_suite.md): make test's two pytest-xdist workers take whole files
# in collection order, so the long ones start at once and the short ones fill in behind them, and both workers finish
# together (longest-first scheduling). Tests keep their order within a file.
LONGEST_FIRST = ("test_e2e.py", "test_resume.py", "test_learner_dist.py", "test_sync_check.py", "test_tools_run.py",
                 "test_guards.py", "test_thinking_run.py", "test_lora.py", "test_console.py", "test_config.py",
                 "test_verifier_math_cases.py", "test_eval_command.py", "test_gym_catalogue.py")  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
