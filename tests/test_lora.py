"""LoRA (model.lora): the adapter in the learner (float64), the engine following it in both sync modes (real vLLM),
its checkpoints and exact resume through the CLI, and its config errors."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import run_rlvr
from learners import lora_overrides, make_learner

from rlvr import lora
from rlvr.algo import LossOptions
from rlvr.config import ConfigError
from rlvr.learner import Learner
from rlvr.lm_head import response_logprobs, token_logprobs
from rlvr.models import resolve_model_path
from rlvr.types import RolloutBatch
from tests.test_learner import synthetic_batch

MODEL = resolve_model_path("builtin:tiny-arith")
SPEC = lora.LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=None, init=None, seed=0)
LOSS = dict(ratio="token", clip_low=0.2, clip_high=0.28, clip_ratio_c=None, aggregation="token_mean", max_len=8,
            kl_coef=0.1, kl_estimator="k3", rollout_correction="none", rollout_correction_cap=2.0)  # fmt: skip


def make(spec: lora.LoraSpec | None = SPEC, *, dtype: str = "float64", with_reference: bool = False, lr: float = 1e-2) -> Learner:
    return make_learner(f"model.dtype={dtype}", f"trainer.lr={lr}", "trainer.grad_clip=1e9", "trainer.micro_batch_rows=4",
                        f"algo.kl_coef={0.1 if with_reference else 0}", "trainer.precision=fp32", *lora_overrides(spec))  # fmt: skip


def perturb(learner: Learner, scale: float = 0.1, seed: int = 1) -> None:
    """Random A and B (a fresh adapter's B is zero: it would change nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in lora.adapter_parameters(learner.model):
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def step(learner: Learner, batch: RolloutBatch, ref: torch.Tensor | None = None) -> dict[str, float]:
    adv = torch.linspace(-1.0, 1.2, batch.num_rows, dtype=torch.float64)
    return learner.update(batch, adv, batch.response_mask, None, ref, options=LossOptions(**{**LOSS, "kl_coef": 0.1 if ref is not None else 0.0}))


def test_a_fresh_adapter_is_the_base_model_exactly():
    batch = synthetic_batch()
    assert torch.equal(make().logprobs(batch), make(None).logprobs(batch))


def test_learner_logprobs_equal_those_of_the_merged_weights(tmp_path):
    """W x + s B A x (the learner) against (W + s B A) x (the merged folder, what merged sync pushes and `model/` holds),
    in float64: equal to rounding (1e-12), while the adapter moves the logprobs by far more than that."""
    learner, batch = make(), synthetic_batch()
    perturb(learner)
    mine = learner.logprobs(batch)
    learner.save(tmp_path / "model")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float64)
    theirs = response_logprobs(merged, batch)[0]
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    assert (mine - make(None).logprobs(batch)).abs().max() > 1e-2  # the adapter mattered
    # the merged weights carry the base's checkpoint names, every one of them
    assert set(dict(learner.named_weights())) == set(dict(make(None).named_weights()))
    # and the adapter folder beside them is peft's, loadable onto the base, with the same logprobs
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64)
    adapted = PeftModel.from_pretrained(base, tmp_path / "model" / lora.ADAPTER_FOLDER)
    torch.testing.assert_close(response_logprobs(adapted, batch)[0], mine, rtol=0, atol=1e-12)


def test_only_the_adapter_has_gradients_and_optimizer_state():
    learner, batch = make(), synthetic_batch()
    base_before = {n: p.detach().clone() for n, p in learner.model.named_parameters() if not p.requires_grad}
    grads: dict[str, bool] = {}
    real_step = learner.optimizer.step

    def recording_step(*a, **k):
        grads.update({n: p.grad is not None for n, p in learner.model.named_parameters()})
        return real_step(*a, **k)

    learner.optimizer.step = recording_step  # type: ignore[method-assign]
    step(learner, batch)
    adapter = {n for n, _ in lora.adapter_parameters(learner.model)}
    assert adapter and {n for n, has in grads.items() if has} == adapter
    # 4 layers x 7 linear modules x (A, B)
    assert len(adapter) == 56 and all(p.dtype == torch.float64 for _, p in lora.adapter_parameters(learner.model))
    states = learner.optimizer.state
    assert {id(p) for p in states} == {id(p) for _, p in lora.adapter_parameters(learner.model)}
    for name, p in learner.model.named_parameters():
        if name in base_before:
            assert torch.equal(p, base_before[name]), name  # the base is frozen
    # B moved off zero (its gradient is nonzero where A is random); A's is zero while B is zero
    b = [p for n, p in lora.adapter_parameters(learner.model) if ".lora_B." in n]
    assert max(p.abs().max().item() for p in b) > 1e-3


def test_reference_is_the_base_until_refreshed_then_a_frozen_snapshot():
    """The reference is a snapshot of the starting adapter (B = 0: the base model, bit for bit), then of the adapter at
    each refresh; computing it leaves the policy's adapter and its requires_grad as they were."""
    learner, base, batch = make(with_reference=True), make(None), synthetic_batch()
    perturb(learner)
    assert torch.equal(learner.logprobs(batch, reference=True), base.logprobs(batch))  # the adapter disabled
    learner.refresh_reference()
    at_refresh = learner.logprobs(batch)
    assert (at_refresh - base.logprobs(batch)).abs().max() > 1e-2
    step(learner, batch, learner.logprobs(batch, reference=True))
    assert (learner.logprobs(batch) - at_refresh).abs().max() > 1e-4  # the policy moved on
    assert torch.equal(learner.logprobs(batch, reference=True), at_refresh)  # the reference did not
    # and computing the reference left the policy's adapter as it was
    after = learner.logprobs(batch)
    learner.logprobs(batch, reference=True)
    assert torch.equal(learner.logprobs(batch), after)
    assert all(p.requires_grad for _, p in lora.adapter_parameters(learner.model)) and learner.model.training


def test_dropout_is_off_in_the_logprob_passes():
    spec = lora.LoraSpec(rank=4, alpha=8.0, dropout=0.5, target_modules=None, init=None, seed=0)
    learner, batch = make(spec), synthetic_batch()
    perturb(learner)
    assert torch.equal(learner.logprobs(batch), learner.logprobs(batch))
    assert learner.model.training  # training forwards keep it: two of them differ
    with torch.no_grad():
        first, second = (learner._response_logprobs(learner.model, batch, False)[0] for _ in range(2))
    assert (first - second).abs().max() > 1e-3


def test_target_modules_and_the_adapter_init(tmp_path):
    only = make(lora.LoraSpec(rank=2, alpha=4.0, dropout=0.0, target_modules=("q_proj", "v_proj"), init=None, seed=0))
    names = {n for n, _ in lora.adapter_parameters(only.model)}
    assert len(names) == 4 * 2 * 2 and all(".q_proj." in n or ".v_proj." in n for n in names)
    first, batch = make(), synthetic_batch()
    perturb(first)
    first.save_adapter(tmp_path / "adapter")
    resumed = make(lora.LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=None, init=str(tmp_path / "adapter"), seed=5))
    torch.testing.assert_close(resumed.logprobs(batch), first.logprobs(batch), rtol=0, atol=1e-12)
    assert all(p.requires_grad for _, p in lora.adapter_parameters(resumed.model))
    for foreign in ("nope", "lm_head", "embed_tokens"):  # a head or embedding adapter would be neither trained nor merged
        with pytest.raises(ConfigError, match=rf"model.lora.target_modules: {foreign} is not a linear layer of the decoder; "
                                              r"choose among down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"):
            make(lora.LoraSpec(rank=2, alpha=4.0, dropout=0.0, target_modules=("q_proj", foreign), init=None, seed=0))


def test_a_frozen_head_gets_no_weight_gradient_and_the_same_hidden_gradient():
    """The chunked head's backward with a frozen weight (LoRA never trains the head): grad of the hidden states equal to
    the trainable case's, bit for bit, and no [V, H] gradient computed."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(11, 6, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (9,), generator=g)
    grads = []
    for trainable in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_(trainable)
        logp, _ = token_logprobs(h, w, targets, temperature=0.7, chunk_tokens=4)
        (logp * torch.arange(9)).sum().backward()
        grads.append(h.grad)
        assert (w.grad is not None) is trainable
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_engine_samples_from_the_pushed_adapter(sync, tmp_path):
    """The real engine after each of two pushes of a changed adapter: its sampled-token logprobs equal the learner's
    (fp32, 1e-4 as for full weights in tests/test_rollout.py) and differ from the previous push's (a cached adapter or
    cached prefix blocks of the old one would fail here: vLLM keys its adapter cache by id, its prefix cache by name)."""
    from rlvr.rollout import Engine
    from tests.test_rollout import sample

    learner = make(dtype="float32")
    engine = Engine(MODEL, seed=0, max_model_len=32, dtype="float32", gpu_memory_utilization=0.5, cpu_kv_cache_gib=1,
                    lora_rank=SPEC.rank if sync == "adapter" else 0)  # fmt: skip
    try:
        previous = None
        for push in range(2):
            perturb(learner, scale=0.1, seed=push)  # about the size of tests/test_rollout.py's full-weight perturbation
            if sync == "adapter":
                engine.load_adapter(learner.save_adapter(tmp_path / "adapter"))  # the same folder each time, as in a run
            else:
                engine.load_weights(learner.named_weights())
            flat = sample(engine, [5, 6, 7, 8])
            batch = RolloutBatch.from_completions(flat, [0.0] * len(flat), [False] * len(flat), pad_id=0)
            gap = ((learner.logprobs(batch) - batch.engine_logprobs).abs() * batch.response_mask).max().item()
            assert gap < 1e-4, (push, gap)
            if previous is not None:  # the same prompts and seeds under the last push's adapter: clearly other logprobs
                stale = ((learner.logprobs(previous) - previous.engine_logprobs).abs() * previous.response_mask).max()
                assert stale > 1e-2, (push, stale)
            previous = batch
        if sync == "adapter":
            assert engine.adapter is not None and engine.adapter.lora_int_id == 2
            assert engine.llm.llm_engine.list_loras() == {2}  # the first push's adapter was dropped
    finally:
        engine.close()


def test_engine_lora_rank_is_one_vllm_allows():
    from rlvr.settings import engine_lora_rank

    assert [engine_lora_rank(r) for r in (1, 2, 8, 9, 33, 320, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ConfigError, match="up to rank 512"):
        engine_lora_rank(513)


def _cli(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["train", "recipe=grpo", "model.lora.rank=8", "trainer.lr=3e-3",
           "trainer.lr_schedule=constant", "algo.ref_update_every=1", "trainer.eval_every=2", "data.eval_size=64",
           "logger.progress=false", f"trainer.output_dir={out}", *args]  # fmt: skip
    return run_rlvr(*cmd, cwd=out.parent, timeout=900)


# ~20-35 s of CLI runs: make test-slow (the LoRA update, sync and push are make test's: the tests above)
@pytest.mark.slow
def test_lora_run_resumes_exactly_and_its_model_loads(tmp_path):
    """GRPO with LoRA, its KL term against a reference refreshed every step (the adapter's snapshot, in the checkpoint):
    4 steps straight, and the same run resumed from its step-2 checkpoint (a copy, its step-4 checkpoint and model
    removed), give equal metrics (timings aside); the checkpoint holds the adapter, not the frozen base; `model/` is a
    merged model with the adapter beside it, and `rlvr eval run=` on it reproduces the run's last evaluation; the
    engine's logprobs agree with the learner's as in full fine-tuning."""
    from tests.test_resume import copy_run, rows, stable

    straight = _cli(tmp_path / "straight", "trainer.max_steps=4", "trainer.save_every=2")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "LoRA: rank 8, alpha 32; 94,208 trained parameters" in straight.stdout
    resumed = copy_run(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(resumed / "checkpoints" / "step_00000004")
    shutil.rmtree(resumed / "model")
    second = _cli(resumed, "trainer.max_steps=4", "trainer.save_every=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {resumed / 'checkpoints' / 'step_00000002'} (step 2)" in second.stdout
    a, b = rows(tmp_path / "straight"), rows(resumed)
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert [stable(r) for r in a] == [stable(r) for r in b]
    assert max(r["actor/kl"] for r in a[1:]) > 0 and max(r.get("rollout/logprob_mismatch_max", 0) for r in a) < 1e-3
    learner_files = {p.name for p in (tmp_path / "straight" / "checkpoints" / "step_00000004" / "learner").iterdir()}
    assert learner_files == {".metadata", "__0_0.distcp"}
    size = sum(p.stat().st_size for p in (tmp_path / "straight" / "checkpoints" / "step_00000004" / "learner").iterdir())
    assert size < 2 * 94_208 * 4 * 4  # adapter, its two AdamW moments and the reference snapshot: no 1M-parameter base
    model = tmp_path / "straight" / "model"
    assert {"model.safetensors", "config.json"} <= {p.name for p in model.iterdir()}
    assert json.loads((model / lora.ADAPTER_FOLDER / "adapter_config.json").read_text())["r"] == 8
    # `rlvr eval run=` on the LoRA run: its merged model/ reproduces the last evaluation training logged, exactly
    from tests.test_eval_command import logged

    out = tmp_path / "eval"
    result = run_rlvr("eval", f"run={tmp_path / 'straight'}", "eval.n=0", f"output_dir={out}", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["step"] == 4 and {k: report["metrics"][k] for k in logged(tmp_path / "straight", 4)} == logged(tmp_path / "straight", 4)


def test_config_errors_name_the_key(tmp_path):
    from conftest import compose_config

    from rlvr.cli import check_overrides
    from rlvr.config import validate

    with pytest.raises(ConfigError, match=r"model.lora.rank must be >= 0"):
        validate(compose_config("model.lora.rank=-1"))
    with pytest.raises(ConfigError, match=r"model.lora.dropout in \[0, 1\)"):
        validate(compose_config("model.lora.rank=4", "model.lora.dropout=1.0"))
    assert "Did you mean 'model.lora.rank'" in (check_overrides(["model.lora.rnk=4"]) or "")
    cfg = validate(compose_config("model.lora.rank=4", f"model.lora.init={tmp_path}", "rollout.dtype=float32"))
    with pytest.raises(ConfigError, match=r"model.lora.init: .*adapter_config.json does not exist"):
        lora.check_init(cfg)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with pytest.raises(ConfigError, match=r"has rank 8, but model.lora.rank=4; set model.lora.rank=8"):
        lora.check_init(cfg)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 16}))
    with pytest.raises(ConfigError, match=r"has alpha 16, but model.lora.alpha=32; set model.lora.alpha=16"):
        lora.check_init(cfg)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 32, "use_dora": True}))
    with pytest.raises(ConfigError, match=r"uses use_dora, which rlvr does not train or merge"):
        lora.check_init(cfg)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 32}))
    lora.check_init(cfg)  # a plain adapter of the config's rank and alpha
    # auto: merged into a float32 engine (CPUs resolve rollout.dtype to it), a vLLM adapter in a bf16 one (GPUs)
    assert lora.sync_mode(cfg) == "merged"
    assert lora.sync_mode(validate(compose_config("model.lora.rank=4", "rollout.dtype=bfloat16"))) == "adapter"
    assert lora.sync_mode(validate(compose_config("model.lora.rank=4", "rollout.dtype=bfloat16", "model.lora.sync=merged"))) == "merged"
    assert lora.sync_mode(validate(compose_config("rollout.dtype=bfloat16"))) is None  # rank 0: full fine-tuning


def test_adapter_sync_run_checks_the_engine_at_evaluations(tmp_path):
    """model.lora.sync=adapter through the CLI (DAPO: pi_old from the engine would skip the learner's pass): at every
    evaluation step the learner's logprobs are compared with the engine's, and they agree as in full fine-tuning."""
    from tests.test_resume import rows

    out = tmp_path / "run"
    result = _cli(out, "recipe=dapo", "model.lora.sync=adapter", "trainer.max_steps=2", "trainer.eval_every=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "as a vLLM LoRA adapter (model.lora.sync=adapter)" in result.stdout
    steps = [r for r in rows(out) if r["step"] > 0]
    assert len(steps) == 2 and all(r["rollout/logprob_mismatch_max"] < 1e-3 for r in steps)
    assert (out / ".engine_adapter" / "adapter_config.json").is_file()
