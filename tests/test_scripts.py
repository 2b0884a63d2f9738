"""Every script that README.md, docs/guide/*.md or the Makefile names runs here at a smoke size (seconds: a tiny model,
a step or two), in a process of its own as a person runs it (forked warm: tests/warm_cli.py), and ends on one JSON line with the keys its docstring promises.
scripts/gpu_check.py's smoke is tests/test_gpu_check.py's, scripts/config_reference.py's tests/test_config_reference.py's.

The scripts that build a learner build it through scripts/bench_config.py (the recipe tree composed, validated, every
`auto` resolved by rlvr.settings.for_this_machine, then Learner.from_config; the loss is rlvr.learner.loss_options),
the way `rlvr train` builds its own, so that a settings change cannot leave a benchmark behind (bench_learner.py once
handed the Learner micro_batch_tokens='auto', which only the trainer's resolution turns into a number).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path

import pytest
from conftest import requires_sandbox
from warm_cli import warm

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "offline",
       "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
# scripts a smoke test elsewhere covers, or that cannot run at a smoke size (the reason)
ELSEWHERE = {
    "gpu_check.py": "tests/test_gpu_check.py (--allow-cpu)",
    "config_reference.py": "tests/test_config_reference.py",
    "mutation.py": "make mutation: mutmut over the pure core, ~1 hour on 2 shared cores; it has no smoke size",
}
TESTED_HERE = {"bench_main_job.py", "bench_learner.py", "bench_verifiers.py", "bench_code.py", "bench_real_model.py",
               "bench_peer_trl.py", "measure_memory.py", "build_tiny_model.py", "make_sums.py", "bench_push.py",
               "bench_sync_gap.py", "peak.py", "profile_update.py", "make_tool_shots.py", "bench_envs.py"}  # fmt: skip


def run_script(name: str, *args: str, cwd: Path, timeout: float = 240) -> dict:
    """`python scripts/<name> args` in a process of its own; its last stdout line, parsed (it must be one JSON object)."""
    result = warm().run([SCRIPTS / name, *args], cwd=cwd, env=ENV, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-3000:]
    return json.loads(lines[-1])


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_every_listed_script_has_a_smoke_test():
    texts = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs" / "guide").glob("*.md"))]
    listed = {m for path in texts for m in re.findall(r"scripts/(\w+\.py)", path.read_text())}
    assert listed, "no script named in README.md, docs/guide or the Makefile"
    assert listed <= TESTED_HERE | set(ELSEWHERE), listed - TESTED_HERE - set(ELSEWHERE)
    for name in TESTED_HERE | set(ELSEWHERE):
        assert (SCRIPTS / name).is_file(), name


def test_scripts_build_learners_as_rlvr_train_does():
    """No script builds a Learner or a loss by hand: Learner.from_config and rlvr.learner.loss_options, through
    scripts/bench_config.py (the keyword constructor and loss_kwargs= are gone; a copy of either would drift)."""
    for path in sorted(SCRIPTS.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"\bLearner\(", text), f"{path.name} calls Learner(...): use bench_config.build_learner"
        assert "loss_kwargs" not in text and "LOSS_KWARGS" not in text, f"{path.name}: use bench_config.loss_options"
        assert "LossOptions(" not in text, f"{path.name} builds LossOptions by hand: use bench_config.loss_options"


@pytest.mark.slow  # (~15 s: two torchrun launches)
def test_bench_push_smoke(tmp_path):
    """scripts/bench_push.py on the built-in model, 2 gloo ranks, one push each way: the per-unit gather takes fewer
    all-gathers than the per-parameter one (5 against 36: the root and 4 layers, against every sharded parameter)."""
    out = run_script("bench_push.py", "--models", "tiny", "--pushes", "1", "--json", cwd=tmp_path)["tiny"]
    assert out["world"] == 2 and (out["unit_gathers"], out["unit_bf16_gathers"], out["per_parameter_gathers"]) == (5, 5, 36)
    assert positive(out["unit_s"]) and positive(out["unit_bf16_s"]) and positive(out["per_parameter_s"])


@pytest.mark.slow  # (~20 s: one engine, two steps)
def test_bench_sync_gap_smoke(tmp_path):
    """scripts/bench_sync_gap.py on the built-in model, a bf16 learner beside its float32 engine, 2 steps of rlvr's push:
    a start-up gap, then every step's gap, the update's move and the rollout's mismatch, all finite and past zero."""
    out = run_script("bench_sync_gap.py", "--smoke", cwd=tmp_path)
    assert (out["push"], out["precision"], out["engine_dtype"]) == ("rounded", "bf16", "float32")
    assert [r["step"] for r in out["steps"]] == [0, 1, 2] and 0 < out["start_gap"] < 0.5
    for r in out["steps"][1:]:
        assert 0 < r["sync/gap"] < 0.5 and r["sync/moved"] > 0 and 0 < r["rollout/logprob_mismatch"] < 0.5, r


@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_bench_learner_smoke(tmp_path):
    """make bench-learner's code at a smoke size: the built-in model in worlds 1 (the plain module) and 2 (FSDP2)."""
    out = run_script("bench_learner.py", "--smoke", "--json", cwd=tmp_path)
    assert out["smoke"] is True and [r["world"] for r in out["results"]] == [1, 2]
    assert positive(out["peak"]["float32"]) and positive(out["peak"]["bfloat16"]) and out["peak"]["threads"] == 2
    # the built-in model (4 layers, width 128, 1,061,248 matmul weights), 8 rows of 16 real tokens: rlvr.flops' count
    expected = 3 * 8 * (2 * 1_061_248 * 16 + 2 * 4 * 128 * 16 * 17) / 1e9
    for r in out["results"]:
        assert positive(r["update_tokens_per_s"]) and positive(r["update_s"]) and positive(r["logprobs_s"])
        assert len(r["peak_mib"]) == r["world"] and all(positive(x) for x in r["peak_mib"] + r["mem_after_build_mib"])
        assert isinstance(r["micro_batch_tokens"], int) and r["micro_batch_tokens"] >= 0  # resolved: never "auto"
        assert r["precision"] == "fp32"  # the built-in model's own setting, wherever it runs
        assert r["sharded"] is (r["world"] > 1)
        assert r["params"] == r["trained_params"] > 0
        assert r["update_gflop"] == pytest.approx(expected, rel=1e-12)  # every rank counts the whole mini-batch
        assert r["update_gflops_per_s"] == pytest.approx(expected / r["update_s"]) and 0 < r["peak_share"] < 1.5
    one, two = out["results"]
    assert one["pg_loss"] == pytest.approx(two["pg_loss"], rel=1e-4, abs=1e-6)  # the same update, over 1 or 2 ranks
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-4)


@pytest.mark.slow  # (~20 s: make test-slow, which CI runs too)
def test_bench_learner_realistic_smoke(tmp_path):
    """make bench-learner-realistic's code at a smoke size (2 layers, 8 rows): its JSON line's keys (the Makefile's)."""
    out = run_script("bench_learner.py", "--realistic", "--smoke", "--json", cwd=tmp_path)
    for key in ("update_tokens_per_s", "naive_tokens_per_s", "logprobs_tokens_per_s", "peak_rss_mb", "naive_peak_rss_mb",
                "speedup", "real_tokens", "padded_tokens", "update_gflops_per_s", "naive_update_gflops_per_s", "peak_share",
                "naive_peak_share"):  # fmt: skip
        assert positive(out[key]), (key, out[key])
    assert out["update_gflops_per_s"] / out["naive_update_gflops_per_s"] == pytest.approx(out["speedup"])  # the same count
    assert out["smoke"] is True and out["rows"] == 8 and out["num_hidden_layers"] == 2
    assert isinstance(out["micro_batch_tokens"], int) and out["micro_batch_tokens"] > 0  # trainer.micro_batch_tokens=auto, resolved
    assert isinstance(out["logits_chunk_tokens"], int) and out["logits_chunk_tokens"] > 0
    assert out["precision"] in ("fp32", "bf16") and isinstance(out["activation_checkpointing"], bool)
    assert out["loss"]["ratio"] == "token" and out["loss"]["aggregation"] == "token_mean"  # the recipe's (DAPO)
    assert (out["loss"]["clip_low"], out["loss"]["clip_high"]) == (0.2, 0.28) and out["loss"]["max_len"] == out["response_max"]


def test_peak_smoke(tmp_path):
    """scripts/peak.py: both dtypes' matmul rates on 1 thread, the size shrunk where one call would take too long."""
    out = run_script("peak.py", "--threads", "1", "--size", "256", "--seconds", "0.05", cwd=tmp_path, timeout=120)
    assert out["threads"] == 1 and out["device"] == "cpu" and positive(out["float32"]) and positive(out["bfloat16"])
    assert set(out["sizes"]) == {"float32", "bfloat16"} and all(64 <= n <= 256 for n in out["sizes"].values())


@pytest.mark.slow  # (~15 s: make test-slow, which CI runs too)
def test_profile_update_smoke(tmp_path):
    """scripts/profile_update.py at a smoke size: the kinds add up to the profiled time; the count is rlvr.flops'."""
    out = run_script("profile_update.py", "--smoke", "--json", cwd=tmp_path)
    assert out["smoke"] is True and out["rows"] == 4 and out["precision"] == "fp32"
    assert sum(out["kinds_ms"].values()) == pytest.approx(out["profiled_ms"], rel=1e-6)  # (the kinds fit in the wall time)
    assert out["kinds_ms"]["matmul"] > 0 and out["ops"][0]["ms"] >= out["ops"][-1]["ms"]
    assert out["gflop"] == pytest.approx(3 * 4 * (2 * 1_061_248 * 11 + 2 * 4 * 128 * 11 * 12) / 1e9, rel=1e-12)
    assert out["gflops_per_s"] == pytest.approx(out["gflop"] / out["update_ms"] * 1e3) and 0 < out["peak_share"] < 1.5


@pytest.mark.slow  # (~20 s: make test-slow, which CI runs too)
def test_profile_update_realistic_smoke(tmp_path):
    """scripts/profile_update.py --realistic at a smoke size: SmolLM2's shape (2 layers) on bench_learner's long-tailed
    batch (8 rows, responses up to 32), updated against the old logprobs; one update profiled."""
    out = run_script("profile_update.py", "--realistic", "--smoke", "--json", cwd=tmp_path)
    assert out["realistic"] is True and out["model"] == "135m" and out["rows"] == 8
    assert sum(out["kinds_ms"].values()) == pytest.approx(out["profiled_ms"], rel=1e-6)
    assert out["kinds_ms"]["matmul"] > 0 and positive(out["gflop"]) and 0 < out["peak_share"] < 1.5


@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_measure_memory_smoke(tmp_path):
    """scripts/measure_memory.py at a smoke size: rlvr.memory's prediction against the live tensors of a real update."""
    rows = run_script("measure_memory.py", "--smoke", "--json", cwd=tmp_path)
    assert [(r["shape"], r["setting"]) for r in rows] == [("llama", "fp32"), ("llama", "bf16"), ("qwen2", "fp32"), ("qwen2", "bf16")]
    for r in rows:
        assert positive(r["measured"]) and positive(r["predicted"]) and positive(r["params"])
        assert sum(r["parts"].values()) == r["predicted"]
        assert abs(r["ratio"] - 1) <= 0.1, r  # measured 0.998-1.000 at this size


@pytest.mark.parametrize(
    ("mode", "keys"),
    [
        ([], {"verifications_per_s", "rates", "n", "workers", "reps", "pool_start_s"}),
        (["--per-pair"], {"pairs", "median_ms", "p99_ms", "max_ms", "corpus_wrong", "corpus"}),
        (["--reward-step"], {"completions", "calls", "median_ms"}),
    ],
    ids=["pool", "per-pair", "reward-step"],
)
def test_bench_verifiers_smoke(tmp_path, mode, keys):
    out = run_script("bench_verifiers.py", "--smoke", *mode, cwd=tmp_path)
    assert keys <= set(out), keys - set(out)
    if not mode:
        assert positive(out["verifications_per_s"]) and out["n"] == 64 and out["reps"] == 1
    elif mode == ["--per-pair"]:
        assert out["pairs"] == out["corpus"] + 32 and positive(out["median_ms"]) and out["max_ms"] >= out["p99_ms"]
    else:
        assert out["completions"] == 64 * 8 and out["calls"] == 3 and positive(out["median_ms"])  # DAPO: 64 prompts x 8


@requires_sandbox
@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_bench_code_smoke(tmp_path):
    out = run_script("bench_code.py", "--smoke", "--json", cwd=tmp_path)
    for key in ("start_ms_bwrap", "start_ms_harness_only", "programs_per_s", "reward_step_s_code",
                "reward_step_s_code_one_hung", "reward_step_s_math"):  # fmt: skip
        assert positive(out[key]), (key, out.get(key))


@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_build_tiny_model_smoke(tmp_path):
    out = run_script("build_tiny_model.py", "--smoke", "--out", str(tmp_path / "tiny"), cwd=tmp_path)
    assert out["steps"] == 2 and out["held_out"] == 64 and positive(out["params"])
    assert 0 <= out["val_acc"] <= 1 and 0 <= out["held_out_acc"] <= 1
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "tiny" / name).is_file(), name
    # --smoke never overwrites the shipped model: it needs --out
    result = warm().run([SCRIPTS / "build_tiny_model.py", "--smoke"], cwd=tmp_path, env=ENV, timeout=120)
    assert result.returncode == 2 and "--out" in result.stderr


def test_make_sums(tmp_path):
    out = run_script("make_sums.py", str(tmp_path / "sums.jsonl"), "--rows", "20", cwd=tmp_path, timeout=60)
    assert out == {"path": str(tmp_path / "sums.jsonl"), "rows": 20, "seed": 0}
    rows = [json.loads(line) for line in (tmp_path / "sums.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and all("\\boxed{}" in r["prompt"] and r["answer"].isdigit() for r in rows)


def test_make_tool_shots(tmp_path):
    out = run_script("make_tool_shots.py", str(tmp_path), "--train", "10", "--eval", "4", cwd=tmp_path, timeout=60)
    assert out == {"files": {str(tmp_path / f"{v}_{s}.jsonl"): n for v in ("tools", "plain") for s, n in (("train", 10), ("eval", 4))}}
    read = {f"{v}_{s}": [json.loads(line) for line in (tmp_path / f"{v}_{s}.jsonl").read_text().splitlines()]
            for v in ("tools", "plain") for s in ("train", "eval")}  # fmt: skip
    assert [r["prompt"][-1] for r in read["tools_train"]] == [r["prompt"][-1] for r in read["plain_train"]]  # same questions
    held_out = {r["prompt"][-1]["content"] for r in read["tools_eval"]}
    assert not held_out & {r["prompt"][-1]["content"] for r in read["tools_train"]}
    assert [m["role"] for m in read["tools_eval"][0]["prompt"]] == ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    assert "<tool_call>" in read["tools_eval"][0]["prompt"][1]["content"] and "= 408" in read["plain_eval"][0]["prompt"][1]["content"]


def test_bench_envs_smoke(tmp_path):
    out = run_script("bench_envs.py", "--smoke", cwd=tmp_path, timeout=120)
    assert out["smoke"] and set(out["kinds"]) == {"sandbox (code_feedback)", "python (holds the GIL)", "textarena (GuessTheNumber)"}
    assert all(k["serial_s"] > 0 and k["threads_s"] > 0 for k in out["kinds"].values())


@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_bench_main_job_smoke(tmp_path):
    """make bench's code: `rlvr train recipe=dapo` (1 step), timed and summarised as the benchmark does."""
    out = run_script("bench_main_job.py", "--smoke", "--out", str(tmp_path / "bench"), cwd=tmp_path, timeout=420)
    assert out["smoke"] is True and set(out["recipes"]) == {"dapo"}
    median = out["recipes"]["dapo"]["median"]
    assert set(median) == {"start", "end", "to_target_s", "minutes", "steps_per_s", "rounds", "learner_gflops_per_s", "peak_share"}
    assert positive(median["learner_gflops_per_s"]) and 0 < median["peak_share"] < 1.5 and positive(out["peak"]["float32"])
    assert 0 <= median["start"] <= 1 and 0 <= median["end"] <= 1
    assert positive(median["minutes"]) and positive(median["steps_per_s"]) and median["rounds"] >= 1
    assert median["to_target_s"] is None or positive(median["to_target_s"])
    assert set(out["recipes"]["dapo"]["seeds"]) == {"0"}


@pytest.mark.slow  # (15-40 s each: make test-slow, which CI runs too)
def test_bench_real_model_smoke(tmp_path):
    """make bench-real's code (the launch, each row timed as it appears, the table, the JSON) on the built-in model."""
    out = run_script("bench_real_model.py", "--smoke", "--out", str(tmp_path / "bench"), cwd=tmp_path, timeout=420)
    assert out["smoke"] is True and set(out["seeds"]) == {"0"}
    r = out["seeds"]["0"]
    assert set(r) == {"start", "in_budget", "end", "to_plus15_min", "minutes", "step_s", "rollout_s", "update_s"}
    assert 0 <= r["start"] <= r["in_budget"] <= 1 and 0 <= r["end"] <= 1
    assert all(positive(r[k]) for k in ("minutes", "step_s", "rollout_s", "update_s"))


@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason="trl is not installed (not a dependency of rlvr: `make bench-peer` installs trl==1.16.0)")  # fmt: skip
def test_bench_peer_trl_smoke(tmp_path):
    out = run_script("bench_peer_trl.py", "--smoke", "--out", str(tmp_path / "trl"), cwd=tmp_path, timeout=420)
    assert out["smoke"] is True and set(out["seeds"]) == {"0"}
    evals = out["seeds"]["0"]["evals"]
    assert len(evals) >= 2 and all(0 <= e["eval/accuracy"] <= 1 and e["time/elapsed_s"] > 0 for e in evals)
