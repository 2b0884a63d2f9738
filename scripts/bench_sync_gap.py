"""The engine against the learner over a run's steps: the sync check's gap after every push, for one push rule and one
pair of dtypes (issue 45: a bf16 learner beside a float32 engine).

    python scripts/bench_sync_gap.py [--push rounded|masters] [--steps 10] [--smoke] [override ...]

The real Learner and vLLM Engine, built as `rlvr train` builds them (scripts/bench_config.py: the recipe tree composed
with the overrides, every `auto` resolved for this machine), on SmolLM2-135M-Instruct (`model=smollm2_135m`, grpo,
kl 0) and one-digit sums (scripts/make_sums.py); --smoke: the built-in model with trainer.precision=bf16, 2 steps.
Each step samples 4 prompts x 4 answers of up to 48 tokens, gives them rewards 1, 0, 0, 1 in every group (no group is
uninformative, so every step updates), takes one update (lr and the rest: the recipe's), pushes and runs the sync
check (rlvr.sync_check; it raises nothing here: the step's gap is recorded and the loop goes on):

    --push rounded   what rlvr pushes (rlvr.startup.push_weights: the weights the learner computes with), and the
                     start-up push where rlvr.settings.startup_push asks for one
    --push masters   the push before issue 45: the master weights in the engine's dtype, no start-up push

One JSON line per step to stdout (step 0: the start-up gap), then one JSON object: the settings, every step's
sync/gap, sync/moved, rollout/logprob_mismatch (mean |learner - engine| over the sampled tokens, before the update)
and generated tokens/s, and their medians over steps 1..N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_config import build_learner, loss_options, run_config, settings_of  # noqa: E402
from make_sums import rows as sums_rows  # noqa: E402

PROMPTS, SAMPLES, TOKENS = 4, 4, 48
REWARDS = [1.0, 0.0, 0.0, 1.0]  # per group: two right, two wrong


def main() -> None:
    import torch

    from rlvr import algo, settings, startup
    from rlvr.models import resolve_model_path
    from rlvr.prompts import load
    from rlvr.rollout import Engine
    from rlvr.sync_check import SyncCheck, SyncError, probe_ids
    from rlvr.types import RolloutBatch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--push", choices=["rounded", "masters"], default="rounded")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    data = Path(tempfile.mkdtemp()) / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in sums_rows(200, seed=0)))
    # --smoke: the built-in model and task (a 64-token context), its learner in bf16 beside its float32 engine
    task = ["trainer.precision=bf16"] if args.smoke else ["model=smollm2_135m", "data=file", f"data.path={data}", "reward.verifier=math"]
    steps, tokens = (2, 8) if args.smoke else (args.steps, TOKENS)
    cfg = run_config("recipe=grpo", *task, "algo.kl_coef=0", f"algo.prompts_per_step={PROMPTS}", f"algo.group_size={SAMPLES}",
                     f"algo.prompts_per_minibatch={PROMPTS}", f"rollout.max_new_tokens={tokens}", "data.eval_size=16",
                     *args.overrides)  # fmt: skip
    s = settings_of(cfg)
    torch.set_num_threads(cfg.trainer.torch_threads)
    path = resolve_model_path(cfg.model.path)
    train, evals, _, max_len, _ = load(cfg, path, verbose=False)
    learner = build_learner(cfg)
    engine = Engine.from_config(path, cfg, max_len)
    torch.set_float32_matmul_precision("high" if cfg.trainer.tf32 else "highest")  # after vLLM's worker, as start-up does

    def push() -> None:
        if args.push == "masters":
            engine.load_weights(learner.named_weights(engine.dtype))
        else:
            startup.push_weights(engine, learner, None, data.parent)

    if args.push == "rounded" and settings.startup_push(s.precision, s.engine_dtype):
        push()
    check = SyncCheck(engine, learner, probe_ids([e.prompt_ids for e in (evals + train)[:8]], max_len - 1))
    rows = [{"step": 0, "sync/gap": check.baseline}]
    print(json.dumps(rows[0]), flush=True)
    options = loss_options(cfg)
    for step in range(1, steps + 1):
        prompts = [e.prompt_ids for e in train[PROMPTS * step : PROMPTS * (step + 1)]]
        start = time.perf_counter()
        groups = engine.generate(prompts, n=SAMPLES, max_tokens=tokens, temperature=cfg.rollout.temperature, top_p=1.0,
                                 seeds=[PROMPTS * step + i for i in range(PROMPTS)], stop=[])  # fmt: skip
        seconds = time.perf_counter() - start
        rewards = REWARDS * PROMPTS
        batch = RolloutBatch.from_completions([c for g in groups for c in g], rewards, [r > 0 for r in rewards],
                                              pad_id=engine.tokenizer.pad_token_id or 0)  # fmt: skip
        mismatch = algo.masked_mean((learner.logprobs(batch) - batch.engine_logprobs).abs(), batch.response_mask).item()
        advantages = algo.group_advantages(torch.tensor(rewards), SAMPLES, scale_by_std=True)  # [N]
        learner.update(batch, advantages, batch.response_mask, None, None, options=options)
        push()
        check.tolerance = float("inf")  # record the gap at every step; the run's check would stop here past 4x start-up
        try:
            metrics = check.after_push(f"step {step}")
        except SyncError as e:  # (only the revisit rule is left: an engine unchanged bit for bit)
            print(json.dumps({"step": step, "error": str(e)}), flush=True)
            break
        rows.append({"step": step, "sync/gap": metrics["sync/gap"], "sync/moved": metrics["sync/moved"],
                     "rollout/logprob_mismatch": mismatch,
                     "generated_tokens_per_s": float(batch.response_mask.sum()) / seconds})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    engine.close()
    later = rows[1:]
    median = {k: statistics.median(r[k] for r in later) for k in later[0] if k != "step"} if later else {}
    print(json.dumps({"push": args.push, "precision": s.precision, "engine_dtype": s.engine_dtype,
                      "start_gap": rows[0]["sync/gap"], "median": median, "steps": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
