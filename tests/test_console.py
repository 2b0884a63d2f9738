"""rlvr.console: what a person sees. rlvr's own lines on the console; everything other libraries print (Python
loggers, warnings, C-level writes to fds 1 and 2) in the run's rlvr.log; the few library messages that matter on both;
an error as the command's last line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rlvr import console

# Markers of other libraries' lines (vLLM's logger prefix, Triton, torch's C++ warnings, transformers' and
# safetensors' progress bars, Python warnings, nanobind's leak report at exit).
LIBRARY_LINE = re.compile(r"vllm|triton|\[W\d{4}|torch|transformers|warning|it/s\]|loading|nanobind|NUMA|LD_PRELOAD", re.I)


def test_a_runs_console_holds_rlvr_lines_only_and_the_log_the_rest(short_run):
    """A real run (conftest.short_run, console captured without a terminal): stdout holds the start-up summary,
    plain progress lines, checkpoints and the final folder; stderr nothing; rlvr.log what vLLM, Triton and
    transformers printed, and rlvr's own lines among them."""
    stdout = (short_run.parent / "console.stdout").read_text()
    stderr = (short_run.parent / "console.stderr").read_text()
    lines = stdout.splitlines()
    assert [line for line in lines if LIBRARY_LINE.search(line)] == []
    assert stderr == ""
    assert lines[0].startswith("rlvr train: dapo | ")
    assert [line.split()[0] for line in lines[1:5]] == ["model", "data", "device", "output"]
    assert "builtin:tiny-arith" in lines[1] and "parameters" in lines[1]
    assert re.search(r"[\d,]+ training prompts, 64 held out; gold answers 100\.0% readable$", lines[2])
    assert f"output  {short_run} " in lines[4]
    # without a terminal: a plain line at each evaluation (every step here) and no carriage returns of a live bar
    assert [line.split(" |")[0] for line in lines if line.startswith("step ")] == ["step 0/2", "step 1/2", "step 2/2"]
    assert "\r" not in stdout
    assert lines[-1] == f"done: outputs in {short_run}"

    log = (short_run / console.LOG_FILE).read_text()
    assert "Triton" in log  # vLLM's import-time notes, written before the run's folder was known, were kept
    assert re.search(r"^\[[\d\- :,]+\]\[vllm[\w.]*\]\[(INFO|WARNING)\] - ", log, re.M)  # vLLM's loggers, via the root
    assert "Writing model shards" in log or "Loading weights" in log  # the libraries' progress bars
    assert f"[rlvr] done: outputs in {short_run}" in log  # rlvr's lines too, in order with the rest
    assert not (short_run.parent / "outputs").exists()  # trainer.output_dir set: Hydra made no folder of its own
    assert (short_run / ".hydra" / "overrides.yaml").is_file()  # its record of the overrides is in the run's folder


def test_an_error_after_the_imports_is_the_last_line(rlvr_cli, tmp_path):
    """A data error found after vLLM and Triton were imported: the error is the only line, exit status 2; the
    teardown (nanobind's leak report for Triton's bindings, where Triton is installed) goes to the log."""
    out = tmp_path / "run"
    result = rlvr_cli("train", "data=gym", "data.name=nope_task", f"trainer.output_dir={out}", cwd=tmp_path, fresh=True)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()]  # one line, nothing after it
    assert result.stderr.startswith("rlvr train: config error: data.name: no reasoning-gym dataset 'nope_task'. Did you mean")
    log = (out / console.LOG_FILE).read_text()
    assert "[rlvr] rlvr train: config error: data.name" in log and "Triton" in log


CAPTURED = """
import logging, os, sys, warnings
from pathlib import Path
from rlvr import console

library = logging.getLogger("fake_library")
library.propagate = False
library.addHandler(logging.StreamHandler(sys.stderr))
with console.capture(verbose=VERBOSE):
    print("print before the folder")
    os.write(2, b"c-level stderr before the folder\\n")
    console.log_to(Path(sys.argv[1]))
    os.write(1, b"c-level stdout\\n")
    library.warning("a library's own handler")
    logging.getLogger("propagating.library").info("an info record")
    warnings.warn("a python warning", stacklevel=1)
    console.say("rlvr's own line")
    logging.getLogger("transformers").warning("Token indices sequence length is longer than the specified maximum "
                                              "sequence length for this model (900 > 512)")
print("after")  # the process's output is back where it was
"""
LIBRARY_OUTPUT = ["print before the folder", "c-level stderr before the folder", "c-level stdout",
                  "a library's own handler", "[propagating.library][INFO] - an info record", "UserWarning: a python warning"]  # fmt: skip
RELAYED = ("transformers: Token indices sequence length is longer than the specified maximum sequence length for this "
           "model (900 > 512)")  # fmt: skip


def run_captured(tmp_path, verbose: bool) -> subprocess.CompletedProcess[str]:
    """The snippet above in a process of its own (pytest's capture would stand between print and fd 1)."""
    code = CAPTURED.replace("VERBOSE", str(verbose))
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True)


def test_capture_sends_library_output_to_the_log(tmp_path):
    """Every way a library prints: Python's print, C-level writes to fds 1 and 2, a logger with its own handler
    (transformers' and vLLM's do not propagate), a propagating logger, warnings; written before the run's folder is
    known and after. rlvr's own line and a relayed warning reach the console."""
    result = run_captured(tmp_path, verbose=False)
    assert result.stdout == "rlvr's own line\nafter\n"
    assert result.stderr == RELAYED + "\n"
    log = (tmp_path / console.LOG_FILE).read_text()
    for text in [*LIBRARY_OUTPUT, "[rlvr] rlvr's own line", RELAYED]:
        assert text in log, text
    assert log.index("before the folder") < log.index("c-level stdout") < log.index("[rlvr] rlvr's own line")


def test_verbose_leaves_library_output_on_the_console(tmp_path):
    """logger.verbose=true: other libraries print where they would without rlvr; the log holds rlvr's lines."""
    result = run_captured(tmp_path, verbose=True)
    for text in LIBRARY_OUTPUT:
        assert text in result.stdout + result.stderr, text
    assert (tmp_path / console.LOG_FILE).read_text().strip().splitlines()[-1].endswith("[rlvr] rlvr's own line")


# What `rlvr train recipe=dr_grpo` printed before rlvr's first line (issue 24): none of it is for the user to act on.
NOISE = [
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect the random state of the Python process that launched vLLM.",
    "This model does not officially support disabling chunked prefill. Disabling this manually may cause the engine to crash or produce incorrect outputs.",
    "max_num_batched_tokens (8192) exceeds max_num_seqs * max_model_len (3584). This may lead to unexpected behavior.",
    "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.",
    "Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.",
    "Model Runner V2 requires Triton; using the V1 model runner instead.",
    "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
    "libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD`",
    "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.",
    "Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0).",
]
MATTERS = [
    "Qwen2ForCausalLM LOAD REPORT from: /models/x\nKey | Status\nlm_head.weight | MISSING",
    "The repository for org/model contains custom code which must be executed to correctly load the model. Please pass "
    "the argument `trust_remote_code=True` to allow custom code to be run.",
    "Token indices sequence length is longer than the specified maximum sequence length for this model (900 > 512).",
]


@pytest.mark.parametrize("message", NOISE)
def test_library_noise_stays_in_the_log(message):
    assert not console.relayed(message)


@pytest.mark.parametrize("message", MATTERS)
def test_library_messages_a_user_must_act_on_reach_the_console(message):
    assert console.relayed(message)


def test_progress_without_a_terminal_prints_every_10_steps_evaluations_and_the_last(capsys):
    progress = console.Progress(25, 0, live=True)  # live is asked for, but stdout is not a terminal here
    for step in range(1, 26):
        progress.update({"step": step, "reward/mean": step / 100, "perf/tokens_per_s": 1000.0,
                         **({"eval/accuracy": 0.5} if step == 5 else {})})  # fmt: skip
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" |")[0] for line in lines] == ["step 5/25", "step 10/25", "step 20/25", "step 25/25"]
    assert lines[0].startswith("step 5/25 | reward 0.050 | eval acc 0.500 | 1,000 tok/s | ETA ")
    assert "eval acc 0.500" in lines[-1]  # the last held-out accuracy stays shown


def test_a_crash_before_the_run_folder_is_known_keeps_the_log(tmp_path):
    """What libraries printed before a command failed, and before its folder was known, is kept (in the temporary
    folder) and named on the console with the traceback."""
    code = """
import os, sys
from rlvr import console
with console.capture(verbose=False):
    os.write(2, b"a library's last words\\\\n")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        console.crash("rlvr train: unexpected error")
"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert result.stdout == ""
    first, *rest = result.stderr.splitlines()
    (log,) = tmp_path.glob("rlvr-*.log")
    assert first == f"rlvr train: unexpected error (other libraries' output: {log})"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "RuntimeError: boom"
    assert "a library's last words" in log.read_text() and "RuntimeError: boom" in log.read_text()


def test_output_dir_becomes_hydras_run_folder(tmp_path):
    """trainer.output_dir=X: Hydra's folder is X (no outputs/ elsewhere); an existing X (a resume) gets no .hydra/ of
    this command's; a sweep, an explicit hydra.run.dir, or a folder that cannot be made keep Hydra's own."""
    from rlvr.cli import with_output_dir

    new, old = tmp_path / "new", tmp_path / "old"
    old.mkdir()
    key = "trainer.output_dir"
    assert with_output_dir(["recipe=grpo", f"{key}={new}"], key) == ["recipe=grpo", f"{key}={new}", f"hydra.run.dir={new}"]
    assert with_output_dir([f"{key}={old}"], key) == [f"{key}={old}", f"hydra.run.dir={old}", "hydra.output_subdir=null"]
    assert with_output_dir([f"+{key}={new}"], key)[-1] == f"hydra.run.dir={new}"
    for args in (["-m", f"{key}={new}"], [f"{key}={new}", "hydra.run.dir=elsewhere"], ["recipe=grpo"]):
        assert with_output_dir(args, key) == args
    (tmp_path / "a_file").write_text("")
    args = [f"{key}={tmp_path / 'a_file' / 'out'}"]  # the start-up check names it (tests/test_guards.py)
    assert with_output_dir(args, key) == args
