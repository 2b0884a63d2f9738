"""`rlvr plan`: Qwen2.5-7B does not fit one 80 GiB GPU and says what would, fits eight; Qwen2.5-0.5B fits one; the
resolved CUDA settings; start-up errors on that many ranks; the last line is JSON; no torch at import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr import plan
from rlvr.memory import GIB
from rlvr.types import Example

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
    # asleep (level 2: full-weight pushes), the engine keeps only its CUDA graphs and the sampler's scratch buffer
    assert {k for k in learner if k.startswith("engine_")} == {"engine_cuda_graphs", "engine_sampler_scratch"}
    assert learner["engine_cuda_graphs"] == rollout["engine_cuda_graphs"] > 0 and result["engine"]["sleep_level"] == 2
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
    # 512 assumed prompt tokens + 8 new ones per row; the rank's 4 x 8 rows of a mini-batch (16,640 tokens) fit half the
    # room without checkpointing, so the token budget is that micro-batch (not split for want of a power of two)
    mb = result["micro_batch"]
    assert mb["row_tokens"] == 520 and mb["rows"] == 32 and mb["tokens"] == 32 * 520 == s["micro_batch_tokens"]
    assert s["activation_checkpointing"] is False
    kv = result["kv_cache"]
    assert kv["bytes_per_token"] == 12_288 and kv["tokens"] == int(s["kv_cache_gib"] * GIB) // 12_288
    # DAPO's adaptive rounds draw up to max_gen_batches x B = 192 prompts: 1536 rows of 520 tokens on the one engine
    assert kv["round_tokens"] == 3 * 64 * 8 * 520 and result["engine"]["round_rows"] == 1536
    assert s["max_num_seqs"] == 1024  # vLLM's own default on a GPU of >= 70 GiB (not an A100) caps the 1536 rows


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
    from rlvr.config import validate
    from rlvr.ranks import world_problems
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


def test_the_engine_terms_of_qwen2_5_0_5b_by_hand(capsys):
    """Each engine term of Qwen2.5-0.5B (hidden 896, MLP 4864, 24 layers, vocabulary 151,936; bf16 engine) at 64
    sequences on one 80 GiB GPU, where vLLM batches 16,384 tokens (rlvr.memory.engine_memory has the vLLM source each
    comes from), against the plan's JSON (GiB to 3 places)."""
    code, result, out = run_plan(capsys, Q05B, "rollout.max_num_seqs=64")
    push = {"learner_compute": "bfloat16", "engine": "bfloat16", "pushed": "master weights rounded to bfloat16, in bfloat16",
            "startup_push": False}  # fmt: skip
    assert code == 0 and result["engine"] == {"max_num_seqs": 64, "max_num_batched_tokens": 16384, "round_rows": 1536,
                                              "sleep_level": 2, "push": push}  # fmt: skip
    assert "push: the learner computes in bfloat16; the engine gets the master weights rounded to bfloat16, in bfloat16" in out
    forward = 2 * (2 * 896 + 3 * 4864)  # bf16 residual + normed input + gate_up [2 x 4864] + activation [4864]: 32,768 B
    activations = 16384 * forward  # the profile run's forward at max_num_batched_tokens: 536,870,912 = 0.5 GiB
    sampler = 64 * 151_936 * (2 + 4 + 4 + 4 + 4)  # bf16 logits, fp32 copy, logprobs, probs, noise: 175,030,272
    scratch = 64 * 151_936 * 4  # Triton top-k/top-p buffer: min(132 SMs, 64) rows (a power of two) of fp32: 38,895,616
    # CUDA graphs up to min(2 x 64, 512) = 128 tokens: 1, 2, 4, 8, 16, ..., 128 = 19 PIECEWISE; the 11 of them <= 64 FULL;
    # 2 MiB + 24 layers x 256 KiB = 8 MiB each, plus the pool for the largest (128 tokens x 32,768 B = 4 MiB)
    graphs = (19 + 11) * 8 * 2**20 + 128 * forward  # 255,852,544
    weights = 2 * N05B  # 988,065,536
    kv = round(0.5 * 80 - (weights + activations + sampler + scratch + graphs) / GIB, 2)  # 40 - 1.858 = 38.14 GiB
    assert result["settings"]["kv_cache_gib"] == kv == 38.14
    rollout, learner = result["phases"]["rollout"], result["phases"]["learner"]
    expected = {"engine_weights": weights, "engine_kv_cache": int(kv * GIB), "engine_activations": activations,
                "engine_sampler": sampler, "engine_sampler_scratch": scratch, "engine_cuda_graphs": graphs}  # fmt: skip
    assert {k: v for k, v in rollout.items() if k.startswith("engine_")} == {k: round(v / GIB, 3) for k, v in expected.items()}
    # asleep (level 2) the engine keeps its graphs and the scratch buffer; the rest of the learner phase is the learner's
    assert learner["engine_cuda_graphs"] == round(graphs / GIB, 3) and learner["engine_sampler_scratch"] == round(scratch / GIB, 3)
    assert "engine CUDA graphs (kept asleep, level 2)" in out and "engine sampler buffers (64 x vocabulary, fp32)" in out
    # with a rank-16 adapter (sync=adapter on a bf16 engine): its slots, q/k/v/o/gate/up/down's (in + out) x 16 per layer
    # = 24 x 16 x ((896 + 896) x 2 + (896 + 128) x 2 + (896 + 4864) x 3) = 8,798,208 bf16 values; every graph twice
    _, lora, _ = run_plan(capsys, Q05B, "rollout.max_num_seqs=64", "model.lora.rank=16")
    assert lora["phases"]["rollout"]["engine_lora"] == round(2 * 8_798_208 / GIB, 3)
    assert lora["phases"]["rollout"]["engine_cuda_graphs"] == round((2 * 30 * 8 * 2**20 + 128 * forward) / GIB, 3)
    assert lora["engine"]["sleep_level"] == 1  # the adapter's base survives the sleep: copied to host and back


def test_host_memory_per_node_by_hand(capsys):
    """Qwen2.5-7B with a rank-16 adapter on one GPU: the engine sleeps at level 1 (its bf16 weights and LoRA slots in
    pinned host memory), vLLM's CPU LoRA cache holds one adapter, and rank 0's export holds one 2 GiB shard plus the
    largest unit, the untied embedding and head (2 x 152,064 x 3,584 + the final norm's 3,584) in bf16."""
    _, result, out = run_plan(capsys, Q7B, "plan.gpus=1", "model.lora.rank=16")
    adapter, root = 40_370_176, 2 * 152_064 * 3_584 + 3_584
    host = result["host"]
    assert host["sleep_copies"] == round((2 * N7B + 2 * adapter) / GIB, 3) and host["learner_offload"] == 0
    assert host["lora_cache"] == round(2 * adapter / GIB, 3) and host["export"] == round((2 * GIB + 2 * root) / GIB, 3)
    assert result["host_gib_per_node"] == round((2 * N7B + 4 * adapter + 2 * GIB + 2 * root) / GIB, 3)
    assert "host memory per node (1 rank): 18.4 GiB" in out
    # full fine-tuning over 8 GPUs: level 2 keeps no copy of the weights; the node holds the export alone
    _, eight, _ = run_plan(capsys, Q7B, "plan.gpus=8")
    assert eight["host"]["ranks_per_node"] == 8 and eight["host"]["sleep_copies"] == 0
    assert eight["host_gib_per_node"] == eight["host"]["export"] and eight["host_gib_per_gpu"] == 0
    # trainer.cpu_offload: each of the node's 8 ranks keeps its 1/16 share of 16 bytes a parameter (16 GPUs, 2 nodes)
    _, offload, _ = run_plan(capsys, Q7B, "plan.gpus=16", "trainer.cpu_offload=true")
    assert offload["host"]["learner_offload"] == round(8 * (16 * N7B // 16) / GIB, 3)


def test_max_num_seqs_auto_is_one_rounds_rows_on_an_engine_at_most_vllms_default(capsys):
    cases = [  # (overrides, resolved): DAPO's adaptive rounds draw up to 3 x 64 prompts of 8 samples; the built-in
        # task's evaluation holds 1000 prompts (data=arithmetic), greedy
        ((Q05B, "plan.gpus=1"), 1024),  # 1536 rows > vLLM's 1024 on an 80 GiB GPU
        ((Q05B, "plan.gpus=8"), 192),  # 192 prompts / 8 engines x 8 = 192 rows (an evaluation: 125)
        ((Q05B, "plan.gpus=16", "recipe=grpo"), 64),  # fixed rounds: 64 / 16 x 8 = 32; an evaluation 63, to 64
        ((Q05B, "plan.gpus=16", "recipe=grpo", "data.eval_size=100"), 32),  # the round's 32 (an evaluation: 7)
        ((Q05B, "plan.gpus=16", "recipe=grpo", "data.eval_size=100", "algo.group_size=5"), 24),  # 4 x 5 = 20 -> 24
        ((Q05B, "plan.gpus=16", "recipe=grpo", "data.eval_size=100", "eval.n=8"), 56),  # an evaluation's 7 x 8
        ((Q05B, "plan.gpus=1", "plan.gpu_name=NVIDIA A100-SXM4-80GB"), 256),  # vLLM's default on an A100: 256
        ((Q05B, "plan.gpus=8", "rollout.max_num_seqs=48"), 48),  # a value wins
    ]
    for overrides, seqs in cases:
        _, result, _ = run_plan(capsys, *overrides)
        assert result["settings"]["max_num_seqs"] == result["engine"]["max_num_seqs"] == seqs, overrides


def test_activation_checkpointing_follows_the_planned_micro_batch_7b_over_8_gpus(capsys):
    """DAPO over 8 GPUs trains 4 rows a rank per micro-batch (4 prompts x 8 samples / 8 ranks). Per token without
    checkpointing (bf16 under FSDP2, 28 layers of hidden 3584, MLP 18944, Q width 3584) the layers keep 6.68 MB:
    4 rows of 520 tokens (8 new) are 12.9 GiB, within half the ~48.3 GiB that the learner's state (49.0 GiB left of 72)
    and the sleeping engine's CUDA graphs (0.7 GiB) leave, so checkpointing stays off (the old rule, from the token
    budget alone, turned it on: ~24 GiB / 6.68 MB = ~3,900 tokens < 16k); 4 rows of 1,536 (1,024 new) are 38.2 GiB,
    past half the room, and it turns on."""
    from rlvr.memory import activation_bytes_per_token, learner_memory
    from rlvr.plan import model_shape

    shape = model_shape(str(FIXTURES / "qwen2.5-7b.json"))
    # per layer 16 h + 8 q + 8 i + 120 B (rlvr.memory.activation_bytes_per_token, bf16 weights); the final norm, rotary
    per_token = 28 * (16 * 3584 + 8 * 3584 + 8 * 18944 + 120) + 6 * 3584 + 8 * 128
    assert activation_bytes_per_token(shape, compute_bytes=2, checkpointing=False) == per_token == 6_677_792
    parts = learner_memory(shape, world_size=8, precision="bf16", sharded=True, autocast=False, checkpointing=False,
                           tokens=1024, chunk_tokens=1024, reference=False)  # fmt: skip
    room = int(0.9 * 80 * GIB) - sum(v for k, v in parts.items() if k != "activations")
    _, short, _ = run_plan(capsys, Q7B, "plan.gpus=8")
    graphs = (short["phases"]["learner"]["engine_cuda_graphs"] + short["phases"]["learner"]["engine_sampler_scratch"]) * GIB
    half = (room - graphs) // 2 // activation_bytes_per_token(shape, compute_bytes=2, checkpointing=False)
    assert 2080 <= half < 16384  # the planned micro-batch fits; the 16k-token budget would not
    assert short["micro_batch"] == {"tokens": 2080, "rows": 4, "row_tokens": 520, "prompt_tokens_assumed": True}
    assert short["settings"]["activation_checkpointing"] is False and short["settings"]["micro_batch_tokens"] == 2080
    _, long, _ = run_plan(capsys, Q7B, "plan.gpus=8", "rollout.max_new_tokens=1024")
    assert 4 * 1536 > half and long["settings"]["activation_checkpointing"] is True
    assert long["micro_batch"]["rows"] == 4  # checkpointed, the 4 rows fit one micro-batch


README_7B_LORA = (Q7B, "recipe=dapo", "model.lora.rank=16", "trainer.lr=1e-5", "rollout.max_new_tokens=1024",
                  "plan.gpus=1", "plan.gpu_memory_gib=80")  # fmt: skip
MARGIN = 0.10  # of the usable memory, free in every phase: the estimates' error (CUDA graphs, allocator)


def test_the_readme_gpu_commands_keep_a_10_percent_margin(capsys):
    """README.md's and docs/guide/scaling.md's GPU commands (the README's 7B LoRA run on one 80 GiB GPU, 7B over 8
    GPUs, 0.5B on one) leave at least 10% of the usable memory free in every phase under every engine term."""
    for args in (README_7B_LORA, (Q7B, "plan.gpus=8"), (Q7B, "plan.gpus=8", "rollout.max_new_tokens=1024"), (Q05B,)):
        code, result, out = run_plan(capsys, *args)
        assert code == 0, out
        for phase, free in result["free_gib"].items():
            assert free >= MARGIN * result["usable_gib"], (args, phase, free)
    _, lora, _ = run_plan(capsys, *README_7B_LORA)
    # the LoRA run: checkpointed, 21 rows of 1,536 tokens; the adapter's activations one layer's (recomputed per layer)
    assert lora["settings"]["activation_checkpointing"] is True and lora["micro_batch"]["rows"] == 21
    assert lora["phases"]["learner"]["total_gib"] < 0.6 * 72


def test_a_response_budget_that_leaves_no_room_for_a_prompt_is_a_problem_at_start_up_and_in_the_plan():
    """rollout.max_new_tokens at or over max_position_embeddings: no prompt would fit; start-up (rlvr.prompts) and rlvr
    plan say so alike. A prompt budget over what the context leaves is cut to it (those prompts are dropped, counted)."""
    from rlvr.memory import context_problem

    assert context_problem(32768, 31744) is None and context_problem(None, 10**6) is None
    message = context_problem(32768, 32768)
    assert message is not None and "no room for a prompt in the model's context of 32768" in message and "e.g. 31744" in message
    from test_prompts import EXAMPLES, data_cfg, tokenizer

    from rlvr.config import ConfigError
    from rlvr.prompts import prepare

    with pytest.raises(ConfigError, match="rollout.max_new_tokens=64 leaves no room for a prompt in the model's context of 64"):
        prepare(EXAMPLES, EXAMPLES, tokenizer(chat=False), 64, data_cfg(max_prompt_tokens=16), 64, verbose=False)
    long = Example("long", "9" * 40, "1")  # 40 tokens: within data.max_prompt_tokens=512, not within 64 - 32
    train, _, max_model_len, dropped = prepare([*EXAMPLES, long], EXAMPLES, tokenizer(chat=False), 64,
                                               data_cfg(max_prompt_tokens=512), 32, verbose=False)  # fmt: skip
    assert [e.id for e in train] == [e.id for e in EXAMPLES] and dropped["data/dropped_train_prompts"] == 1
