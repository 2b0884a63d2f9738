"""`rlvr plan`: Qwen2.5-7B does not fit one 80 GiB GPU and says what would, fits eight; Qwen2.5-0.5B fits one; the
resolved CUDA settings; start-up errors on that many ranks; the last line is JSON; no torch at import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlvr import plan
from rlvr.memory import GIB

FIXTURES = Path(__file__).parent / "fixtures"
Q7B = f"model.path={FIXTURES / 'qwen2.5-7b.json'}"
Q05B = f"model.path={FIXTURES / 'qwen2.5-0.5b.json'}"
N7B, N05B = 7_615_616_512, 494_032_768


def run_plan(capsys, *args: str) -> tuple[int, dict, str]:
    """(exit code, the last line's JSON, everything printed)."""
    code = plan.main(list(args))
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1]), out


def test_7b_does_not_fit_one_80_gib_gpu_and_names_what_would(capsys):
    code, result, out = run_plan(capsys, Q7B, "plan.gpus=1", "plan.gpu_memory_gib=80")
    assert code == 1 and result["fits"] is False and "fits: no" in out
    # fp32 weights and AdamW's two moments stay through the rollout phase: 12 bytes x 7.6B = 85.1 GiB > 72 GiB usable
    assert abs(result["phases"]["rollout"]["learner_state"] - 12 * N7B / GIB) < 0.01
    assert result["phases"]["learner"]["total_gib"] > 16 * N7B / GIB > result["usable_gib"] == 72.0
    knobs = [s["set"] for s in result["suggestions"]]
    # 2 GPUs: 42.6 GiB of state beside the 40 GiB engine; 3 do not split the batch (64 prompts, minibatches of 4)
    assert knobs[0] == "plan.gpus=4"  # 4 prompts per mini-batch split over 4 ranks
    assert "trainer.cpu_offload=true" in knobs and "model.lora.rank=16" in knobs
    assert "trainer.activation_checkpointing=true" not in knobs  # already on (auto) and not enough
    for knob in knobs[1:]:  # each named knob, applied, makes the plan fit
        assert plan.main([Q7B, *knob.split()]) == 0, knob
    capsys.readouterr()
    assert plan.main([Q7B, "plan.gpus=2"]) == 1 and plan.main([Q7B, "plan.gpus=4"]) == 0


def test_7b_with_lora_fits_one_80_gib_gpu(capsys):
    """Rank 16 on every linear layer of Qwen2.5-7B: 40,370,176 adapter parameters (28 layers x 16 x (2 x (3584 + 3584)
    + 2 x (3584 + 512) + 3 x (3584 + 18944))); the base frozen in bf16, 16 bytes a parameter for the adapter alone."""
    code, result, out = run_plan(capsys, Q7B, "plan.gpus=1", "plan.gpu_memory_gib=80", "model.lora.rank=16")
    adapter = 40_370_176
    assert code == 0 and result["fits"] is True and "LoRA rank 16 (40.4M adapter parameters)" in out
    learner = result["phases"]["learner"]
    assert abs(learner["weights"] - (2 * N7B + 4 * adapter) / GIB) < 0.01
    assert abs(learner["gradients"] - 4 * adapter / GIB) < 0.01 and abs(learner["optimizer"] - 8 * adapter / GIB) < 0.01
    assert learner["reference"] == 0  # the base with the adapter disabled
    assert abs(result["phases"]["rollout"]["learner_state"] - (2 * N7B + 12 * adapter) / GIB) < 0.01


def test_7b_fits_8_gpus(capsys):
    code, result, _ = run_plan(capsys, Q7B, "plan.gpus=8", "plan.gpu_memory_gib=80")  # the recipe as it is
    assert code == 0 and result["fits"] is True and result["problems"] == []
    rollout, learner = result["phases"]["rollout"], result["phases"]["learner"]
    assert abs(rollout["learner_state"] - 12 * N7B / 8 / GIB) < 0.01  # sharded 8 ways
    assert abs(rollout["engine_weights"] - 2 * N7B / GIB) < 0.01  # a bf16 engine on every GPU
    assert abs(rollout["total_gib"] - 0.5 * 80) - rollout["learner_state"] < 0.02  # the engine is its 50% share
    assert learner["engine"] == 0  # asleep
    assert abs(learner["weights"] + learner["gradients"] + learner["optimizer"] - 16 * N7B / 8 / GIB) < 0.01
    assert learner["total_gib"] <= 72.0


def test_a_world_the_minibatch_does_not_split_over_is_a_start_up_error(capsys):
    code, result, out = run_plan(capsys, Q7B, "plan.gpus=16", "algo.group_size=6")  # 4 x 6 = 24 rows over 16 ranks
    assert code == 2 and result["fits"] is True  # the memory fits; the run would stop at start-up
    assert "set algo.prompts_per_minibatch=8" in result["problems"][0] and "start-up error" in out


def test_0_5b_fits_one_gpu_with_cuda_settings(capsys):
    code, result, out = run_plan(capsys, Q05B)
    assert code == 0 and result["fits"] is True and result["suggestions"] == []
    s = result["settings"]
    assert (s["precision"], s["engine_dtype"], s["cuda_graphs"], s["sleep"], s["tf32"]) == (
        "bf16",
        "bfloat16",
        True,
        True,
        True,
    )
    assert "trainer.precision=bf16 (auto)" in out and "rollout.cuda_graphs=true (auto)" in out
    learner = result["phases"]["learner"]
    assert abs(learner["weights"] + learner["gradients"] + learner["optimizer"] - 16 * N05B / GIB) < 0.01
    # autocast (one rank): the bf16 casts of every matmul weight, the tied head's included
    linear = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert abs(learner["compute_weights"] - 2 * (24 * linear + 151_936 * 896) / GIB) < 0.01
    mb = result["micro_batch"]  # 512 assumed prompt tokens + 8 new ones per row, within the 16384-token budget
    assert mb["row_tokens"] == 520 and mb["tokens"] == 16384 // 520 * 520 == s["micro_batch_tokens"] // 520 * 520
    kv = result["kv_cache"]
    assert kv["bytes_per_token"] == 12_288 and kv["tokens"] == int(s["kv_cache_gib"] * GIB) // 12_288
    assert kv["round_tokens"] == 64 * 8 * 520  # B x G rows of 520 tokens on the one engine


def test_48_gib_gpus_need_a_knob_and_each_named_one_works(capsys):
    code, result, _ = run_plan(capsys, Q7B, "plan.gpus=4", "plan.gpu_memory_gib=48")
    assert code == 1 and result["phases"]["rollout"]["total_gib"] > result["usable_gib"] == 43.2
    knobs = [s["set"] for s in result["suggestions"]]
    # 5-7 GPUs split no 64-prompt step into equal shares per engine; 8 do, with the recipe's mini-batches of 4 x 8 rows
    assert knobs[:2] == ["plan.gpus=8", "rollout.gpu_memory_utilization=0.45"]
    for knob in knobs[:-1]:
        assert plan.main([Q7B, "plan.gpus=4", "plan.gpu_memory_gib=48", *knob.split()]) == 0, knob
    capsys.readouterr()


def test_config_errors_exit_2_with_json(capsys):
    code, result, _ = run_plan(capsys, Q05B, "trainer.lrr=1")
    assert code == 2 and "trainer.lr" in result["error"]
    code, result, _ = run_plan(capsys, Q05B, "plan.gpus=0")
    assert code == 2 and "plan.gpus" in result["error"]
    code, result, _ = run_plan(capsys, Q05B, "rollout.tensor_parallel_size=3", "plan.gpus=4")
    assert code == 2 and "must divide the number of ranks (4)" in result["problems"][0]


def test_world_problems_mirror_the_start_up_checks():
    from rlvr.config import validate, world_problems
    from tests.conftest import compose_config

    cfg = validate(compose_config("algo.prompts_per_step=48", "algo.prompts_per_minibatch=16"))
    assert [n for n in range(1, 17) if not world_problems(cfg, n)] == [1, 2, 4, 8, 16]


def test_no_torch_at_import_nor_while_planning():
    code = (
        "import sys; from rlvr import plan; "
        f"code = plan.main([{Q05B!r}]); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers')); "
        "print(code, heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1]
    )
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stderr
