"""`rlvr train [hydra overrides]`: the command line. `train` hands its argv to Hydra."""

from __future__ import annotations

import importlib.resources
import sys

import hydra
from omegaconf import DictConfig

from rlvr.config import ConfigError, unknown_key_message, validate

RECIPES = str(importlib.resources.files("rlvr.recipes"))  # the YAML tree ships inside the package
GROUPS = ("recipe", "model", "data", "logger")  # Hydra config groups: their values are checked by Hydra

USAGE = """usage: rlvr <command> [args]

commands:
  train [overrides]   train a policy; Hydra overrides, e.g. `rlvr train recipe=grpo trainer.max_steps=50`
                      (`rlvr train --help` lists the config groups, `--cfg job` prints the composed config,
                      `-m recipe=grpo,dapo trainer.seed=0,1` runs a sweep)
"""


def check_overrides(args: list[str]) -> str | None:
    """Catch a typo in an override key before Hydra composes anything; None if all keys are known."""
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue  # a Hydra flag (--cfg job, -m, --help) or its value
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra.") or key in GROUPS or key.split("@")[0] in GROUPS:
            continue
        message = unknown_key_message(key)
        if message is not None:
            return message
    return None


@hydra.main(version_base=None, config_path=RECIPES, config_name="config")
def _hydra_train(raw: DictConfig) -> None:
    try:
        cfg = validate(raw)
        from rlvr.trainer import RunStopped, train  # heavy imports (torch, vllm) only once the config is valid

        try:
            out = train(cfg)  # start-up checks (output folder, data, resume point, rewards) run before any model loads
        except RunStopped as e:  # a signal (checkpoint written) or too many non-finite steps
            print(f"rlvr train: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
    except ConfigError as e:
        print(f"rlvr train: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"done: outputs in {out}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command == "train":
        problem = check_overrides(rest)
        if problem is not None:
            print(f"rlvr train: config error: {problem}", file=sys.stderr)
            return 2
        sys.argv = ["rlvr train", *rest]  # Hydra reads sys.argv
        _hydra_train()
        return 0
    print(f"rlvr: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
