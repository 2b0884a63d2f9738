"""The command line: `rlvr train|eval [hydra overrides]` hand their argv to Hydra; `rlvr plan [overrides]` composes the
same tree without running anything; `rlvr report PATH...` goes to argparse.
Each command's work lives in its own module (rlvr.trainer, rlvr.eval_command, rlvr.plan, rlvr.report); this one only
dispatches."""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlvr import console
from rlvr.config import GROUPS, RECIPES, ConfigError, override_key, unknown_key_message, validate
from rlvr.eval_command import APP_KEYS
from rlvr.imports import heavy_imports

USAGE = """usage: rlvr <command> [args]

commands:
  train [overrides]   train a policy; Hydra overrides, e.g. `rlvr train recipe=grpo trainer.max_steps=50`
                      (`rlvr train --help` lists the config groups, `--cfg job` prints the composed config,
                      `-m recipe=grpo,dapo trainer.seed=0,1` runs a sweep)
  eval [overrides]    greedy accuracy, mean@n and pass@k on held-out prompts: `rlvr eval run=<run or checkpoint
                      folder>`, or `rlvr eval model.path=<model> data=gym data.name=chain_sum eval.n=16`
  plan [overrides]    what a run holds per GPU and phase, whether it fits, and what would make it fit, from the
                      model's config.json alone (`rlvr plan model.path=Qwen/Qwen2.5-7B plan.gpus=8 plan.gpu_memory_gib=80`)
  report PATH...      one offline HTML page (and a PNG per plot) comparing runs: run folders, sweep folders, or both
                      (`rlvr report multirun/2026-12-01/10-00-00`; `--out DIR`)
"""


def check_overrides(args: list[str], app_keys: tuple[str, ...] = ()) -> str | None:
    """Catch a typo in an override key before Hydra composes anything; None if all keys are known."""
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue  # a Hydra flag (--cfg job, -m, --help) or its value
        key = override_key(arg)
        if key.startswith("hydra.") or key in GROUPS or key.split("@")[0] in GROUPS or key in app_keys:
            continue
        message = unknown_key_message(key)
        if message is not None:
            return message
    return None


@hydra.main(version_base=None, config_path=RECIPES, config_name="config")
def _hydra_train(raw: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    recipe = HydraConfig.get().runtime.choices.get("recipe")
    with _errors("rlvr train"):  # (before the capture: the config says whether to capture)
        cfg = validate(raw)
    with console.capture(verbose=cfg.logger.verbose), _errors("rlvr train"):  # other libraries' output: to rlvr.log
        with heavy_imports():  # torch, vllm: only once the config is valid
            from rlvr.run_state import RunStopped
            from rlvr.trainer import train

        try:
            out = train(cfg, recipe)  # start-up checks (output folder, data, resume point, rewards) run before any model loads
        except RunStopped as e:  # a signal, too many non-finite steps, a failed write, a failing part: rlvr's words
            if e.__cause__ is not None:  # the failure's traceback: in the run's log, not on the console
                console.detail("".join(traceback.format_exception(e.__cause__)).rstrip())
            console.error(f"rlvr train: {e}")
            raise SystemExit(e.exit_code) from None
        console.say(f"done: outputs in {out}")


@hydra.main(version_base=None, config_path=RECIPES, config_name="eval")
def _hydra_eval(raw: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from rlvr import eval_command

    with console.capture(verbose=bool(raw.logger.verbose)), _errors("rlvr eval"):
        out = eval_command.run(raw, list(HydraConfig.get().overrides.task))
        console.say(f"done: eval.json and samples.jsonl in {out}")


def _discard(folder: Path) -> None:
    """Remove the run folder Hydra made for a command whose config was refused, if it holds nothing but Hydra's
    .hydra/: nothing is written for a run that never started. Rank 0's job under torchrun."""
    if os.environ.get("RANK", "0") == "0" and folder.is_dir() and [p.name for p in folder.iterdir()] == [".hydra"]:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _errors(command: str) -> Iterator[None]:
    """A config, data or model error (ConfigError) is the command's last line, with exit status 2 (a command that
    stops before its folder is known leaves none behind); an unexpected exception prints its traceback (on the
    console and in the log), with exit status 1, or, in a sweep, goes on to Hydra, which runs the other jobs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra = HydraConfig.get()
    try:
        yield
    except ConfigError as e:
        if console.log_path() is None:
            _discard(Path(hydra.runtime.output_dir))
        console.error(f"{command}: config error: {e}")
        raise SystemExit(2) from None
    except Exception as e:
        console.crash(f"{command}: unexpected error")
        if hydra.mode == RunMode.MULTIRUN:  # Hydra keeps the exception until the sweep ends: not the job's engine with it
            _release_frames(e)
            raise
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        console.error(f"{command}: interrupted")
        raise SystemExit(130) from None


def _release_frames(error: BaseException) -> None:
    """Clear the local variables of the finished frames in `error`'s traceback and in those of the exceptions it
    chains: a sweep's failed job leaves Hydra its exception, and through the frames' locals its run (the engine, the
    learner, their memory) would stay alive while the next jobs run. The traceback was printed already."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]


def with_output_dir(args: list[str], key: str) -> list[str]:
    """The overrides, with Hydra's run folder set to the command's output folder when the user names one: Hydra then
    creates no folder of its own elsewhere (its .hydra/ goes into the run's folder, or, for a folder that exists
    already, such as a run being resumed, nowhere: the run's own record stays). A sweep keeps its own folders; a
    folder that cannot be written is left to the start-up check, which names it."""
    values = [a.split("=", 1)[1] for a in args if "=" in a and override_key(a) == key]
    if not values or any(a in ("-m", "--multirun") for a in args) or any(override_key(a) == "hydra.run.dir" for a in args if "=" in a):
        return args
    folder = Path(values[-1].strip("'\""))
    if not _writable(folder):
        return args
    return [*args, f"hydra.run.dir={values[-1]}", *(["hydra.output_subdir=null"] if folder.exists() else [])]


def _writable(folder: Path) -> bool:
    """Whether `folder` is a writable folder, or could be made as one."""
    while not folder.exists():
        if folder.parent == folder:
            return False
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command in ("train", "eval"):
        problem = check_overrides(rest, APP_KEYS if command == "eval" else ())
        if problem is not None:
            print(f"rlvr {command}: config error: {problem}", file=sys.stderr)
            return 2
        output_key = "trainer.output_dir" if command == "train" else "output_dir"
        sys.argv = [f"rlvr {command}", *with_output_dir(rest, output_key)]  # Hydra reads sys.argv
        (_hydra_train if command == "train" else _hydra_eval)()
        return 0
    if command == "report":
        from rlvr import report

        return report.main(rest)
    if command == "plan":
        from rlvr import plan

        return plan.main(rest)
    print(f"rlvr: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
    return 2


def entry() -> None:
    """The `rlvr` command (and `python -m rlvr`): main, then the process's exit, whose teardown output (nanobind's leak
    reports for Triton's bindings, atexit handlers) goes to the last run's rlvr.log, not after rlvr's last line."""
    try:
        code: int | str | None = main()
    except SystemExit as e:  # a command's exit status (Hydra's task functions exit this way)
        console.quiet_exit()  # before `e` goes, and with it the frames (engine, learner) its context still holds
        code = e.code
    else:
        console.quiet_exit()
    sys.exit(code)


if __name__ == "__main__":
    entry()
