"""trainer.compile: the learner's decoder layers under torch.compile compute the same function as eager ones (float64),
and the settings it was not measured with are refused before anything loads. The bf16 update under compile is held to
the fp32 gradient by tests/test_bf16.py's bound (its `compiled` case)."""

from __future__ import annotations

import pytest
import torch
from learners import make_learner

from rlvr.algo import LossOptions
from rlvr.config import ConfigError
from tests.test_learner import synthetic_batch, update_with_gradient

LOSS = LossOptions(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8)
# float64 sums in another order (fused kernels, other blockings): ~n eps of the largest term, n ~ 10^3 here (the
# micro-batch invariance test's tolerance, tests/test_learner.py); a wrong kernel is off by far more
RTOL_OF_MAX = 1e3 * torch.finfo(torch.float64).eps


@pytest.mark.slow  # (~15 s: two compilations of the built-in model's layer; make test-slow, which CI runs too)
def test_compiled_layers_compute_the_eager_logprobs_and_gradient_in_float64(monkeypatch):
    """The built-in model in float64, compiled and not, on the same batch over 2 micro-batches: logprobs and the
    gradient handed to the optimizer agree to float64 reordering. transformers' RMSNorm takes a float32 detour (it
    casts to float32 and back) that inductor fuses away (more precise: ~5e-6 here); the check removes the detour from
    both, so that any difference left is compile's."""
    from transformers.models.llama import modeling_llama

    def rms_norm(self, x):  # type: ignore[no-untyped-def]  # the same formula, in the input's dtype
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm)
    torch.set_num_threads(1)
    batch, adv = synthetic_batch(), torch.linspace(-1, 1, 6, dtype=torch.float64)
    results = []
    for compiled in ("false", "true"):
        torch.manual_seed(0)
        learner = make_learner("model.dtype=float64", f"trainer.compile={compiled}", "trainer.micro_batch_rows=3", "algo.kl_coef=0")
        layers = learner.model.model.layers
        assert all((layer._compiled_call_impl is not None) == (compiled == "true") for layer in layers)
        logp = learner.logprobs(batch)
        _, grad = update_with_gradient(learner, batch, adv, batch.response_mask, None, None, options=LOSS)
        results.append((logp, grad))
    (logp, grad), (logp_c, grad_c) = results
    assert (logp - logp_c).abs().max() <= RTOL_OF_MAX * logp.abs().max()
    assert (grad - grad_c).abs().max() <= RTOL_OF_MAX * grad.abs().max()


@pytest.mark.parametrize(
    ("overrides", "here"),
    [(["model.lora.rank=4"], "LoRA rank 4"), (["trainer.activation_checkpointing=true"], "activation checkpointing True")],
    ids=["lora", "checkpointing"],
)
def test_compile_with_what_it_was_not_measured_with_is_refused_by_name(overrides, here):
    from rlvr.settings import resolve
    from tests.test_settings import CPU_BF16, QWEN_1_5B, cfg

    with pytest.raises(ConfigError, match=rf"trainer\.compile is measured .* \(here: .*{here}"):
        resolve(cfg("trainer.compile=true", *overrides), CPU_BF16, QWEN_1_5B, world_size=1, builtin=False)


def test_compile_on_several_ranks_is_refused_by_name():
    from rlvr.learner import compile_layers

    with pytest.raises(ConfigError, match=r"trainer\.compile is measured and tested on one unsharded rank"):
        compile_layers(torch.nn.Module(), sharded=True, checkpointing=False)


def test_compile_is_refused_at_start_up_where_auto_turns_checkpointing_on_or_the_model_is_sharded():
    """rlvr.settings.resolve (before any model loads): on an H100 Qwen2.5-1.5B's planned micro-batch turns
    activation_checkpointing=auto on, which trainer.compile was not measured with; two ranks shard the model; one CPU
    rank takes it."""
    from rlvr.settings import resolve
    from tests.test_settings import CPU_BF16, H100, QWEN_1_5B, cfg

    assert resolve(cfg(), H100, QWEN_1_5B, world_size=1, builtin=False).activation_checkpointing  # (auto: on)
    with pytest.raises(ConfigError, match=r"trainer\.compile .*activation checkpointing True, world size 1"):
        resolve(cfg("trainer.compile=true"), H100, QWEN_1_5B, world_size=1, builtin=False)
    with pytest.raises(ConfigError, match=r"trainer\.compile .*activation checkpointing False, world size 2"):
        resolve(cfg("trainer.compile=true"), CPU_BF16, QWEN_1_5B, world_size=2, builtin=False)
    assert not resolve(cfg("trainer.compile=true"), CPU_BF16, QWEN_1_5B, world_size=1, builtin=False).activation_checkpointing
