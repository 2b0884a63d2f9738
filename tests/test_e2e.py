"""End to end through the CLI: every recipe, a Hydra sweep, wandb offline; real vLLM, Hydra, transformers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

RECIPES = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "gmpo"]
FAST = ["trainer.max_steps=2", "trainer.eval_every=0", "data.eval_size=64", "logger.progress=false"]


def read_metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def check_run_folder(out: Path, recipe: str) -> None:
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert 0.0 <= rows[0]["eval/accuracy"] <= 1.0 and "eval/accuracy" in rows[-1]
    for r in rows[1:]:
        for key in ("reward/mean", "response_length/mean", "timing/step_s", "actor/clip_frac", "actor/entropy"):
            assert key in r, key
        assert r["actor/updates"] > 1  # several updates per rollout batch: the clip is live
        assert r["rollout/logprob_mismatch_max"] < 1e-4  # the engine samples from the learner's weights
        # the correct and incorrect lengths are the two parts of the mean length, weighted by the correct fraction
        cf, parts = r["reward/correct_frac"], (r.get("response_length/correct_mean"), r.get("response_length/incorrect_mean"))
        if None not in parts:
            assert cf * parts[0] + (1 - cf) * parts[1] == pytest.approx(r["response_length/mean"], rel=1e-12)
    check_clocks(rows)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["algo"]["ratio"] == ("sequence" if recipe == "gspo" else "token")
    assert (out / "model" / "model.safetensors").exists() and (out / "model" / "tokenizer.json").exists()


def check_clocks(rows: list[dict]) -> None:
    """time/elapsed_s and time/train_s on every row: non-decreasing; the loop's time is within the wall clock and at
    least the steps' own timings (it adds only the logging)."""
    elapsed, train = [r["time/elapsed_s"] for r in rows], [r["time/train_s"] for r in rows]
    assert elapsed == sorted(elapsed) and train == sorted(train) and train[0] == 0.0
    assert all(t < e for t, e in zip(train, elapsed))
    assert train[-1] >= sum(r["timing/step_s"] for r in rows[1:]) - 1e-3 * len(rows)  # rows round to 1 ms


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The seven recipes as ONE Hydra sweep (`-m recipe=grpo,dr_grpo,dapo,gspo,cispo,sapo,gmpo`): one process, one job
    and one folder per recipe, 2 steps each (the process's start-up is paid once, not seven times). Read by the recipe tests, the saved
    model's test and the sweep's own test."""
    from conftest import run_rlvr

    root = tmp_path_factory.mktemp("runs")
    folder = root / "sweep"
    # 16 prompts a step (4 mini-batches of 4: several updates, the clip live), a quarter of the recipes' 64
    result = run_rlvr("train", "-m", f"recipe={','.join(RECIPES)}", *FAST, "algo.prompts_per_step=16", f"hydra.sweep.dir={folder}",
                      cwd=root, timeout=1200)  # fmt: skip
    return result, folder


@pytest.fixture(scope="module")
def runs(sweep):
    """Each recipe's job: (the sweep's process, its folder)."""
    result, folder = sweep
    return {recipe: (result, folder / f"{i}-{recipe}") for i, recipe in enumerate(RECIPES)}


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_two_steps_and_writes_outputs(runs, recipe):
    result, out = runs[recipe]
    assert result.returncode == 0, result.stderr[-3000:]
    check_run_folder(out, recipe)
    assert "rlvr: warning" not in result.stderr  # the built-in task's answers are readable: no format warning
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 2} and all(s["kind"] == "eval" for s in samples)  # evaluations only
    assert samples[0]["prompt"].endswith("=") and samples[0]["completion"].endswith("<eos>")  # plain text, as the model saw it
    for row in [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]:
        if row.get("skipped"):  # (no informative group: no update)
            continue
        # rlvr.flops' count of the step's updates (16 prompts x 8 answers of at least 2 tokens, 3 passes) and its rate
        assert row["perf/learner_gflop"] >= 3 * 2 * 1_061_248 * 128 * 2 / 1e9, row
        assert row["perf/learner_gflops_per_s"] * row["timing/update_s"] == pytest.approx(row["perf/learner_gflop"], rel=0.05)


def test_saved_model_loads_in_transformers_and_vllm(runs):
    """The gspo run's model folder: transformers and vLLM load it and agree on greedy answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.rollout import Engine

    folder = str(runs["gspo"][1] / "model")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompts = ["12+34=", "50+07=", "88+19="]
    expected = []
    for p in prompts:
        ids = tok(p, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        expected.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    engine = Engine(folder, seed=0, max_model_len=32, dtype="float32", gpu_memory_utilization=0.5, cpu_kv_cache_gib=1)
    ids = [tuple(i) for i in tok(prompts)["input_ids"]]
    assert [c.text for c in engine.greedy(ids, max_tokens=8, stop=[])] == expected
    del engine


@pytest.fixture(scope="module")
def grpo_epochs_wandb(tmp_path_factory) -> Path:
    """One GRPO run read by two tests: mu = 2 epochs with pi_ref refreshed every step and the overlong filter on (the
    algorithm's options), logged to wandb offline (the logger: it sees the metrics, whatever the algorithm)."""
    from conftest import run_rlvr

    root = tmp_path_factory.mktemp("grpo_epochs_wandb")
    out = root / "run"
    result = run_rlvr("train", "logger=wandb", "recipe=grpo", "algo.epochs=2", "algo.ref_update_every=1",
                      "algo.overlong_filter=true", f"trainer.output_dir={out}", *FAST, cwd=root)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_epochs_reference_refresh_and_overlong_filter(grpo_epochs_wandb):
    """mu = 2 epochs over 16 mini-batches = 32 updates per step, pi_ref refreshed every step."""
    rows = read_metrics(grpo_epochs_wandb)[1:]
    assert [r["actor/updates"] for r in rows] == [32, 32]
    # the reference is refreshed at each step's end: each step's first update sees KL 0, the other 31 a policy that
    # moved away from it (k3 > 0; measured 0.24 and 0.005 nats per token)
    assert all(0.0 < r["actor/kl"] < 1.0 for r in rows), [r["actor/kl"] for r in rows]


@pytest.mark.parametrize(
    "overrides, precision, expected",
    [
        ([], "float32", False),  # the recipes: the learner's pass
        # the built-in model's engine samples in fp32 (rollout.dtype=auto resolves so), its learner computes in fp32
        (["algo.pi_old=auto", "rollout.dtype=float32"], "float32", True),
        (["algo.pi_old=auto"], "bf16", False),
        (["algo.pi_old=auto", "rollout.dtype=bfloat16"], "float32", False),
        (["algo.pi_old=auto", "rollout.dtype=auto"], "float32", False),  # unresolved: it may become bf16
        (["algo.pi_old=auto", "rollout.top_p=0.9"], "float32", False),  # the engine's are renormalized over the nucleus
        (["algo.pi_old=engine", "rollout.top_p=0.9"], "bf16", True),  # asked for
    ],
)
def test_pi_old_source(overrides, precision, expected):
    from conftest import compose_config

    from rlvr.config import validate
    from rlvr.startup import pi_old_from_engine

    assert pi_old_from_engine(validate(compose_config(*overrides)), precision) is expected


@pytest.mark.slow  # ~11 s: make test-slow (CI runs it too); make test keeps which source a run takes (above)
def test_pi_old_falls_back_to_the_learner_when_the_engine_disagrees(rlvr_cli, tmp_path):
    """algo.pi_old=engine with top_p 0.9: the engine's logprobs are renormalized over the nucleus and the learner's are
    not, so they differ by -log(nucleus mass) on most tokens. Step 1 uses the engine's (no learner pass); the learner's
    pass on the evaluation step 2 sees the gap, says so, and from then on pi_old is the learner's (a pass at step 3, which
    does not evaluate)."""
    out = tmp_path / "run"
    result = rlvr_cli("train", "recipe=dapo", "algo.pi_old=engine", "rollout.top_p=0.9", "trainer.max_steps=4",
                      "trainer.eval_every=2", "data.eval_size=64", "logger.progress=false", f"trainer.output_dir={out}",
                      cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(out)
    assert "rollout/logprob_mismatch" not in rows[1]
    assert rows[2]["rollout/logprob_mismatch_max"] > 1e-3 and rows[3]["rollout/logprob_mismatch_max"] > 1e-3
    assert "step 2: the engine's logprobs differ from the learner's" in result.stdout
    assert "pi_old comes from the learner from this step on" in result.stdout


def test_sweep_runs_one_folder_per_job(sweep):
    result, folder = sweep
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.name for p in folder.iterdir() if (p / "metrics.jsonl").exists())
    assert jobs == [f"{i}-{recipe}" for i, recipe in enumerate(RECIPES)]
    aggregation = {"grpo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm", "dapo": "token_mean",
                   "gspo": "seq_mean_token_mean", "cispo": "token_mean", "sapo": "seq_mean_token_mean",
                   "gmpo": "seq_mean_token_mean"}  # fmt: skip
    for job, recipe in zip(jobs, RECIPES):
        cfg = yaml.safe_load((folder / job / "config.yaml").read_text())
        assert cfg["algo"]["aggregation"] == aggregation[recipe]
        assert cfg["algo"]["objective"] == (recipe if recipe in ("cispo", "sapo", "gmpo") else "clip")
        assert [r["step"] for r in read_metrics(folder / job)] == [0, 1, 2]
    # each later job's clock starts at its own launch, after the job before's last write, not at the process's start
    files = [folder / job / "metrics.jsonl" for job in jobs]
    for first, second in zip(files, files[1:]):
        assert read_metrics(second.parent)[-1]["time/elapsed_s"] <= second.stat().st_mtime - first.stat().st_mtime + 0.5


def test_wandb_offline_run_has_the_metrics(grpo_epochs_wandb):
    from wandb_log import read_run

    out = grpo_epochs_wandb
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history, config = read_run(files[0])
    local = read_metrics(out)
    assert [h["_step"] for h in history] == [r["step"] for r in local] == [0, 1, 2]
    for h, r in zip(history, local):
        for key, value in r.items():
            if key != "step":
                assert h[key] == pytest.approx(value), key
    assert config["algo"]["kl_coef"] == pytest.approx(0.04) and config["trainer"]["max_steps"] == 2
    assert config["algo"]["epochs"] == 2  # the run's own overrides, not the recipe's defaults


# two CLI runs, one under torchrun (~25-35 s): make test-slow; make test keeps the learner's 1 vs 2 ranks
# (tests/test_learner_dist.py) and the loss's world-size scaling (tests/test_algo_dist.py)
@pytest.mark.slow
def test_torchrun_two_ranks_match_one_rank(rlvr_cli, tmp_path):
    """`torchrun --nproc_per_node=2`: two FSDP2 ranks, each with its own vLLM engine sampling half the prompts.
    Per-prompt seeds make the samples those of the one-process run, so the first step's rewards are identical. Both
    runs take ONE update per step (a mini-batch of all 64 prompts), so the first step's loss and gradient norm come
    from identical weights and identical rows: they differ only by float32 reordering (a different row split, an
    all-reduce), not by drift compounded over 16 updates. The model folder rank 0 writes loads in transformers."""
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    one_update = ["algo.prompts_per_minibatch=64", "trainer.max_steps=1", "eval.n=2"]
    args = ["train", "recipe=grpo", "trainer.torch_threads=1", "reward.workers=1", *FAST, *one_update]
    single = tmp_path / "single"
    result = rlvr_cli(*args, f"trainer.output_dir={single}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # two ranks on two cores
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rlvr", *args,
           f"trainer.output_dir={out}"]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # one voice on the console (rank 0's); each rank's libraries in its own log
    assert result.stdout.count("done: outputs in") == 1 and result.stdout.count("rlvr train: grpo |") == 1
    assert "[rlvr] done: outputs in" in (out / "rlvr.rank1.log").read_text() and (out / "rlvr.log").is_file()
    one, two = read_metrics(single), read_metrics(out)
    assert [r["step"] for r in two] == [0, 1] and two[1]["actor/updates"] == one[1]["actor/updates"] == 1
    # the two engines split the eval set (greedy and 2 seeded samples per prompt), then gather it back in order
    evals = [{k: v for k, v in run[0].items() if k.startswith("eval/")} for run in (one, two)]
    assert evals[0] == evals[1] and "eval/pass@2" in evals[0] and "eval/response_length_p95" in evals[0]
    for key in ("reward/mean", "reward/correct_frac", "response_length/mean", "batch/tokens"):
        assert two[1][key] == one[1][key], key
    # float32 sums over ~4k tokens, reordered by the row split and the all-reduce: relative error ~1e-6 (measured
    # 1.3e-6 on the gradient norm); a missing all-reduce or a loss off by the world size is a factor of ~2. With
    # ratio 1 the loss is -mean(A) ~ 0 (group-normalized advantages), so it is compared in absolute terms.
    for key in ("actor/entropy", "actor/grad_norm"):
        assert two[1][key] == pytest.approx(one[1][key], rel=1e-4), key
    assert two[1]["actor/pg_loss"] == pytest.approx(one[1]["actor/pg_loss"], abs=1e-6)
    assert two[1]["actor/kl"] == one[1]["actor/kl"] == 0.0  # pi_theta == pi_ref at the first update
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.config.tie_word_embeddings and sum(p.numel() for p in model.parameters()) > 1e6
