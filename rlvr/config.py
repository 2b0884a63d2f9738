"""The typed schema of a run: dataclasses (their option types are rlvr.choices'), and the cross-field checks.
(~470 lines, one job: every key of the run and every check across keys, read in one place; the checks that depend
on the number of ranks are rlvr.ranks'.)

Every value comes from the recipe tree (`recipes/`); nothing here has a default, so a recipe
that forgets a field fails at start-up instead of riding on a silent default.
"""

from __future__ import annotations

import difflib
import importlib.resources
from dataclasses import MISSING as MISSING_FACTORY
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from rlvr.choices import (  # noqa: F401 (re-exported: the schema's option types)
    Advantage,
    Aggregation,
    AnswerExtract,
    CodeSandbox,
    Extractor,
    FilterMetric,
    KLEstimator,
    LongPrompts,
    LoraSync,
    LRSchedule,
    Objective,
    PiOld,
    Precision,
    PromptFormat,
    Ratio,
    RolloutCorrection,
    RoundSize,
    Task,
    ThinkMode,
    ToolName,
    VerifierName,
)


class ConfigError(ValueError):
    """A config problem, reported before any model loads."""


@dataclass
class AlgoConfig:
    advantage: Advantage = MISSING
    objective: Objective = MISSING  # the policy-gradient term: clip | cispo | sapo | gmpo (rlvr.algo.surrogate)
    ratio: Ratio = MISSING
    clip_low: float = MISSING
    clip_high: float = MISSING
    clip_ratio_c: float | None = MISSING  # dual clip for A < 0 (objective clip only); null = off
    sapo_tau_pos: float = MISSING  # objective sapo: the gate's temperature for A > 0
    sapo_tau_neg: float = MISSING  # objective sapo: the gate's temperature for A <= 0
    aggregation: Aggregation = MISSING
    kl_coef: float = MISSING
    kl_estimator: KLEstimator = MISSING
    ref_update_every: int = MISSING  # pi_ref <- pi_theta every K steps; 0 = never
    group_size: int = MISSING  # G
    prompts_per_step: int = MISSING  # B
    prompts_per_minibatch: int = MISSING  # B / this = optimizer updates per epoch
    epochs: int = MISSING  # mu
    dynamic_sampling: bool = MISSING
    filter_metric: FilterMetric = MISSING
    max_gen_batches: int = MISSING  # rollout rounds per step before training on what was kept
    round_size: RoundSize = MISSING  # prompts per dynamic-sampling round: fixed (B) | adaptive
    overlong_shaping: bool = MISSING
    overlong_buffer_frac: float = MISSING  # L_cache as a fraction of rollout.max_new_tokens
    overlong_factor: float = MISSING
    overlong_filter: bool = MISSING  # truncated responses get zero loss weight
    rollout_correction: RolloutCorrection = MISSING  # engine/learner numerics mismatch: none | token_truncated
    rollout_correction_cap: float = MISSING  # C, the truncation of pi_old / pi_engine
    pi_old: PiOld = MISSING  # where pi_old's logprobs come from: learner | engine | auto


@dataclass
class ToolConfig:
    sandbox: CodeSandbox = MISSING  # bwrap | none, as reward.code.sandbox
    cpu_s: float = MISSING  # CPU seconds per call
    timeout_s: float = MISSING  # wall-clock seconds per call (a function tool's too)
    memory_mb: int = MISSING  # address space per call
    output_tokens: int = MISSING  # the most tokens of a call's output the model is shown
    workers: int = MISSING  # calls run at once
    instruction: str = MISSING  # how to call the tools, added to the system prompt (chat) or before the prompt (plain)


@dataclass
class RolloutConfig:
    max_new_tokens: int = MISSING  # L_max
    temperature: float = MISSING
    top_p: float = MISSING
    dtype: str = MISSING  # auto | float32 | bfloat16 | float16 (rlvr.settings)
    stop: list[str] = MISSING  # extra stop strings; the model's EOS / end-of-turn tokens always stop
    cuda_graphs: Any = MISSING  # auto | true | false (rlvr.settings)
    sleep: Any = MISSING  # auto | true | false: the engine frees the GPU during the learner's phases (rlvr.settings)
    gpu_memory_utilization: float = MISSING
    cpu_kv_cache_gib: int = MISSING
    kv_cache_gib: Any = MISSING  # GPU: the engine's KV cache in GiB; auto (rlvr.settings)
    tensor_parallel_size: int = MISSING  # engine ranks per model copy under torchrun; 1 = one engine per rank
    max_num_seqs: Any = MISSING  # int | auto: sequences an engine runs at once (vLLM's max_num_seqs; rlvr.settings)
    tools: list[str] = MISSING  # tools the model may call while it answers (rlvr.tools): python, package.module:function
    max_turns: int = MISSING  # tool calls per answer, at most
    tool: ToolConfig = field(default_factory=ToolConfig)  # the python tool's sandbox, limits and instruction
    env: str | None = MISSING  # "package.module:make": every answer an episode of its own environment (rlvr.envs); null = none
    env_options: dict[str, Any] | None = MISSING  # keyword arguments of every make call; null = none
    env_timeout_s: float = MISSING  # wall-clock seconds of one reset, step or close


@dataclass
class LoraConfig:
    rank: int = MISSING  # r; 0 = off (every weight trains)
    alpha: float = MISSING  # the update is (alpha / r) B A
    dropout: float = MISSING  # on the adapter's input, in training forwards only
    target_modules: list[str] | None = MISSING  # module names (q_proj, ...); null = every linear layer of the decoder
    init: str | None = MISSING  # a peft adapter folder to start from; null = a fresh adapter (B = 0: the base model)
    sync: LoraSync = MISSING  # how the engine follows the adapter: auto | merged | adapter


@dataclass
class ModelConfig:
    path: str = MISSING  # "builtin:<name>", a local HF folder, or a hub id
    dtype: str = MISSING  # learner parameter dtype (the master weights; with LoRA, the adapter's)
    chat_template: str | None = MISSING  # a .jinja file used in place of the model folder's chat template; null = its own
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    task: Task = MISSING
    path: str | None = MISSING  # task=file: training rows
    eval_path: str | None = MISSING  # task=file: held-out rows; null = the last eval_size rows of path
    split: str = MISSING  # split name when path is a hub dataset id
    prompt_key: str = MISSING  # task=file: the field holding the prompt text
    answer_key: str = MISSING  # task=file: the field holding the ground-truth answer
    eval_size: int = MISSING
    skip_solved: int = MISSING  # skip a training prompt once its group was all correct on N visits in a row; 0 = off
    max_prompt_tokens: int = MISSING  # the prompt budget; 0 = no limit beyond the model's context
    long_prompts: LongPrompts = MISSING
    format: PromptFormat = MISSING  # how prompts become token ids (rlvr.prompts)
    system_prompt: str | None = MISSING  # null = none
    prompt_template: str = MISSING  # "{prompt}" is replaced by the row's prompt
    chat_template_kwargs: dict[str, Any] | None = MISSING  # arguments of every chat-template render; null = none
    subset: str | None = MISSING  # hub dataset config name (GSM8K's "main"); null = the default
    answer_extract: AnswerExtract = MISSING  # reduce a gold solution to its final answer
    name: str | None = MISSING  # task=gym: the reasoning-gym dataset
    size: int = MISSING  # task=gym: training examples generated
    seed: int = MISSING  # task=gym: generator seed (held-out examples use another, derived from it)
    options: dict[str, Any] | None = MISSING  # task=gym: the dataset's own options; null = its defaults
    tests_key: str | None = MISSING  # task=file: the column with each row's tests (a code dataset); null = answers
    env_id: str | None = MISSING  # task=env: the environment each prompt is an episode of (textarena's game id)


@dataclass
class RewardTerm:
    fn: str = MISSING  # "package.module:function", (completion, answer) -> Outcome | float
    weight: float = MISSING


@dataclass
class CodeConfig:
    sandbox: CodeSandbox = MISSING
    time_limit_s: float = MISSING  # CPU seconds per test
    memory_mb: int = MISSING  # address space per process


@dataclass
class RewardConfig:
    verifier: VerifierName = MISSING
    fn: str | None = MISSING  # a user function replacing the verifier; null = the verifier
    terms: list[RewardTerm] = MISSING  # extra weighted user terms added to the reward
    correct: float = MISSING
    incorrect: float = MISSING
    no_answer: float = MISSING
    timed_out: float | None = MISSING  # the verifier gave up (work budget or timeout_s); null = incorrect
    extract: list[Extractor] | None = MISSING  # math/gym verifiers: where to look for the answer; null = the verifier's own
    partial: bool = MISSING  # gym verifier: the dataset's float score is the reward (correct still means 1.0)
    workers: int = MISSING  # verifier worker processes; 0 = in-process, no timeout
    timeout_s: float = MISSING  # per-sample wall-clock limit
    gold_check: float = MISSING  # share of gold answers that must score CORRECT before any model loads; 0 = skip
    think: ThinkMode = MISSING  # auto: a thinking answer is graded on the text after its block (rlvr.thinking) | off
    think_tags: list[str] = MISSING  # the block's open and close tags
    code: CodeConfig = field(default_factory=CodeConfig)  # the code verifier's sandbox and limits


@dataclass
class TrainerConfig:
    seed: int = MISSING
    max_steps: int = MISSING
    output_dir: str = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    grad_clip: float = MISSING
    warmup_steps: int = MISSING
    lr_schedule: LRSchedule = MISSING
    micro_batch_rows: int = MISSING  # the most rows per forward/backward
    micro_batch_tokens: Any = MISSING  # padded tokens (rows x longest) per forward/backward; 0 = rows only; auto
    eval_every: int = MISSING
    torch_threads: Any = MISSING  # int | auto
    precision: Precision = MISSING  # learner compute precision
    tf32: Any = MISSING  # auto | true | false: TF32 matmuls for the fp32 ones left on CUDA
    logits_chunk_tokens: Any = MISSING  # int | auto: tokens per chunk of the LM head's logits
    activation_checkpointing: Any = MISSING  # auto | true | false
    compile: bool = MISSING  # torch.compile each decoder layer of the learner (one rank, no LoRA, no checkpointing)
    cpu_offload: bool = MISSING  # FSDP2 parameters, gradients and optimizer state on CPU
    save_every: int = MISSING  # checkpoint every N steps (and at the end); 0 = at the end only
    keep_last: int = MISSING  # complete checkpoints kept on disk
    resume: str = MISSING  # auto (newest complete checkpoint in output_dir) | never | a checkpoint folder
    max_bad_steps: int = MISSING  # consecutive steps with a non-finite loss/grad norm before the run stops


@dataclass
class LoggerConfig:
    wandb: bool = MISSING
    project: str = MISSING
    progress: bool = MISSING  # a live progress bar on a terminal (without one: a plain line every 10 steps)
    verbose: bool = MISSING  # other libraries' log lines and warnings on the console (else in the run's rlvr.log)
    samples_every: int = MISSING  # write sample rollouts to samples.jsonl every N steps (and at every evaluation); 0 = at evaluations only
    num_samples: int = MISSING  # rollouts written each time


@dataclass
class EvalConfig:
    n: int = MISSING  # sampled answers per held-out prompt for mean@n and pass@k; 0 = greedy only
    temperature: float = MISSING  # sampling temperature of those answers
    top_p: float = MISSING  # their nucleus sampling mass; 1.0 = off
    seed: int = MISSING  # the sampled answers' seeds derive from it and the prompt's place in the set


@dataclass
class Config:
    algo: AlgoConfig = MISSING
    rollout: RolloutConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    reward: RewardConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = MISSING


_SECTIONS: dict[str, type] = {
    "algo": AlgoConfig,
    "rollout": RolloutConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "trainer": TrainerConfig,
    "logger": LoggerConfig,
    "eval": EvalConfig,
}


def schema_keys() -> list[str]:
    """Every dotted key of the schema: 'algo', 'algo.clip_high', ..."""

    def under(prefix: str, cls: type) -> list[str]:
        keys = [prefix]
        for f in fields(cls):
            nested = f.default_factory if f.default_factory is not MISSING_FACTORY else None  # a nested section
            keys += under(f"{prefix}.{f.name}", nested) if is_dataclass(nested) else [f"{prefix}.{f.name}"]  # type: ignore[arg-type]
        return keys

    return [key for section, cls in _SECTIONS.items() for key in under(section, cls)]


def unknown_key_message(key: str) -> str | None:
    """None if `key` is in the schema, else a message naming it, a suggestion and the valid keys."""
    valid = schema_keys()
    if key in valid:
        return None
    parent = key.rpartition(".")[0]
    siblings = [k for k in valid if k.rpartition(".")[0] == parent] if parent in valid or not parent else valid
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    where = f"'{parent}'" if parent in valid else "the config"
    return f"unknown config key '{key}'.{hint} Valid keys in {where}: {', '.join(sorted(siblings))}"


GROUPS = ("recipe", "model", "data", "logger")  # the recipe tree's config groups (recipes/<group>/<choice>.yaml)
RECIPES = str(importlib.resources.files("rlvr.recipes"))  # the recipe tree (recipes/) ships inside the package


def compose_tree(config_name: str, overrides: list[str]) -> DictConfig:
    """recipes/<config_name>.yaml (config, eval or plan) composed with `overrides` by Hydra's compose API: no output
    folder, no logging set up (the commands' own composition is hydra.main's, over the same tree). ConfigError when
    Hydra refuses an override."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=RECIPES, version_base=None):
            return hydra_compose(config_name, overrides=overrides)
    except HydraException as e:
        raise ConfigError(str(e).splitlines()[0]) from None


def override_key(override: str) -> str:
    """The key of a command-line override: `+trainer.lr=1e-4` -> `trainer.lr`."""
    return override.split("=", 1)[0].lstrip("+~")


def validate(raw: DictConfig | dict[str, Any]) -> Config:
    """Merge a composed config into the typed schema, then run the cross-field checks."""
    raw_cfg = OmegaConf.create(raw) if isinstance(raw, dict) else raw
    if isinstance(raw_cfg, DictConfig):
        raw_cfg = OmegaConf.masked_copy(raw_cfg, [str(k) for k in raw_cfg if k != "hydra"])
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw_cfg)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except ConfigKeyError as e:
        key = str(e.full_key) if e.full_key else str(e)
        raise ConfigError(unknown_key_message(key) or str(e)) from None
    except MissingMandatoryValue as e:
        raise ConfigError(f"config key '{e.full_key}' has no value; set it in the recipe or on the command line") from None
    except OmegaConfBaseException as e:
        key = e.full_key or _rejected_key(raw_cfg)  # OmegaConf names no key for a list given to a dict field
        raise ConfigError(f"invalid value for config key '{key}': {(e.msg or str(e)).splitlines()[0]}") from None
    check(cfg)
    return cfg


def _rejected_key(raw: Any) -> str:
    """The first top-level field of a section that the schema refuses on its own (only on the error path)."""
    for section in raw:
        for name in raw[section] if isinstance(raw[section], DictConfig) else []:
            try:
                OmegaConf.merge(OmegaConf.structured(Config), {section: {name: raw[section][name]}})
            except OmegaConfBaseException:
                return f"{section}.{name}"
    return ""


AUTO = "auto"  # a device-dependent setting that rlvr.settings resolves at start-up
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def auto_or(section: Any, prefix: str, name: str, kind: type, minimum: int | None = None, note: str = "") -> None:
    """Check a field that takes `auto` or a value of `kind` (an int >= minimum), naming the key when it does not."""
    value = getattr(section, name)
    if value == AUTO:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and (minimum is None or value >= minimum)
    if not ok:
        bound = f" >= {minimum}" if minimum is not None else ""
        what = "true or false" if kind is bool else f"an integer{bound}"
        raise ConfigError(f"{prefix}.{name} must be auto or {what}{f' ({note})' if note else ''}, got {value!r}")


CODE_TASKS = ("functions", "humaneval")  # data.task=code: rlvr.tasks.code's sets


def check_tools(r: RolloutConfig) -> None:
    """rollout.tools names known tools, and the tool limits are usable."""
    names = [t.value for t in ToolName]
    for name in r.tools:
        if name not in names and ":" not in str(name):
            raise ConfigError(f"rollout.tools: unknown tool {name!r}; the tools are {names}, or your own functions by "
                              f"import path (e.g. rollout.tools=[python,mypkg.tools:lookup])")  # fmt: skip
    if r.env is not None and (":" not in str(r.env) or r.max_turns < 1 or not r.env_timeout_s > 0 or r.tool.output_tokens < 48):
        raise ConfigError(f"rollout.env names an environment's factory as package.module:function, with rollout.max_turns "
                          f">= 1 (the model's turns in an episode), rollout.env_timeout_s > 0 and rollout.tool.output_tokens "
                          f">= 48 (an observation's cap); got env={r.env!r}, max_turns={r.max_turns}, env_timeout_s="
                          f"{r.env_timeout_s}, output_tokens={r.tool.output_tokens}")  # fmt: skip
    if len(set(r.tools)) != len(r.tools):
        raise ConfigError(f"rollout.tools names a tool twice: {list(r.tools)}")
    t = r.tool
    if r.tools and (r.max_turns < 1 or t.output_tokens < 48 or t.workers < 1 or t.cpu_s <= 0 or t.timeout_s <= 0 or t.memory_mb < 16):
        raise ConfigError(
            f"with rollout.tools, rollout.max_turns and rollout.tool.workers must be >= 1, rollout.tool.output_tokens >= 48 "
            f"(room for the cut marker, one token per character included), rollout.tool.cpu_s and rollout.tool.timeout_s "
            f"> 0 and rollout.tool.memory_mb >= 16; got max_turns={r.max_turns}, workers={t.workers}, output_tokens="
            f"{t.output_tokens}, cpu_s={t.cpu_s}, timeout_s={t.timeout_s}, memory_mb={t.memory_mb}"
        )


def check(cfg: Config) -> None:
    """Cross-field checks: each error names the key(s) at fault."""
    a, r, t = cfg.algo, cfg.rollout, cfg.trainer
    if a.group_size < 2:
        raise ConfigError(
            f"algo.group_size must be >= 2, got {a.group_size}: advantages are relative to the other samples of the "
            "same prompt, so with one sample each every advantage is 0 and nothing is learned"
        )
    positive = {
        "algo.prompts_per_step": a.prompts_per_step,
        "algo.prompts_per_minibatch": a.prompts_per_minibatch,
        "algo.epochs": a.epochs,
        "algo.max_gen_batches": a.max_gen_batches,
        "rollout.max_new_tokens": r.max_new_tokens,
        "trainer.micro_batch_rows": t.micro_batch_rows,
        "trainer.keep_last": t.keep_last,
        "trainer.max_bad_steps": t.max_bad_steps,
        "rollout.tensor_parallel_size": r.tensor_parallel_size,
        "data.eval_size": cfg.data.eval_size,
        "logger.num_samples": cfg.logger.num_samples,
    }
    if cfg.data.skip_solved < 0:
        raise ConfigError(f"data.skip_solved must be >= 0 (0 = off), got {cfg.data.skip_solved}")
    if cfg.reward.workers < 0 or cfg.reward.timeout_s <= 0:
        raise ConfigError(f"reward.workers must be >= 0 and reward.timeout_s > 0, got {cfg.reward.workers}, {cfg.reward.timeout_s}")
    if not 0 <= cfg.reward.gold_check <= 1:
        raise ConfigError(f"reward.gold_check must be a share in [0, 1] (0 = skip the check), got {cfg.reward.gold_check}")
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    if a.prompts_per_step % a.prompts_per_minibatch:
        raise ConfigError(
            f"algo.prompts_per_step ({a.prompts_per_step}) must be a multiple of "
            f"algo.prompts_per_minibatch ({a.prompts_per_minibatch})"
        )
    if not (0 <= a.clip_low <= 1 and a.clip_high >= 0):
        raise ConfigError(f"algo.clip_low must be in [0, 1] (1: no lower bound) and algo.clip_high >= 0, got "
                          f"{a.clip_low}, {a.clip_high}")  # fmt: skip
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
        raise ConfigError(f"algo.clip_ratio_c must be > 1 (or null), got {a.clip_ratio_c}")
    check_tools(r)
    if a.clip_ratio_c is not None and a.objective is not Objective.clip:
        raise ConfigError(f"algo.clip_ratio_c (the dual clip) is a term of algo.objective=clip; set it to null for "
                          f"algo.objective={a.objective.value}")  # fmt: skip
    if a.objective is Objective.gmpo and a.ratio is not Ratio.token:
        raise ConfigError(f"algo.objective=gmpo takes the token ratios (its own geometric mean of them); set "
                          f"algo.ratio=token, got {a.ratio.value}")  # fmt: skip
    if a.sapo_tau_pos <= 0 or a.sapo_tau_neg <= 0:
        raise ConfigError(f"algo.sapo_tau_pos and algo.sapo_tau_neg must be > 0, got {a.sapo_tau_pos}, {a.sapo_tau_neg}")
    auto_or(r, "rollout", "cuda_graphs", bool)
    auto_or(r, "rollout", "sleep", bool)
    auto_or(r, "rollout", "max_num_seqs", int, 1)
    auto_or(t, "trainer", "tf32", bool)
    if r.kv_cache_gib != AUTO and not (isinstance(r.kv_cache_gib, int | float) and r.kv_cache_gib > 0):
        raise ConfigError(f"rollout.kv_cache_gib must be auto or a size in GiB > 0, got {r.kv_cache_gib!r}")
    auto_or(t, "trainer", "activation_checkpointing", bool)
    auto_or(t, "trainer", "micro_batch_tokens", int, 0, "0 = no token budget")
    auto_or(t, "trainer", "torch_threads", int, 1)
    auto_or(t, "trainer", "logits_chunk_tokens", int, 1)
    if r.dtype not in ENGINE_DTYPES:
        raise ConfigError(f"rollout.dtype must be one of {', '.join(ENGINE_DTYPES)}, got {r.dtype!r}")
    if a.rollout_correction_cap < 1:
        raise ConfigError(
            f"algo.rollout_correction_cap must be >= 1, got {a.rollout_correction_cap}: it caps pi_old / pi_engine, "
            "which is 1 where the engine and the learner agree"
        )
    if a.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef must be >= 0, got {a.kl_coef}")
    if a.overlong_shaping and not 0 < a.overlong_buffer_frac <= 1:
        raise ConfigError(
            f"algo.overlong_buffer_frac must be in (0, 1] (a fraction of rollout.max_new_tokens), got "
            f"{a.overlong_buffer_frac}: a buffer longer than the max response length is an error, not a clamp"
        )
    if min(a.ref_update_every, t.max_steps, t.eval_every, t.warmup_steps, t.save_every, cfg.data.max_prompt_tokens) < 0:
        raise ConfigError(
            "algo.ref_update_every, trainer.max_steps, trainer.eval_every, trainer.warmup_steps, trainer.save_every "
            "and data.max_prompt_tokens must be >= 0"
        )
    if cfg.data.task is Task.file and not cfg.data.path:
        raise ConfigError("data.path must name a dataset file (or a hub dataset id) when data.task=file")
    if cfg.data.task is Task.gym and not cfg.data.name:
        raise ConfigError("data.name must name a reasoning-gym dataset (e.g. chain_sum) when data.task=gym")
    if cfg.data.task is Task.env and r.env is None:
        raise ConfigError("data.task=env gives prompts for an environment: set rollout.env (e.g. "
                          "rollout.env=rlvr.envs.textarena:make data.env_id=GuessTheNumber-v0)")  # fmt: skip
    if cfg.reward.verifier is VerifierName.none and r.env is None:
        raise ConfigError("reward.verifier=none leaves the reward to an environment's returns: set rollout.env")
    if cfg.data.task is Task.code and cfg.data.name not in CODE_TASKS:
        raise ConfigError(f"data.name must be one of {', '.join(CODE_TASKS)} when data.task=code, got {cfg.data.name!r}")
    c = cfg.reward.code
    task_is_code = cfg.data.task is Task.code or cfg.data.tests_key is not None
    code_runs = cfg.reward.verifier is VerifierName.code or (cfg.reward.verifier is VerifierName.task and task_is_code)
    if code_runs and (c.time_limit_s <= 0 or c.memory_mb < 64 or c.time_limit_s >= cfg.reward.timeout_s):
        raise ConfigError(f"reward.code.time_limit_s must be > 0 and below reward.timeout_s (the whole sample's wall-clock "
                          f"limit), and reward.code.memory_mb >= 64; got {c.time_limit_s}, {cfg.reward.timeout_s}, "
                          f"{c.memory_mb}")  # fmt: skip
    if "{prompt}" not in cfg.data.prompt_template:
        raise ConfigError(f"data.prompt_template must contain {{prompt}}, got {cfg.data.prompt_template!r}")
    tags = cfg.reward.think_tags
    if len(tags) != 2 or not all(isinstance(t, str) and t.strip() for t in tags) or tags[0] == tags[1]:
        raise ConfigError(f"reward.think_tags must be two different non-empty tags [open, close], got {list(tags)}")
    if cfg.reward.extract is not None and not cfg.reward.extract:
        raise ConfigError("reward.extract must list at least one answer extractor (or be null: the verifier's own)")
    if cfg.logger.samples_every < 0:
        raise ConfigError(f"logger.samples_every must be >= 0, got {cfg.logger.samples_every}")
    e = cfg.eval
    if e.n < 0 or e.seed < 0 or e.temperature <= 0 or not 0 < e.top_p <= 1:
        raise ConfigError(f"eval.n and eval.seed must be >= 0 (n = 0: greedy only), eval.temperature > 0 and eval.top_p "
                          f"in (0, 1], got {e.n}, {e.seed}, {e.temperature}, {e.top_p}")  # fmt: skip
    if r.temperature <= 0 or not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.temperature must be > 0 and rollout.top_p in (0, 1], got {r.temperature}, {r.top_p}")
    lora = cfg.model.lora
    if lora.rank < 0 or lora.alpha <= 0 or not 0 <= lora.dropout < 1:
        raise ConfigError(f"model.lora.rank must be >= 0 (0 = off), model.lora.alpha > 0 and model.lora.dropout in [0, 1), "
                          f"got {lora.rank}, {lora.alpha}, {lora.dropout}")  # fmt: skip
