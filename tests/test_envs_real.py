"""The built-in environments on a real chat model (SmolLM2-135M-Instruct) through the CLI: textarena's GuessTheNumber
(data=env), code_feedback (data=code functions) and math_retry (data=calc), each one step and then `rlvr eval run=`,
token-exact with an fp32 learner, observations framed as the chat template's user messages. make test-slow."""

from __future__ import annotations

import json

import pytest

COMMON = ["model=smollm2_135m", "recipe=grpo", "algo.kl_coef=0", "algo.prompts_per_step=2", "algo.prompts_per_minibatch=1",
          "algo.group_size=4", "trainer.max_steps=1", "data.eval_size=4", "logger.samples_every=1", "logger.progress=false",
          "reward.verifier=none", "trainer.precision=fp32", "rollout.dtype=float32"]  # fmt: skip
BUILT_INS = {
    "textarena": ["data=env", "data.env_id=GuessTheNumber-v0", "rollout.env=rlvr.envs.textarena:make", "rollout.max_turns=4",
                  "rollout.max_new_tokens=96"],
    "code_feedback": ["data=code", "data.name=functions", "rollout.env=rlvr.envs.code_feedback:make",
                      "rollout.env_options={attempts: 2}", "rollout.max_turns=2", "rollout.max_new_tokens=256"],
    "math_retry": ["data=calc", "rollout.env=rlvr.envs.math_retry:make", "rollout.env_options={attempts: 2}",
                   "rollout.max_turns=2", "rollout.max_new_tokens=128"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILT_INS))
def test_a_built_in_environment_through_the_cli_and_rlvr_eval(rlvr_cli, tmp_path, name):
    out = tmp_path / name
    result = rlvr_cli("train", *COMMON, *BUILT_INS[name], f"trainer.output_dir={out}", cwd=tmp_path, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = rows[1]
    assert step["rollout/logprob_mismatch_max"] < 1e-4  # fp32 learner = the engine on the model's tokens of episodes
    assert step["env/errors"] == 0 and step["env/turns_per_episode"] >= 1 and "eval/env_success_frac" in rows[-1]
    assert step["reward/mean"] == pytest.approx(step["env/return_mean"], abs=1e-6)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        assert s["prompt"].startswith("<|im_start|>") and s["prompt"].endswith("<|im_start|>assistant\n")
        for turn in (t for t in s["turns"] if t["by"] == "env"):  # the template's user message, then the next header
            assert turn["text"].startswith("\n<|im_start|>user\n") and turn["text"].endswith("<|im_end|>\n<|im_start|>assistant\n")
    if name == "textarena":
        assert all("Guess The Number" in s["prompt"] for s in samples)  # reset's observation is the prompt
    evaluated = rlvr_cli("eval", f"run={out}", "eval.n=0", f"output_dir={tmp_path / 'eval'}", cwd=tmp_path, timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["metrics"]
    for key in ("eval/accuracy", "eval/env_success_frac", "eval/env_turns_per_episode", "eval/env_return_mean"):
        assert report[key] == rows[-1][key], key
