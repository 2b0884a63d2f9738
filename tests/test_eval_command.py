"""`rlvr eval` through the CLI, real vLLM: a checkpoint's evaluation reproduces what its run logged at that step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr import checkpoint


def logged(out: Path, step: int) -> dict[str, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {k: v for k, v in next(r for r in rows if r["step"] == step).items() if k.startswith("eval/")}


def test_eval_of_a_checkpoint_reproduces_its_step(short_run, rlvr_cli, tmp_path):
    out = tmp_path / "eval"
    result = rlvr_cli("eval", f"run={checkpoint.step_dir(short_run, 1)}", "eval.n=4", f"output_dir={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["step"] == 1 and report["prompts"] == 64 and report["eval"]["n"] == 4
    metrics, want = report["metrics"], logged(short_run, 1)
    assert want and {k: metrics[k] for k in want} == want  # every greedy metric, exactly as training logged it
    assert metrics["eval/pass@1"] == pytest.approx(metrics["eval/mean@4"], abs=1e-15)
    assert metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= metrics["eval/pass@4"]
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 64 * 5 and [r["kind"] for r in rows[:5]] == ["eval"] + ["eval_sampled"] * 4
    assert [r["sample"] for r in rows[1:5]] == [0, 1, 2, 3] and len({r["id"] for r in rows[:5]}) == 1
    greedy = [r for r in rows if r["kind"] == "eval"]
    assert sum(r["correct"] for r in greedy) / 64 == metrics["eval/accuracy"]
    sampled = [r for r in rows if r["kind"] == "eval_sampled"]
    assert sum(r["correct"] for r in sampled) / len(sampled) == pytest.approx(metrics["eval/mean@4"], abs=1e-15)
    assert {"prompt", "completion", "gold", "extracted", "outcome"} <= set(rows[0])
    assert "eval/accuracy" in result.stdout and "pass@4" in result.stdout
    assert "rlvr eval: 64 held-out prompts; gold answers 100.0% readable" in result.stdout  # checked before the model loaded


def test_eval_of_a_run_folder_uses_its_final_model(short_run, rlvr_cli, tmp_path):
    result = rlvr_cli("eval", f"run={short_run}", "eval.n=0", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["step"] == 2 and report["model"] == str(short_run / "model")
    assert {k: report["metrics"][k] for k in logged(short_run, 2)} == logged(short_run, 2)


def test_eval_errors_name_the_folder_or_the_override(short_run, rlvr_cli, tmp_path):
    result = rlvr_cli("eval", f"run={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and f"run={tmp_path} is neither a run folder" in result.stderr
    result = rlvr_cli("eval", f"run={short_run}", "data=gym", cwd=tmp_path)
    assert result.returncode == 2 and "so data=gym cannot be applied" in result.stderr
    assert f"model.path={short_run / 'model'}" in result.stderr
    result = rlvr_cli("eval", "eval.nn=3", cwd=tmp_path)
    assert result.returncode == 2 and "Did you mean 'eval.n'" in result.stderr


# ---- which model and which config `run=` means (no engine) ----


def compose_eval(*overrides: str):
    from rlvr.config import compose_tree

    return compose_tree("eval", ["output_dir=/tmp/unused", *overrides])


def fake_run(folder: Path, *, final: int | None, checkpoints: tuple[int, ...], eval_n: int = 0) -> Path:
    """A run folder's layout (config.yaml, model/ with its step, complete checkpoints); no weights."""
    import yaml
    from conftest import compose_config
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(compose_config(f"eval.n={eval_n}", "eval.temperature=0.6"), resolve=True)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    if final is not None:
        (folder / "model").mkdir()
        (folder / "model" / "rlvr_step.json").write_text(json.dumps({"step": final}))
    for step in checkpoints:
        (checkpoint.step_dir(folder, step) / "model").mkdir(parents=True)
        (checkpoint.step_dir(folder, step) / checkpoint.MARKER).write_text(json.dumps({"step": step}))
    return folder


def test_run_means_the_newest_weights(tmp_path):
    from rlvr.eval_command import locate

    done = fake_run(tmp_path / "done", final=4, checkpoints=(2, 4))
    assert locate(done).model == done / "model" and locate(done).step == 4
    extended = fake_run(tmp_path / "extended", final=4, checkpoints=(4, 6))  # continued to max_steps=8, killed at 7
    assert locate(extended).model == checkpoint.step_dir(extended, 6) / "model" and locate(extended).step == 6
    going = fake_run(tmp_path / "going", final=None, checkpoints=(2,))
    assert locate(going).step == 2 and locate(going).run == going
    assert locate(checkpoint.step_dir(done, 2)).run == done  # a checkpoint folder belongs to its run


def test_run_config_keeps_the_runs_settings_under_the_overrides(tmp_path):
    from rlvr.config import ConfigError
    from rlvr.eval_command import locate, run_config

    target = locate(fake_run(tmp_path / "run", final=2, checkpoints=()))
    overrides = ["data.eval_size=77", "data.system_prompt=yes", "eval.top_p=0.9"]
    cfg = run_config(target, compose_eval(f"run={target.run}", *overrides), [f"run={target.run}", *overrides])
    assert cfg.data.eval_size == 77 and cfg.data.system_prompt == "yes"  # Hydra's parse ('yes' stays a string)
    assert cfg.eval.temperature == 0.6 and cfg.eval.top_p == 0.9  # the run's eval settings, the override on top
    assert cfg.eval.n == 8  # the run evaluated greedily only: rlvr eval's default n
    assert cfg.model.path == str(target.model) and cfg.trainer.max_steps == 200
    sampled = locate(fake_run(tmp_path / "sampled", final=2, checkpoints=(), eval_n=4))
    assert run_config(sampled, compose_eval(), []).eval.n == 4  # a run that sampled keeps its n
    for bad in ("model.path=/elsewhere", "data=gym"):
        with pytest.raises(ConfigError, match=f"so {bad} cannot be applied"):
            run_config(target, compose_eval(), [bad])


def test_run_config_of_an_older_run_fills_keys_added_since(tmp_path):
    import yaml

    from rlvr.config import validate
    from rlvr.eval_command import locate, run_config

    folder = fake_run(tmp_path / "old", final=2, checkpoints=())
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    for section, key in (("algo", "round_size"), ("algo", "pi_old"), ("data", "skip_solved")):  # keys older runs lack
        del saved[section][key]
    del saved["eval"]
    saved["trainer"]["lr"] = 1e-5  # the run's own values stay
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    cfg = validate(run_config(locate(folder), compose_eval(), []))
    assert cfg.algo.round_size.value == "adaptive" and cfg.algo.pi_old.value == "learner"
    assert cfg.data.skip_solved == 0 and cfg.eval.temperature == 1.0
    assert cfg.trainer.lr == 1e-5 and cfg.eval.n == 8


def test_summary_shows_the_timeout_shares_only_when_the_verifier_gave_up():
    from rlvr.eval_command import summary

    report = {"model": "m", "prompts": 4, "seconds": 1.0, "eval": {"n": 0},
              "metrics": {"eval/accuracy": 0.5, "eval/no_answer_frac": 0.0, "eval/timeout_frac": 0.0}}  # fmt: skip
    lines = summary(report).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["eval/accuracy", "eval/no_answer_frac"]  # no timeout: not shown
    report["metrics"]["eval/timeout_frac"] = 0.25
    lines = summary(report).splitlines()
    assert lines[3].split() == ["eval/timeout_frac", "0.2500"] and "the verifier gave up" in lines[4]


def test_summary_shows_the_code_verifiers_details_above_zero():
    from rlvr.eval_command import summary

    report = {"model": "m", "prompts": 4, "seconds": 1.0, "eval": {"n": 0},
              "metrics": {"eval/accuracy": 0.5, "eval/detail/passed": 0.5, "eval/detail/timeout": 0.0,
                          "eval/detail/wrong_answer": 0.5}}  # fmt: skip
    keys = [line.split()[0] for line in summary(report).splitlines()[1:]]
    assert keys == ["eval/accuracy", "eval/detail/passed", "eval/detail/wrong_answer"]
