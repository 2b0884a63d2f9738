"""Every closed set of the config, once: each option's values as a str enum (a value compares equal to its string).

rlvr.config types its fields with these, rlvr.algo and the verifiers validate their string arguments against them, so
a new value is added in one place. Standard library only: the verifiers and the CLI's config checks import it without
torch.
"""

from __future__ import annotations

import enum


class Advantage(str, enum.Enum):
    group_norm = "group_norm"  # (R - mean) / (std + eps): GRPO, DAPO, GSPO
    group_center = "group_center"  # R - mean: Dr.GRPO
    rloo = "rloo"  # R_i - mean of the group's other G-1 rewards (leave-one-out): RLOO
    reinforce_pp = "reinforce_pp"  # (R - batch mean) / (batch std + eps), over every response of the step: REINFORCE++


class Objective(str, enum.Enum):
    clip = "clip"  # PPO's clipped surrogate: GRPO, Dr.GRPO, DAPO, GSPO
    cispo = "cispo"  # clipped, stop-gradient IS weight times log pi: CISPO (MiniMax-M1)
    sapo = "sapo"  # a sigmoid gate of the ratio in place of the clip: SAPO (Qwen)
    gmpo = "gmpo"  # the geometric mean of the token ratios, clipped in log space: GMPO


class Ratio(str, enum.Enum):
    token = "token"
    sequence = "sequence"  # GSPO
    sequence_token = "sequence_token"  # GSPO-token


class Aggregation(str, enum.Enum):
    seq_mean_token_mean = "seq_mean_token_mean"  # GRPO, GSPO
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"  # Dr.GRPO
    token_mean = "token_mean"  # DAPO


class KLEstimator(str, enum.Enum):
    k1 = "k1"
    k2 = "k2"
    k3 = "k3"


class FilterMetric(str, enum.Enum):
    correctness = "correctness"  # 1 if correct else 0
    reward = "reward"  # the shaped reward


class RoundSize(str, enum.Enum):
    fixed = "fixed"  # every dynamic-sampling round draws B prompts (DAPO's paper, verl's gen_batch_size = B)
    adaptive = "adaptive"  # drawn so that one round usually suffices, from the recent informative fraction


class LRSchedule(str, enum.Enum):
    constant = "constant"  # lr after warmup
    cosine = "cosine"  # lr * (1 + cos(pi * progress)) / 2 after warmup, reaching 0 at the last update


class Task(str, enum.Enum):
    arithmetic = "arithmetic"  # the built-in 2-digit addition task
    file = "file"  # the user's dataset: data.path (a .jsonl/.json/.parquet/.csv file, or a hub dataset id)
    gym = "gym"  # a reasoning-gym procedural dataset: data.name, scored by its own score_answer
    code = "code"  # programs scored by running their tests: data.name = functions (rlvr's own) | humaneval
    calc = "calc"  # the built-in tool task: exact arithmetic that is hard in one's head and easy in Python
    env = "env"  # prompts for an environment without a dataset (rollout.env, data.env_id): the episode is the task


class PromptFormat(str, enum.Enum):
    auto = "auto"  # the tokenizer's chat template when it has one, plain text otherwise
    chat = "chat"  # the chat template, with the assistant's generation prompt
    plain = "plain"  # the text as it is


class ThinkMode(str, enum.Enum):
    auto = "auto"  # the verifier reads only the text after a thinking answer's block (rlvr.thinking)
    off = "off"  # the verifier reads the whole completion


class AnswerExtract(str, enum.Enum):
    none = "none"  # the gold answer field is the final answer
    hashes = "hashes"  # a full solution ending in "#### 72" (GSM8K)
    boxed = "boxed"  # a full solution with the final answer in the last \boxed{...} (MATH)


class Extractor(str, enum.Enum):
    """How the math verifier finds a completion's final answer (rlvr.verifiers.extraction.extract_answer)."""

    boxed = "boxed"  # the last \boxed{...}
    answer_line = "answer_line"  # "Answer: ..."
    final_answer_phrase = "final_answer_phrase"  # "The final answer is 16."
    hashes = "hashes"  # "#### 14"
    answer_tag = "answer_tag"  # <answer>14</answer>
    last_number = "last_number"  # the last number in the text (lenient)


class LongPrompts(str, enum.Enum):
    drop = "drop"  # prompts over data.max_prompt_tokens are dropped before training, with a count in the log
    error = "error"  # any such prompt stops start-up, naming the file and row


class RolloutCorrection(str, enum.Enum):
    none = "none"
    token_truncated = "token_truncated"  # each token's surrogate times min(pi_old_learner / pi_engine, cap)


class PiOld(str, enum.Enum):
    learner = "learner"  # a no-grad pass of the learner over the batch
    engine = "engine"  # the engine's sampled-token logprobs (verl's bypass mode)
    auto = "auto"  # engine where it computes what the learner would (rlvr.startup.pi_old_from_engine), else learner


class Precision(str, enum.Enum):
    auto = "auto"  # resolved by rlvr.settings: bf16 on GPUs and on CPUs with AMX / AVX512-BF16, else fp32
    bf16 = "bf16"
    fp32 = "fp32"


class LoraSync(str, enum.Enum):
    auto = "auto"  # merged where the engine computes in float32, adapter elsewhere (rlvr.lora.sync_mode)
    merged = "merged"  # W + scaling B A pushed as full weights
    adapter = "adapter"  # A and B loaded into vLLM as a LoRA adapter


class VerifierName(str, enum.Enum):
    task = "task"  # the task's own verifier
    arithmetic = "arithmetic"
    math = "math"  # boxed / "Answer:" / "####" answers, math-verify equivalence
    countdown = "countdown"
    gym = "gym"  # reasoning-gym's score_answer on the <answer> tag; correct only at score 1.0
    code = "code"  # the completion's last ```python block run against the row's tests, in a sandbox
    none = "none"  # no verifier: the reward is the environment's return (rollout.env)


class ToolName(str, enum.Enum):
    python = "python"  # a fenced ```python block, run in the sandbox when it closes (rlvr.tools)


class CodeSandbox(str, enum.Enum):
    bwrap = "bwrap"  # bubblewrap namespaces + the harness's limits and seccomp filter (rlvr.verifiers.code.sandbox)
    none = "none"  # the harness's limits and filter only, with the user's rights: for machines without user namespaces
