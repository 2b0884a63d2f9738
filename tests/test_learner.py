"""The learner on the real tiny model: response logprobs, and updates invariant to micro-batch size."""

from __future__ import annotations

import learners
import pytest
import torch

from rlvr.algo import LossOptions
from rlvr.batching import micro_batches, split_to
from rlvr.learner import Learner
from rlvr.lm_head import has_plain_head, response_logprobs, token_logprobs
from rlvr.models import resolve_model_path
from rlvr.types import Completion, RolloutBatch

MODEL = resolve_model_path("builtin:tiny-arith")


def make_learner(micro_batch_rows: int, dtype: str = "float64", micro_batch_tokens: int = 0) -> Learner:
    torch.manual_seed(0)
    return learners.make_learner(f"model.dtype={dtype}", "trainer.lr=1e-2", "trainer.grad_clip=1e9", "algo.kl_coef=0",
                                 f"trainer.micro_batch_rows={micro_batch_rows}", f"trainer.micro_batch_tokens={micro_batch_tokens}")


def synthetic_batch(n: int = 6, seed: int = 0) -> RolloutBatch:
    """Prompts and responses of uneven lengths (token ids drawn at random from the vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    completions = []
    for i in range(n):
        p, r = 3 + i % 3, 1 + (i * 2) % 5
        ids = torch.randint(3, 99, (p + r,), generator=g).tolist()
        completions.append(Completion(prompt_ids=ids[:p], token_ids=ids[p:], text="", finish_reason="stop",
                                      engine_logprobs=[0.0] * r))
    return RolloutBatch.from_completions(completions, [float(i % 2) for i in range(n)], [False] * n, pad_id=0)


def test_response_logprobs_match_unpadded_forward():
    learner = make_learner(micro_batch_rows=4)
    batch = synthetic_batch()
    logp = learner.logprobs(batch)  # [N, T]
    for i in range(batch.num_rows):
        length = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i : i + 1, :length]
        r = int(batch.response_mask[i].sum())
        full = torch.log_softmax(learner.model(input_ids=ids).logits[0].double(), -1)  # [L, V]
        expected = full[length - r - 1 : length - 1].gather(-1, ids[0, length - r :, None])[:, 0]
        torch.testing.assert_close(logp[i, :r].double(), expected, rtol=1e-9, atol=1e-9)


def update_with_gradient(learner: Learner, *args, **kwargs) -> tuple[dict[str, float], torch.Tensor]:
    """learner.update(...), also returning the flat gradient the optimizer was handed (before its step)."""
    seen: list[torch.Tensor] = []
    step = learner.optimizer.step

    def recording_step(*a, **k):
        seen.append(torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()]).clone())
        return step(*a, **k)

    learner.optimizer.step = recording_step  # type: ignore[method-assign]
    metrics = learner.update(*args, **kwargs)
    return metrics, seen[0]


# Tolerances of the micro-batch invariance test, from the arithmetic rather than from one machine.
# Splitting a batch into micro-batches only reorders float64 sums (BLAS blocks a [1, ...] and a [6, ...] matmul
# differently, and micro-batch gradients are accumulated one after another). Reordering a sum of n terms moves it
# by at most ~2n * eps * sum|terms| (Higham); with n of the order of rows x positions x hidden (~10^3 here) and
# sum|terms| of the order of the largest gradient entry, 1e3 * eps * max|g| (~2e-13 relative) bounds it with room to
# spare (measured: ~2e-16 relative on Intel AMX and AMD EPYC). A wrong normalizer is an O(1) relative error.
GRAD_RTOL_OF_MAX = 1e3 * torch.finfo(torch.float64).eps
# Adam's first update is p -= lr * g / (|g| + eps_adam) (bias-corrected m / sqrt(v) = g / |g|), whose derivative in g
# is at most lr / eps_adam: gradients whose entries are tiny (~eps_adam) amplify a reordering error by up to 1e6 here
# (measured 3.1e-12 absolute on AMD EPYC). So parameters after the step are compared at lr / eps_adam times the
# gradient tolerance; the gradient comparison above is what catches a mis-scaled loss (Adam's first step is ~ sign(g)).
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the learner uses


# (micro_batch_rows, micro_batch_tokens): one row at a time, rows in order, and token budgets that sort the rows by
# length into micro-batches of 1-3 rows (the rows are 4-10 tokens long); the last is the whole batch in one pass
LAYOUTS = [(1, 0), (2, 0), (6, 12), (6, 20), (2, 30), (6, 0)]


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"])
def test_update_is_invariant_to_micro_batch_layout(aggregation):
    batch = synthetic_batch()
    g = torch.Generator().manual_seed(1)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4], dtype=torch.float64)
    kwargs = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_len=8,
                  kl_coef=0.0, kl_estimator="k3", clip_ratio_c=None, rollout_correction="token_truncated",
                  rollout_correction_cap=2.0)  # fmt: skip
    noise = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
    engine_noise = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
    runs = []
    for rows, tokens in LAYOUTS:
        learner = make_learner(micro_batch_rows=rows, micro_batch_tokens=tokens)
        assert learner.optimizer.defaults["eps"] == ADAM_EPS
        old = learner.logprobs(batch) + 0.1 * noise
        batch.engine_logprobs = old + 0.8 * engine_noise  # some tokens past the correction's cap
        metrics, grad = update_with_gradient(learner, batch, adv, batch.response_mask, old, None, options=LossOptions(**kwargs))
        assert metrics["clip_frac"] > 0 and 0 < metrics["rollout_capped_frac"] < 1  # the clip and the cap are exercised
        params = torch.cat([p.detach().reshape(-1) for p in learner.model.parameters()])
        runs.append((metrics, grad, params, learner.optimizer.param_groups[0]["lr"]))
    full_metrics, full_grad, full_params, lr = runs[-1]
    grad_atol = GRAD_RTOL_OF_MAX * full_grad.abs().max().item()
    for metrics, grad, params, _ in runs[:-1]:
        torch.testing.assert_close(grad, full_grad, rtol=0, atol=grad_atol)
        torch.testing.assert_close(params, full_params, rtol=0, atol=lr / ADAM_EPS * grad_atol)
        for key in ("pg_loss", "grad_norm", "clip_frac", "entropy", "rollout_ratio_mean", "rollout_capped_frac"):
            assert metrics[key] == pytest.approx(full_metrics[key], rel=GRAD_RTOL_OF_MAX), key
        for key in ("ratio_max", "ratio_min", "rollout_ratio_max"):  # extremes over micro-batches, not their mean
            assert metrics[key] == full_metrics[key], key


def test_micro_batches_pad_each_to_its_own_longest_row():
    lengths = [5, 40, 7, 7, 12, 3, 30, 9]
    plan = micro_batches(lengths, max_rows=3, max_tokens=24)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))  # every row once
    assert plan == [[1], [6], [4, 7], [2, 3, 0], [5]]  # longest first; 40 and 30 exceed the budget: alone
    for mb in plan:
        assert len(mb) <= 3 and (len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 24)
    assert micro_batches(lengths, max_rows=3, max_tokens=0) == [[1, 6, 4], [7, 2, 3], [0, 5]]  # rows only
    evened = split_to(plan, lengths, 7)  # the largest (in padded tokens) are halved first
    assert evened == [[1], [6], [4], [7], [2], [3, 0], [5]]


def test_token_logprobs_match_float64_log_softmax_and_gradcheck():
    chunk = 3  # tokens per chunk of logits: 8 tokens make chunks of 3, 3, 2
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(8, 5, generator=g, dtype=torch.float64, requires_grad=True)  # [M, H]
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)  # [V, H]
    targets = torch.randint(0, 11, (8,), generator=g)
    for temperature in (1.0, 0.7):

        def logp_of(h: torch.Tensor, w: torch.Tensor, temperature: float = temperature) -> torch.Tensor:
            return token_logprobs(h, w, targets, temperature=temperature, chunk_tokens=chunk)[0]

        logp, entropy = token_logprobs(hidden, weight, targets, temperature=temperature, with_entropy=True, chunk_tokens=chunk)
        z = hidden @ weight.T / temperature  # [M, V]
        expected = torch.log_softmax(z, -1).gather(-1, targets[:, None])[:, 0]
        torch.testing.assert_close(logp, expected, rtol=0, atol=1e-13)
        p = torch.softmax(z, -1)
        torch.testing.assert_close(entropy, -(p * torch.log(p)).sum(-1), rtol=0, atol=1e-13)
        assert torch.autograd.gradcheck(logp_of, (hidden, weight))


def test_logits_that_are_not_the_heads_plain_product_are_detected():
    learner = make_learner(micro_batch_rows=6)
    cpu = torch.device("cpu")

    def softcap(module, args, output):  # Gemma-2-style soft-capping after the LM head
        output.logits = 3.0 * torch.tanh(output.logits / 3.0)
        return output

    handle = learner.model.register_forward_hook(softcap)
    try:
        assert not has_plain_head(learner.model, cpu)  # such a model takes its own logits (plain_head=False)
    finally:
        handle.remove()
    assert has_plain_head(learner.model, cpu)


def test_chunked_head_equals_the_models_own_logits():
    learner = make_learner(micro_batch_rows=6)
    assert learner.plain_head
    batch = synthetic_batch()
    for temperature in (1.0, 0.6):
        chunked, h_chunked = response_logprobs(learner.model, batch, with_entropy=True, temperature=temperature)
        full, h_full = response_logprobs(learner.model, batch, with_entropy=True, temperature=temperature, plain_head=False)
        mask = batch.response_mask.bool()
        torch.testing.assert_close(chunked[mask], full[mask], rtol=0, atol=1e-12)
        torch.testing.assert_close(h_chunked[mask], h_full[mask], rtol=0, atol=1e-12)
        assert (chunked[~mask] == 0).all()


def test_single_update_has_ratio_exactly_one():
    learner = make_learner(micro_batch_rows=6)
    batch = synthetic_batch()
    adv = torch.linspace(-1, 1, 6, dtype=torch.float64)
    m = learner.update(batch, adv, batch.response_mask, None, None, options=LossOptions(
        ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8))
    assert m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0 and m["clip_frac"] == 0.0


def test_the_learners_forwards_build_no_kv_cache(monkeypatch):
    """transformers builds a KV cache in every forward unless told not to, in training too, copying each layer's keys and
    values into it: the learner's passes (the policy's logprobs, an update, the head check) ask for none."""
    from transformers import cache_utils

    built: list[int] = []
    real_init = cache_utils.DynamicCache.__init__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(cache_utils.DynamicCache, "__init__", counted)
    learner = make_learner(micro_batch_rows=3)  # (its head check runs a forward at build time)
    batch = synthetic_batch()
    learner.logprobs(batch)
    learner.update(batch, torch.linspace(-1, 1, 6, dtype=torch.float64), batch.response_mask, None, None,
                   options=LossOptions(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8))  # fmt: skip
    assert built == []
    learner.model(input_ids=batch.input_ids[:1])  # the count works: a plain forward builds one
    assert built == [1]


def test_named_weights_list_tied_weights_once():
    names = [n for n, _ in make_learner(1, dtype="float32").named_weights()]
    assert len(names) == len(set(names))
    assert "model.embed_tokens.weight" in names


def test_export_is_in_the_published_dtype_and_streamed_in_files(tmp_path):
    """A model published in bf16 (its config.json) and trained with float32 masters exports bf16: the masters' casts,
    config.json saying so. A file limit below the model's size gives transformers' sharded layout (an index and
    numbered files) that loads to the same tensors; the default gives one model.safetensors and removes those files."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    published = tmp_path / "published"
    shutil.copytree(MODEL, published)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    learner = learners.make_learner("model.dtype=float32", "algo.kl_coef=0", f"model.path={published}")
    masters = {name: t.clone() for name, t in learner.named_weights()}
    assert all(t.dtype == torch.float32 for t in masters.values())
    assert any(not torch.equal(t.to(torch.bfloat16).float(), t) for t in masters.values())  # the cast rounds
    folder = tmp_path / "model"
    for limit, sharded in ((50_000, True), (2**30, False)):
        learner.save(folder, max_shard_bytes=limit)
        files = sorted(folder.glob("model*.safetensors"))
        assert (len(files) > 1) == sharded == (folder / "model.safetensors.index.json").is_file()
        assert sharded or files[0].name == "model.safetensors"  # and the numbered files of the save before are gone
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
        state = AutoModelForCausalLM.from_pretrained(folder).state_dict()  # in the dtype its config.json names
        for name, master in masters.items():
            assert state[name].dtype == torch.bfloat16 and torch.equal(state[name], master.to(torch.bfloat16)), name


def test_reference_is_frozen_until_refreshed():
    torch.manual_seed(0)
    learner = learners.make_learner("model.dtype=float64", "trainer.lr=1e-2", "trainer.grad_clip=1e9", "algo.kl_coef=0.04",
                                    "trainer.micro_batch_rows=6")
    batch = synthetic_batch()
    before = learner.logprobs(batch, reference=True)
    kwargs = dict(ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8,
                  kl_coef=0.04, kl_estimator="k3")
    m = learner.update(batch, torch.linspace(-1, 1, 6, dtype=torch.float64), batch.response_mask, None,
                       before, options=LossOptions(**kwargs))
    assert m["kl"] == 0.0  # pi_theta == pi_ref before the first update
    torch.testing.assert_close(learner.logprobs(batch, reference=True), before)  # the update left pi_ref alone
    assert (learner.logprobs(batch) - before).abs().max() > 1e-4  # but moved pi_theta
    learner.refresh_reference()
    torch.testing.assert_close(learner.logprobs(batch, reference=True), learner.logprobs(batch))


def test_lr_schedule_values():
    from rlvr.learner import lr_factor

    assert [lr_factor(i, warmup=2, total=10, schedule="constant") for i in (0, 1, 5)] == [0.5, 1.0, 1.0]
    assert lr_factor(2, warmup=2, total=10, schedule="cosine") == pytest.approx(1.0)
    assert lr_factor(6, warmup=2, total=10, schedule="cosine") == pytest.approx(0.5)
    assert lr_factor(10, warmup=2, total=10, schedule="cosine") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="constant, cosine"):
        lr_factor(3, warmup=0, total=10, schedule="linear")


def test_non_finite_gradient_skips_the_update():
    learner = make_learner(micro_batch_rows=3)
    batch = synthetic_batch()
    before = [p.detach().clone() for p in learner.model.parameters()]
    adv = torch.tensor([1.0, float("nan"), 0.3, -1.2, 0.8, -0.4], dtype=torch.float64)  # one poisoned row
    m = learner.update(batch, adv, batch.response_mask, None, None, options=LossOptions(
        ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8))
    assert m["bad"] == 1.0 and not torch.isfinite(torch.tensor(m["grad_norm"]))
    for p, b in zip(learner.model.parameters(), before):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)  # untouched, and no NaN in Adam's state either
    assert all(not s for s in learner.optimizer.state.values())
    good = learner.update(batch, adv.nan_to_num(0.0), batch.response_mask, None, None, options=LossOptions(
        ratio="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean", max_len=8))
    assert good["bad"] == 0.0 and all(torch.isfinite(p).all() for p in learner.model.parameters())


class RecordingEngine:
    """Stands in for rlvr.rollout.Engine in a push: keeps the tensors it is sent (a float32 engine)."""

    dtype = torch.float32

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, named) -> None:
        self.weights = {name: t.clone() for name, t in named}


@pytest.mark.parametrize("shard", [False, True])
def test_a_bf16_learner_pushes_the_weights_it_computes_with(midpoint_model, tmp_path, shard):
    """Every weight of the model on a bf16 rounding midpoint, a bf16 learner beside a float32 engine: a push sends the
    masters rounded to bf16 (as autocast's casts and FSDP2's bf16 gathers round them), in float32; not the masters,
    which an update of 1e-7 leaves where they were while it moves the learner's bf16 weights by a whole unit."""
    from rlvr.startup import push_weights

    learner = learners.make_learner("model.dtype=float32", "trainer.precision=bf16", "rollout.dtype=float32",
                                    "algo.kl_coef=0", f"model.path={midpoint_model}", shard=shard)  # fmt: skip
    engine = RecordingEngine()
    with torch.no_grad():  # an update too small to move a master past its midpoint's neighbours
        for p in learner.model.parameters():
            p.add_(1e-7 * torch.ones_like(p))
    masters = {name: t.clone() for name, t in learner.named_weights()}
    push_weights(engine, learner, None, tmp_path)  # type: ignore[arg-type]
    assert set(engine.weights) == set(masters)
    flipped = 0
    for name, master in masters.items():
        sent = engine.weights[name]
        assert sent.dtype == torch.float32 and torch.equal(sent, master.to(torch.bfloat16).float()), name
        flipped += int((sent != master).sum())
    assert flipped > 0.99 * sum(int((m != 0).sum()) for m in masters.values())  # every non-zero weight is rounded
    half = dict(learner.pushed_weights(torch.float16))  # an engine in another 2-byte dtype gets its own
    assert all(t.dtype == torch.float16 and torch.equal(t, masters[n].to(torch.bfloat16).to(torch.float16)) for n, t in half.items())


def test_a_lora_learner_pushes_its_base_and_adapter_unrounded(tmp_path):
    """With LoRA the base is stored in the compute dtype (bf16 exactly) and the learner adds the adapter's product
    B (A x) unrounded to W x: the merged weights go out as they are (float32), not rounded again."""
    from rlvr.startup import push_weights

    learner = learners.make_learner("model.dtype=float32", "trainer.precision=bf16", "rollout.dtype=float32",
                                    "algo.kl_coef=0", "model.lora.rank=4", "model.lora.sync=merged")  # fmt: skip
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)  # an adapter that has moved from B = 0
    engine = RecordingEngine()
    push_weights(engine, learner, "merged", tmp_path)  # type: ignore[arg-type]
    merged = dict(learner.named_weights(torch.float32))
    assert all(torch.equal(engine.weights[n], merged[n]) for n in merged)
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in engine.weights.values())  # (not rounded)
