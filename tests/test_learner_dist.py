"""The FSDP2 learner on a real gloo process group: 1 process (plain module, and FSDP2 over one rank) and 2 processes
(FSDP2), handed the same fixed batch, end two optimizer steps with the same parameters, for every recipe's aggregation and ratio (float64, so any mis-scaled
normalizer or double-counted gradient shows far above the tolerance). The rows have uneven lengths; one process cuts
them into micro-batches of 3 rows, two processes by a budget of 18 padded tokens (sorted by length, and a different
number of micro-batches per rank before they are evened out)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from rlvr.models import resolve_model_path

MODEL = resolve_model_path("builtin:tiny-arith")
# (aggregation, ratio, kl_coef): the four recipes' loss settings (GRPO's with its KL term)
CASES = [
    ("seq_mean_token_mean", "token", 0.04),  # grpo
    ("seq_mean_token_sum_norm", "token", 0.0),  # dr_grpo
    ("token_mean", "token", 0.0),  # dapo
    ("seq_mean_token_mean", "sequence", 0.0),  # gspo
]
# (micro_batch_rows, micro_batch_tokens) per world size: rank 0's rows make 3 micro-batches under the token budget,
# rank 1's 2 (tests/test_learner.py: synthetic_batch), so the ranks must even their counts out
LAYOUTS = {1: (3, 0), 2: (8, 18)}


def _batch():
    from tests.test_learner import synthetic_batch

    return synthetic_batch(n=8)


def _worker(rank: int, world_size: int, port: int, tmp: str, shard: bool | None, sync_every: bool, lora_rank: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two CPU ranks on a small machine
    from learners import lora_overrides, make_learner

    from rlvr import distributed
    from rlvr.algo import LossOptions
    from rlvr.lora import LoraSpec, adapter_weights

    distributed.init()
    batch = _batch()
    adv = torch.linspace(-1.2, 1.0, batch.num_rows, dtype=torch.float64)  # [N]
    out = {}
    rows, tokens = LAYOUTS[world_size]
    spec = LoraSpec(rank=lora_rank, alpha=2.0 * lora_rank, dropout=0.0, target_modules=None, init=None, seed=3) if lora_rank else None
    for aggregation, ratio, kl_coef in CASES[::2] if lora_rank else CASES:  # LoRA: GRPO's (its reference: the base) and DAPO's
        learner = make_learner(*DIST, "trainer.weight_decay=0.01", f"trainer.micro_batch_rows={rows}",
                               f"trainer.micro_batch_tokens={tokens}", f"algo.kl_coef={kl_coef}", *lora_overrides(spec),
                               world_size=world_size, shard=shard)  # fmt: skip
        learner.sync_every_micro_batch = sync_every  # the GPU's reduce-scatter after every micro-batch, on CPU
        if spec is not None and kl_coef > 0:
            _check_lora_reference_and_state(spec, learner, batch, adv, Path(tmp) / f"lora-state-{world_size}")
        if learner.sharded:  # the sync probe's forward (the engine awake beside it) leaves the policy's root resharded
            learner.sequence_logprobs(batch.input_ids[0, :6].tolist())
            assert all(isinstance(p, DTensor) for p in learner.model.parameters())
        g = torch.Generator().manual_seed(1)
        noise = torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
        old = learner.logprobs(batch) + 0.1 * noise  # [N, T] off-policy, so the clip is exercised
        # the engine's logprobs differ from the learner's, some by more than the cap: the correction is exercised
        batch.engine_logprobs = old + 0.8 * torch.randn(batch.response_mask.shape, generator=g, dtype=torch.float64)
        ref = learner.logprobs(batch, reference=True) if kl_coef > 0 else None
        if ref is not None and learner.sharded and learner.reference is not None:  # its root resharded after the pass
            assert all(isinstance(p, DTensor) for p in learner.reference.parameters())
        kwargs = dict(ratio=ratio, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_len=8,
                      kl_coef=kl_coef, kl_estimator="k3", clip_ratio_c=None, rollout_correction="token_truncated",
                      rollout_correction_cap=2.0)  # fmt: skip
        metrics = [learner.update(batch, adv, batch.response_mask, old, ref, options=LossOptions(**kwargs)) for _ in range(2)]
        weights = {name: t.clone() for name, t in learner.named_weights()}  # with LoRA: merged
        if spec is not None:
            weights.update(adapter_weights(learner.model, learner._full))
        out[f"{aggregation}/{ratio}"] = (weights, metrics)
    push = _push_and_export(world_size, shard, Path(tmp)) if not (sync_every or lora_rank) else None
    if rank == 0:
        torch.save({"steps": out, "push": push}, f"{tmp}/world{world_size}-{shard}-{sync_every}-{lora_rank}.pt")
    distributed.shutdown()


def _push_and_export(world_size: int, shard: bool | None, tmp: Path) -> dict:
    """A fresh float32 learner's pushed weights (named_weights: the masters, and bf16 casts for a bf16 engine), the
    all-gathers each push took, what the old gather (one DTensor.full_tensor per parameter) gives, and its exported
    folder (save, 50 kB files: an index and many shards)."""
    from learners import make_learner

    from rlvr import sharding

    learner = make_learner("model.dtype=float32", "algo.kl_coef=0", world_size=world_size, shard=shard)
    gather, calls = torch.distributed.all_gather_single, []

    def counted(*args, **kwargs):
        calls.append(args[1].dtype)  # the wire dtype
        return gather(*args, **kwargs)

    torch.distributed.all_gather_single = counted
    try:
        masters = {name: t.clone() for name, t in learner.named_weights()}
        masters_calls = calls[:]
        bf16 = {name: t.clone() for name, t in learner.named_weights(torch.bfloat16)}
    finally:
        torch.distributed.all_gather_single = gather
    old = {name: sharding.full_tensor(p, learner.device).clone() for name, p in learner.model.named_parameters()}
    folder = tmp / f"export-{world_size}-{shard}"
    learner.save(folder, max_shard_bytes=50_000)
    units = 1 + learner.model.config.num_hidden_layers if learner.sharded else 0  # the root, each decoder layer
    return {"masters": masters, "bf16": bf16, "old": old, "calls": (masters_calls, calls[len(masters_calls) :]),
            "units": units, "folder": folder}  # fmt: skip


def _check_lora_reference_and_state(spec, like, batch, adv, folder: Path) -> None:
    """On this world size (FSDP2 over two ranks), with a LoRA learner built like `like`: the reference is the base model
    exactly while the adapter has moved, follows the adapter at a refresh and stays put after, and save_state /
    load_state restore adapter, AdamW state and reference."""
    from learners import lora_overrides, make_learner

    from rlvr.algo import LossOptions

    world_size = like.world_size
    learner = make_learner(*DIST, f"trainer.micro_batch_rows={like.micro_batch_rows}", "algo.kl_coef=0.1",
                           f"trainer.micro_batch_tokens={like.micro_batch_tokens}", *lora_overrides(spec), world_size=world_size,
                           shard=like.sharded)  # fmt: skip
    dapo = dict(ratio="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean", max_len=8, kl_coef=0.0,
                kl_estimator="k3", clip_ratio_c=None, rollout_correction="none", rollout_correction_cap=2.0)  # fmt: skip
    base = make_learner(*DIST, f"trainer.micro_batch_rows={learner.micro_batch_rows}", world_size=world_size,
                        shard=learner.sharded)  # fmt: skip
    learner.update(batch, adv, batch.response_mask, None, None, options=LossOptions(**dapo))  # B moves off zero
    policy, ref = learner.logprobs(batch), learner.logprobs(batch, reference=True)
    torch.testing.assert_close(ref, base.logprobs(batch), rtol=0, atol=1e-12)
    assert (policy - ref).abs().max() > 1e-3
    learner.refresh_reference()
    torch.testing.assert_close(learner.logprobs(batch, reference=True), policy, rtol=0, atol=1e-12)
    learner.save_state(folder / "moved")
    learner.update(batch, adv, batch.response_mask, None, None, options=LossOptions(**dapo))
    torch.testing.assert_close(learner.logprobs(batch, reference=True), policy, rtol=0, atol=1e-12)
    after = learner.logprobs(batch)
    assert (after - policy).abs().max() > 1e-4
    learner.load_state(folder / "moved")  # back to the refresh: adapter, moments, reference
    torch.testing.assert_close(learner.logprobs(batch), policy, rtol=0, atol=1e-12)
    learner.update(batch, adv, batch.response_mask, None, None, options=LossOptions(**dapo))
    torch.testing.assert_close(learner.logprobs(batch), after, rtol=0, atol=1e-12)  # the same step again: AdamW restored


# what every learner here shares (tests/learners.py adds no warmup, no schedule, no token budget)
DIST = ("model.dtype=float64", "trainer.lr=1e-2", "trainer.grad_clip=0.5")

# what each world size runs, one after another in the same spawned processes (shard, sync_every, lora_rank): one process
# trains the plain module, FSDP2 over a single rank, and LoRA; two shard it with FSDP2, reduce-scatter after every
# micro-batch, and LoRA with that reduce-scatter
VARIANTS = {1: [(None, False, 0), (True, False, 0), (None, False, 4)], 2: [(None, False, 0), (None, True, 0), (None, True, 4)]}


def _worker_variants(rank: int, world_size: int, ports: list[int], tmp: str, variants: list[tuple]) -> None:
    """_worker once per variant, in this process: each variant its own process group (on its own port) and its own
    learners, so the spawns' start-up (torch, transformers) is paid once per world size, not once per variant."""
    for port, (shard, sync_every, lora_rank) in zip(ports, variants):
        _worker(rank, world_size, port, tmp, shard, sync_every, lora_rank)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:  # held open together: n distinct ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _run_variants(world_size: int, tmp: Path) -> dict[tuple, dict]:
    variants = VARIANTS[world_size]
    mp.start_processes(_worker_variants, args=(world_size, _free_ports(len(variants)), str(tmp), variants),
                       nprocs=world_size, join=True, start_method="spawn")  # fmt: skip
    return {v: torch.load(tmp / f"world{world_size}-{v[0]}-{v[1]}-{v[2]}.pt", weights_only=False) for v in variants}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict]:
    """Every variant's result on 1 and 2 ranks, keyed (world_size, shard, sync_every, lora_rank): two spawns in all,
    read by both tests."""
    here = Path(__file__).resolve().parent
    tmp = tmp_path_factory.mktemp("ranks")
    with pytest.MonkeyPatch.context() as monkeypatch:
        for path in (here.parent, here):  # spawned children re-import this module by name
            monkeypatch.syspath_prepend(str(path))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")]))
        return {(w, *v): result for w in VARIANTS for v, result in _run_variants(w, tmp).items()}


def test_one_and_two_ranks_take_the_same_step(ranks: dict[tuple, dict]) -> None:
    one, two = ranks[1, None, False, 0]["steps"], ranks[2, None, False, 0]["steps"]  # one process trains the plain module, two shard it with FSDP2
    one_sharded = ranks[1, True, False, 0]["steps"]  # FSDP2 over a single rank: the same step as the plain module
    two_synced = ranks[2, None, True, 0]["steps"]  # gradients reduce-scattered after every micro-batch, as on GPUs
    from transformers import AutoModelForCausalLM

    start = dict(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64).named_parameters())
    for case in one:
        (w1, m1), (w2, m2), (w1s, _), (w2s, _) = one[case], two[case], one_sharded[case], two_synced[case]
        moved = max((w1[k] - start[k]).abs().max().item() for k in w1)
        assert moved > 1e-3, case  # the step did something: a shared bug that leaves the weights alone would pass
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-8, msg=f"{case} {name}")
            torch.testing.assert_close(w1s[name], w1[name], rtol=1e-5, atol=1e-8, msg=f"{case} {name} (FSDP2, 1 rank)")
            torch.testing.assert_close(w2s[name], w1[name], rtol=1e-5, atol=1e-8, msg=f"{case} {name} (synced each micro-batch)")
        for a, b in zip(m1, m2):  # metrics are global too: the loss, clip fractions, grad norm
            keys = ("pg_loss", "clip_frac", "grad_norm", "entropy", "ratio_max", "ratio_min", "rollout_ratio_mean",
                    "rollout_ratio_max", "rollout_capped_frac")  # fmt: skip
            for key in keys:
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-12), (case, key)
        assert m1[1]["clip_frac"] > 0, case
        assert 0 < m1[0]["rollout_capped_frac"] < 1, case


def test_one_and_two_ranks_train_the_same_adapter(ranks: dict[tuple, dict]) -> None:
    """LoRA under FSDP2: the adapter's A and B (rank 0 draws A and broadcasts it; the base is frozen in every shard)
    and the merged weights after two steps are those of one rank's plain module, for GRPO (KL against the base with
    the adapter disabled) and DAPO; every B moved off zero and the merged weights off the base."""
    one, two = ranks[1, None, False, 4]["steps"], ranks[2, None, True, 4]["steps"]
    from transformers import AutoModelForCausalLM

    start = dict(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64).named_parameters())
    assert len(one) == 2
    for case in one:
        (w1, m1), (w2, m2) = one[case], two[case]
        assert any(".lora_A." in k for k in w1) and set(w1) == set(w2)
        merged = [k for k in w1 if k in start]
        assert max((w1[k] - start[k]).abs().max().item() for k in merged) > 1e-3, case
        assert min(w1[k].abs().max().item() for k in w1 if ".lora_B." in k) > 1e-4, case
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-8, msg=f"{case} {name}")
        for a, b in zip(m1, m2):
            assert ("kl" in a) == case.startswith("seq_mean_token_mean"), case  # GRPO's KL term
            for key in ("pg_loss", "grad_norm", "entropy", "kl"):
                if key in a:
                    assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-12), (case, key)


def test_weights_are_gathered_unit_by_unit_and_exported_alike(ranks: dict[tuple, dict]) -> None:
    """named_weights on 1 rank (plain module), FSDP2 over 1 rank and 2 ranks: the same names, dtypes and bits as the
    old per-parameter gather and as each other (float32), bf16 casts of the masters when asked for bf16, in one
    all-gather per FSDP unit (the root, 4 decoder layers) and none unsharded. The exported folders (an index over many
    files) load in transformers to the masters, the same from every world."""
    from transformers import AutoModelForCausalLM

    plain, one, two = ranks[1, None, False, 0]["push"], ranks[1, True, False, 0]["push"], ranks[2, None, False, 0]["push"]
    for push in (plain, one, two):
        assert sorted(push["masters"]) == sorted(plain["old"])  # (FSDP2: the root's unit first, then each layer's)
        for name, old in plain["old"].items():
            assert old.dtype == torch.float32 and push["masters"][name].dtype == torch.float32, name
            assert torch.equal(push["masters"][name], old) and torch.equal(push["old"][name], old), name
            assert torch.equal(push["bf16"][name], old.to(torch.bfloat16)), name
        assert push["calls"] == ([torch.float32] * push["units"], [torch.bfloat16] * push["units"])
    assert (plain["units"], one["units"], two["units"]) == (0, 5, 5)  # against 38 parameters
    assert (two["folder"] / "model.safetensors.index.json").is_file()
    for push in (plain, one, two):
        model = AutoModelForCausalLM.from_pretrained(push["folder"])
        assert model.dtype == torch.float32  # the built-in model's own (config.json)
        state = model.state_dict()
        for name, old in plain["old"].items():
            assert torch.equal(state[name], old), name
