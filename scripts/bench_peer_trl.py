"""The main job's peer: TRL's GRPOTrainer on the same model, task, evaluation and hyperparameters, timed the same way.

    python scripts/bench_peer_trl.py [--seeds 0 1] [--full]     (needs trl: `make bench-peer` installs trl==1.16.0)
    python scripts/bench_peer_trl.py --smoke --out /tmp/t       # seconds: one seed, one update, 64 held-out pairs

What is the same as `rlvr train recipe=dapo`: the built-in model, the 9,000 training pairs, greedy accuracy on the
1,000 held-out pairs at the start and every 20 rollout steps, 64 prompts x 8 samples per rollout, 16 optimizer updates
of 32 samples each per rollout, AdamW lr 3e-4 with a cosine decay over 200 rollouts (fused, no weight decay), gradient
norm clip 1.0, clip 0.2 / 0.28, a token-level loss (TRL's `loss_type="dapo"`), group-normalized advantages, no KL,
temperature 1.0, at most 8 new tokens, fp32, 2 torch threads. Where TRL differs: no dynamic sampling (its groups with
no spread train with zero advantage), no overlong shaping (no answer here comes near 8 tokens), each update's 32
samples are drawn from the whole rollout (rlvr's are 4 whole groups), and its loss divides by the rollout's token
count / 16 (rlvr's by the update's own count; answers here are 3-4 tokens, so the two are close). It samples with
transformers' `generate` (no vLLM: TRL 1.16 supports vLLM up to 0.31) and the evaluation uses `generate` too.

Prints one JSON line per evaluation (`step` in rollouts, `eval/accuracy`, `time/elapsed_s` from the process's start,
as rlvr's metrics.jsonl counts it), then per seed the seconds to the first evaluation at or above --target. Without
--full a run stops at that evaluation. The last line of stdout is one JSON object (per seed: seconds to the target,
null where no evaluation reached it, and its evaluations). --smoke: seed 0, one rollout of 64 prompts and one update,
greedy evaluation on the first 64 held-out pairs (tests/test_scripts.py; skipped where trl is not installed).
Run it alone: two runs at once share the cores and every number is wrong.
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # before the imports: rlvr's time/elapsed_s counts from the process's start as well

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROLLOUT_PROMPTS, GROUP, MINIBATCH_PROMPTS, STEPS, EVAL_EVERY = 64, 8, 4, 200, 20
UPDATES_PER_ROLLOUT = ROLLOUT_PROMPTS // MINIBATCH_PROMPTS


def train(seed: int, target: float, full: bool, out: Path, smoke: bool = False) -> None:
    """One TRL run in this process; its evaluations go to stdout as JSON lines."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.models import resolve_model_path
    from rlvr.tasks import arithmetic
    from rlvr.verifiers import Outcome
    from rlvr.verifiers.arithmetic import verify

    torch.set_num_threads(2)
    path = resolve_model_path("builtin:tiny-arith")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    held_out = arithmetic.eval_examples(64 if smoke else arithmetic.EVAL_POOL_SIZE)
    prompts = tokenizer([e.prompt for e in held_out], return_tensors="pt", padding=True)

    @torch.no_grad()
    def accuracy(m: torch.nn.Module) -> float:
        was_training = m.training
        m.eval()
        ids = m.generate(**prompts, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(ids[:, prompts["input_ids"].shape[1] :], skip_special_tokens=True)
        m.train(was_training)
        return sum(verify(t, e.answer) is Outcome.CORRECT for t, e in zip(texts, held_out, strict=True)) / len(held_out)

    class Evaluate(TrainerCallback):
        def _evaluate(self, state, control, m):  # type: ignore[no-untyped-def]
            acc = accuracy(m)
            print(json.dumps({"step": state.global_step // UPDATES_PER_ROLLOUT, "eval/accuracy": acc,
                              "time/elapsed_s": round(time.monotonic() - T0, 3)}), flush=True)
            if acc >= target and not full:
                control.should_training_stop = True

        def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            self._evaluate(state, control, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step % (EVAL_EVERY * UPDATES_PER_ROLLOUT) == 0 or state.global_step == state.max_steps:
                self._evaluate(state, control, model)

    def reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
        return [float(verify(c, a) is Outcome.CORRECT) for c, a in zip(completions, answer, strict=True)]

    data = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in arithmetic.train_examples()])
    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, seed=seed, data_seed=seed, report_to="none", save_strategy="no",
        logging_steps=10**6, disable_tqdm=True,
        per_device_train_batch_size=MINIBATCH_PROMPTS * GROUP, gradient_accumulation_steps=1,
        steps_per_generation=UPDATES_PER_ROLLOUT, num_generations=GROUP, max_steps=1 if smoke else STEPS * UPDATES_PER_ROLLOUT,
        learning_rate=3e-4, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch_fused", epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group", beta=0.0,
        num_iterations=1, temperature=1.0, top_p=1.0, max_completion_length=8,
        bf16=False,  # TRL's default is bf16 autocast; the built-in model's recipe trains in fp32 (model/tiny_arith.yaml)
    )
    GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
                callbacks=[Evaluate()]).train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--target", type=float, default=0.90)
    ap.add_argument("--full", action="store_true", help="run all 200 rollouts instead of stopping at the target")
    ap.add_argument("--out", default="bench-out/trl")
    ap.add_argument("--smoke", action="store_true", help="seconds: seed 0, one update, 64 held-out pairs (docstring)")
    ap.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)  # one run, in a child process
    args = ap.parse_args()
    if args.seed is not None:
        train(args.seed, args.target, args.full, Path(args.out) / f"seed{args.seed}", smoke=args.smoke)
        return
    if args.smoke:
        args.seeds = [0]
    summary = {}
    for seed in args.seeds:  # a fresh process per seed, so that each run's clock starts at its own launch
        cmd = [sys.executable, __file__, "--seed", str(seed), "--target", str(args.target), "--out", args.out,
               *(["--smoke"] if args.smoke else [])]  # fmt: skip
        evals = []
        with subprocess.Popen([*cmd, *(["--full"] if args.full else [])], stdout=subprocess.PIPE, text=True) as run:
            assert run.stdout is not None
            for line in run.stdout:  # the trainer prints its own summary too (a Python dict, not JSON)
                if line.startswith('{"'):
                    evals.append(json.loads(line))
                    print(json.dumps({"seed": seed, **evals[-1]}), flush=True)
        if run.returncode:
            raise SystemExit(f"trl seed {seed}: exit code {run.returncode}")
        reached = [e["time/elapsed_s"] for e in evals if e["eval/accuracy"] >= args.target]
        first = reached[0] if reached else math.inf
        print(f"trl seed {seed}: s to {args.target:.2f} = {'-' if math.isinf(first) else f'{first:.0f}'}", flush=True)
        summary[str(seed)] = {"to_target_s": None if math.isinf(first) else first, "evals": evals}
    print(json.dumps({"target": args.target, "smoke": args.smoke, "seeds": summary}), flush=True)


if __name__ == "__main__":
    main()
