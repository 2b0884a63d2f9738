"""The warm CLI processes (tests/warm_cli.py) behave as `python script.py` / `python -m module` would: argv, working
directory, environment, separate stdout and stderr, exit status, signals, and nothing carried from one to the next."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from warm_cli import warm

SCRIPT = """
import os, sys
import rlvr.trainer  # preloaded by the server: no import time here
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("WARM_TEST"))
print("to stderr", file=sys.stderr)
print("left behind:", hasattr(rlvr.trainer, "LEFT_BEHIND"))
rlvr.trainer.LEFT_BEHIND = True  # a later child must not see this
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "sleep":
    print("sleeping", flush=True)
    import time; time.sleep(60)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def test_a_warm_child_is_a_process_of_its_own(script, tmp_path):
    env = {"WARM_TEST": "yes", "PATH": "/usr/bin"}
    result = warm().run([script, "exit", "3"], cwd=tmp_path, env=env)
    assert result.returncode == 3
    assert result.stdout == f"argv ['exit', '3'] cwd {tmp_path} env yes\nleft behind: False\n"
    assert result.stderr == "to stderr\n"
    result = warm().run([script, "raise"], cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.rstrip().endswith("ValueError: boom")
    result = warm().run([script, "done"], cwd=tmp_path)
    assert result.returncode == 0 and "left behind: False" in result.stdout and "env None" in result.stdout
    # a module run as `-m`: rlvr's own usage text, as `python -m rlvr --help` prints it
    real = subprocess.run([sys.executable, "-m", "rlvr", "--help"], capture_output=True, text=True, timeout=60)
    assert warm().run(["-m", "rlvr", "--help"], cwd=tmp_path).stdout == real.stdout


def test_signals_and_timeouts_end_a_warm_child_as_they_end_a_process(script, tmp_path):
    proc = warm().start([script, "sleep"], cwd=tmp_path)
    while "sleeping" not in proc.output()[0]:
        assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # as subprocess reports a signal
    with pytest.raises(subprocess.TimeoutExpired):
        warm().run([script, "sleep"], cwd=tmp_path, timeout=1)  # killed past its timeout, as subprocess.run does
