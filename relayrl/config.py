"""The typed config tree: YAML file + dotted `key=value` overrides, strict keys, a resolved dump.

Every section forbids unknown keys. A misspelt key fails with its full path and the nearest real key
(also when the key exists in another section); a wrong type fails naming the key. What cannot be
derived has a default here, documented by its field description; nothing downstream calls `.get()`.
"""

from __future__ import annotations

import copy
import difflib
import re
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relayrl.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float (YAML 1.1 insists on a dot: `1.0e-5`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("", description="HF model directory (config.json + weights + tokenizer).")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Learner dtype: auto = float32 on CPU, bf16 autocast with fp32 master weights on GPU."
    )


class DataConfig(Section):
    train: str = Field("", description="Training prompts: a .jsonl or .parquet file with `prompt` or `messages`.")
    eval: str | None = Field(None, description="Held-out prompts, same format; evaluated before and after training.")
    max_prompt_tokens: int = Field(256, ge=1, description="Longest prompt, in tokens, after the chat template.")
    on_long_prompt: Literal["error", "drop", "truncate"] = Field(
        "error", description="What to do with a longer prompt: fail naming it, drop it, or keep its last tokens."
    )
    chat_template: bool = Field(
        True, description="Render `messages` rows with the tokenizer's chat template (`prompt` rows are used as-is)."
    )
    shuffle: bool = Field(True, description="Shuffle the training prompts each epoch (seeded by train.seed).")


class RewardComponentConfig(Section):
    """One reward function of a weighted combination (`reward.components`)."""

    fn: str = Field(description="Built-in name, `module:function` or `path/file.py:function` (as `reward.fn`).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments bound to the function.")
    weight: float = Field(1.0, description="Its weight in the reward: reward = sum of weight * component.")
    name: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$",
                      description="Logged as reward/<name>; empty = the function's name (`math`, `score` of `m:score`).")

    @property
    def label(self) -> str:
        return self.name or self.fn.rpartition(":")[2]


class RewardConfig(Section):
    fn: str = Field(
        "exact_match",
        description="Built-in name (exact_match, math, regex, code, reward_model, judge) or `module:function` or "
                    "`path/file.py:function`.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments bound to the reward function.")
    components: list[RewardComponentConfig] = Field(
        default_factory=list,
        description="Several reward functions, each `{fn, kwargs, weight, name}`: reward = sum of weight * component, "
                    "each logged as reward/<name>. Set this or `fn`/`kwargs`, not both.",
    )
    on_error: Literal["error", "zero", "skip"] = Field(
        "error", description="A reward that raises, times out or is not a finite number: fail naming the sample, "
                             "score it 0, or drop the sample from the batch. Counted as reward/errors, reward/timeouts.",
    )
    workers: int = Field(
        0, ge=0, description="Reward worker processes scoring in parallel; 0 = score in the training process "
                             "(no timeouts: a hanging reward hangs the run).",
    )
    timeout_s: float = Field(
        60.0, gt=0, description="With workers: seconds one sample may take; a sample over it is killed with its "
                                "worker (replaced) and handled per on_error. A batch gets timeout_s per sample.",
    )
    batch_size: int = Field(8, ge=1, description="With workers: samples per call of a reward function in a worker.")

    @model_validator(mode="after")
    def _check_components(self) -> "RewardConfig":
        if self.components and self.model_fields_set & {"fn", "kwargs"}:
            raise ValueError("reward.components replaces reward.fn and reward.kwargs: set one or the other "
                             "(a single function is `components: [{fn: ..., kwargs: ...}]`)")
        labels = [c.label for c in self.components]
        if duplicated := sorted({label for label in labels if labels.count(label) > 1}):
            raise ValueError(f"reward.components: the name {duplicated[0]!r} is used twice; give each component "
                             "a distinct `name` (it is logged as reward/<name>)")
        if self.workers == 0 and self.model_fields_set & {"timeout_s", "batch_size"}:
            warnings.warn("reward.timeout_s and reward.batch_size have no effect with reward.workers=0", stacklevel=2)
        return self

    def resolved_components(self) -> list[RewardComponentConfig]:
        """`components`, or the single `fn`/`kwargs` as one component of weight 1."""
        return list(self.components) or [RewardComponentConfig(fn=self.fn, kwargs=self.kwargs)]


class RolloutConfig(Section):
    engine: Literal["vllm", "hf"] = Field("vllm", description="Inference engine: vLLM, or HF generate as a fallback.")
    n: int = Field(8, ge=1, description="Responses sampled per prompt (the GRPO group size).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts per training step; rollout batch = prompts_per_step * n.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for training rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1 = off).")
    top_k: int = Field(-1, ge=-1, description="Sample among the k most likely tokens (-1 = off).")
    max_tokens: int = Field(64, ge=1, description="Longest response, in tokens.")
    min_tokens: int = Field(0, ge=0, description="Shortest response, in tokens: end-of-sequence and stop strings are "
                                                "ignored before it (decode-heavy benchmarks, length floors).")
    stop: list[str] = Field(default_factory=list, description="Strings that end a response.")
    kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV-cache size (VLLM_CPU_KVCACHE_SPACE), GiB.")
    prefix_caching: Literal["auto", "on", "off"] = Field(
        "auto", description="vLLM prefix caching. `auto`: on unless no sequence can fill one KV block (then it only "
                            "costs hashing: ~15% of a short rollout on CPU, where blocks are 128 tokens)."
    )
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="vLLM GPU memory fraction (GPU only).")


class KLConfig(Section):
    coef: float = Field(0.0, ge=0, description="Weight of the KL penalty to the reference; 0 = no reference loaded.")
    estimator: Literal["k1", "k2", "k3", "abs"] = Field(
        "k3", description="Per-token KL estimator: k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(r) - r - 1 "
                          "with r = ref - logp, abs = |logp - ref|."
    )
    placement: Literal["loss", "reward"] = Field(
        "loss", description="Add the KL penalty to the loss (GRPO style) or subtract it from per-token rewards (PPO style)."
    )
    controller: Literal["fixed", "adaptive"] = Field(
        "fixed", description="Fixed coefficient, or adapted towards kl.target (Ziegler et al. 2019)."
    )
    target: float = Field(0.1, gt=0, description="Adaptive controller: the KL per token it steers towards.")
    horizon: int = Field(10_000, ge=1, description="Adaptive controller: samples over which the error is corrected.")


class CorrectionConfig(Section):
    mode: Literal["none", "tis_token", "tis_seq", "mask_token", "mask_seq"] = Field(
        "none", description="Rollout correction with the engine's behaviour log-probs: truncated importance "
                            "sampling per token or sequence, or masking tokens/sequences whose ratio is off."
    )
    threshold: float = Field(2.0, gt=0, description="TIS: cap on the importance weight old/behaviour.")
    lower: float = Field(0.5, gt=0, description="Masking: smallest ratio kept.")
    upper: float = Field(2.0, gt=0, description="Masking: largest ratio kept.")


class CriticConfig(Section):
    path: str = Field("", description="Value-model initialisation (an HF causal-LM directory); default model.path.")
    lr: float = Field(1e-5, gt=0, description="Critic AdamW learning rate.")
    value_clip: float = Field(0.2, gt=0, description="Clip range of the new values around the old (PPO value loss).")
    warmup_steps: int = Field(0, ge=0, description="Steps that train only the critic before the actor moves.")


class DAPOConfig(Section):
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and generate more until the batch is full."
    )
    max_rounds: int = Field(4, ge=1, description="Dynamic sampling: most generation rounds per step (the cap).")
    overlong_filter: bool = Field(False, description="Give truncated responses (finish=length) no gradient.")
    overlong_buffer: int = Field(
        0, ge=0, description="Soft overlong punishment over the last N tokens before rollout.max_tokens (0 = off)."
    )


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"] = Field(
        "grpo", description="Advantage estimator (docs/algorithms.md gives each formula)."
    )
    std_normalize: bool = Field(True, description="grpo: divide group-centred rewards by the group std.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of per-token returns (reinforce_pp and gae).")
    lam: float = Field(0.95, ge=0, le=1, description="gae: the GAE lambda (bias/variance trade-off).")
    policy_loss: Literal["ppo_clip", "gspo"] = Field(
        "ppo_clip", description="ppo_clip: token-level clipped surrogate; gspo: sequence-level ratio (use a small clip_eps)."
    )
    clip_eps: float = Field(0.2, gt=0, description="Clip range of the importance ratio (both sides unless set below).")
    clip_eps_low: float | None = Field(None, gt=0, description="Lower clip range (1 - eps_low); default clip_eps.")
    clip_eps_high: float | None = Field(
        None, gt=0, description="Upper clip range (1 + eps_high); DAPO's clip-higher uses 0.28. Default clip_eps."
    )
    dual_clip_c: float | None = Field(None, gt=1, description="Dual-clip bound c for negative advantages (None = off).")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean", description="How per-token losses become one number (seq_mean_token_sum_norm divides by "
                                  "rollout.max_tokens, as Dr. GRPO)."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    kl: KLConfig = Field(default_factory=KLConfig)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    dapo: DAPOConfig = Field(default_factory=DAPOConfig)


class TrainConfig(Section):
    steps: int = Field(20, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(1e-5, gt=0, description="AdamW peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="After warmup: constant or cosine decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup, in optimizer steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    mini_batch: int | None = Field(
        None, ge=1, description="Responses per optimizer step; default = the whole rollout batch (one step)."
    )
    micro_batch: int = Field(16, ge=1, description="Responses per forward/backward (gradient accumulation).")
    epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    seed: int = Field(0, ge=0, description="Seeds data order, sampling and initialisation.")
    threads: int = Field(0, ge=0, description="torch intra-op threads for the learner (0 = all cores).")
    packing: Literal["auto", "groups", "none"] = Field(
        "auto", description="Learner forward layout: `groups` packs each group into one row (the prompt once, then "
                            "every response, block attention mask), `none` right-pads one row per sample, `auto` "
                            "packs when that computes at least 10% fewer positions."
    )
    logits_chunk: int = Field(
        1024, ge=0, description="Apply the LM head only where a response token is predicted, this many positions at "
                                "a time (recomputed in the backward): full-vocabulary logits are never held for more. "
                                "0 = take the model's own logits over every position."
    )
    schedule: Literal["sync", "one_step_off", "async"] = Field(
        "sync", description="sync: generate, then train. one_step_off: generate step k+1 while training on step k. "
                            "async: engines generate continuously into a bounded buffer (needs placement.mode=ray)."
    )
    max_staleness: int = Field(
        1, ge=0, description="async: the most policy versions a sample may lag the policy it trains."
    )
    on_stale: Literal["wait", "drop"] = Field(
        "wait", description="async: keep within max_staleness by making producers wait, or by dropping old samples."
    )
    partial_rollouts: float = Field(
        0.0, ge=0, description="async: over-provision factor for partial rollouts (APRIL): generate this many times "
                               "the groups needed, stop when enough finish, continue the rest later (0 = off)."
    )


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate held-out accuracy every N steps (0 = only before and after).")
    max_prompts: int = Field(0, ge=0, description="Evaluate on at most this many held-out prompts (0 = all).")
    temperature: float = Field(1.0, gt=0, description="Temperature of the sampled evaluation (greedy is also run).")


class LogConfig(Section):
    dir: str = Field("runs/default", description="Run directory: config.yaml, metrics.jsonl, model/.")
    progress: bool = Field(True, description="Show a rich progress bar on the console.")
    save_model: bool = Field(True, description="Save the final policy with save_pretrained into <dir>/model.")
    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="Extra trackers besides metrics.jsonl and the progress bar: tensorboard (<dir>/tensorboard), "
        "mlflow (sqlite store <dir>/mlflow/mlflow.db), wandb (offline run under <dir>/wandb).",
    )

    @model_validator(mode="after")
    def _check_backends_installed(self) -> "LogConfig":
        """A backend's package is an optional extra: a missing one fails here, before any work is done."""
        import importlib.util

        modules = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic"), "wandb": ("wandb",)}
        for backend in self.backends:
            missing = [module for module in modules[backend] if importlib.util.find_spec(module) is None]
            if missing:
                raise ValueError(f"log.backends={backend} needs {', '.join(missing)}, which is not installed: "
                                 "pip install 'relayrl[track]' (or pip install --no-deps -r requirements/cpu.lock)")
        return self


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Write a checkpoint every N steps into <log.dir>/checkpoints (0 = never).")
    keep: int = Field(2, ge=1, description="How many of the newest checkpoints to keep.")


class PlacementConfig(Section):
    mode: Literal["local", "ray"] = Field(
        "local", description="local: every role in this process. ray: each role a Ray actor in a placement group."
    )
    layout: Literal["colocated", "disaggregated"] = Field(
        "disaggregated", description="ray: roles share one bundle and take turns (colocated), or each role has "
                                     "its own bundle and engines generate while the learner trains (disaggregated)."
    )
    engines: int = Field(1, ge=1, description="ray: rollout-engine replicas; each step's prompts are split across them.")
    learner_cpus: float = Field(1.0, gt=0, description="ray: CPUs reserved for the learner (and its reference/critic).")
    engine_cpus: float = Field(1.0, gt=0, description="ray: CPUs reserved for each rollout engine.")
    learner_threads: int = Field(0, ge=0, description="ray: torch threads in the learner (0 = its reserved CPUs).")
    engine_threads: int = Field(0, ge=0, description="ray: OpenMP threads per engine (0 = its reserved CPUs).")
    num_cpus: int = Field(0, ge=0, description="ray: CPUs Ray may use when it starts the cluster (0 = all).")
    address: str = Field("", description="ray: address of a running cluster to join ('' = start one here).")
    placement_timeout_s: float = Field(60.0, gt=0, description="ray: deadline for the placement group to be placed.")
    call_timeout_s: float = Field(600.0, gt=0, description="ray: deadline for any one call into a role (a step's "
                                                           "generate, update, ...); a miss names the role.")
    on_engine_failure: Literal["restart", "fail"] = Field(
        "restart", description="ray: when an engine actor dies, start a new one, re-sync weights and retry, or stop."
    )
    max_engine_restarts: int = Field(3, ge=0, description="ray: engine restarts allowed per run before giving up.")


class SyncConfig(Section):
    transport: Literal["auto", "inprocess", "shm", "broadcast", "disk", "object_store"] = Field(
        "auto", description="How weights reach the engines: auto = inprocess under placement.mode=local, shm under ray."
    )
    bucket_mb: float = Field(64.0, ge=0, description="Pack tensors into buckets of this many MiB (0 = one per tensor).")
    wire_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Dtype on the wire (bf16 halves the bytes).")
    checksum: bool = Field(True, description="xxh3-64 checksum per bucket, verified by each engine before it loads anything.")
    parity_probe: bool = Field(False, description="After each push, compare engine and learner log-probs on a fixed "
                                                  "sequence (sync/parity_abs_max).")
    timeout_s: float = Field(120.0, gt=0, description="Deadline for one push (every collective and wait within it).")
    directory: str = Field("", description="disk transport: where the weights file goes ('' = a temporary directory).")


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)

    @property
    def rollout_batch(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n

    @property
    def mini_batch(self) -> int:
        return self.train.mini_batch or self.rollout_batch

    @model_validator(mode="after")
    def _check_batches(self) -> "Config":
        if self.rollout_batch % self.mini_batch:
            raise ValueError(
                f"train.mini_batch={self.mini_batch} must divide the rollout batch "
                f"(rollout.prompts_per_step * rollout.n = {self.rollout_batch})"
            )
        group_relative = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
        if self.rollout.min_tokens > self.rollout.max_tokens:
            raise ValueError(f"rollout.min_tokens={self.rollout.min_tokens} exceeds rollout.max_tokens="
                             f"{self.rollout.max_tokens}")
        if self.algorithm.dapo.overlong_buffer > self.rollout.max_tokens:
            raise ValueError(f"algorithm.dapo.overlong_buffer={self.algorithm.dapo.overlong_buffer} must not exceed "
                             f"rollout.max_tokens={self.rollout.max_tokens}")
        transport = self.sync.transport
        if self.placement.mode == "local" and transport not in ("auto", "inprocess"):
            raise ValueError(f"sync.transport={transport} needs placement.mode=ray (under local, every role shares "
                             "one process and weights move in-process)")
        if self.placement.mode == "ray" and transport == "inprocess":
            raise ValueError("sync.transport=inprocess needs placement.mode=local; under ray use shm, broadcast, "
                             "disk or object_store")
        if self.train.schedule != "sync" and self.placement.mode != "ray":
            raise ValueError(f"train.schedule={self.train.schedule} overlaps generation with training, which needs "
                             "separate processes: set placement.mode=ray")
        if self.train.partial_rollouts and (self.train.schedule != "async" or self.train.on_stale != "drop"
                                            or self.train.partial_rollouts < 1):
            raise ValueError("train.partial_rollouts needs train.schedule=async with train.on_stale=drop and a factor "
                             ">= 1 (a carried response holds tokens of older versions, which wait's admission "
                             "control cannot account for)")
        if self.train.schedule != "sync" and self.algorithm.dapo.dynamic_sampling:
            raise ValueError(f"algorithm.dapo.dynamic_sampling works with train.schedule=sync only, "
                             f"not {self.train.schedule}")
        if self.placement.mode == "ray" and self.rollout.engine != "vllm":
            raise ValueError("placement.mode=ray runs vLLM engines; set rollout.engine=vllm")
        if self.algorithm.kl.controller == "adaptive" and self.algorithm.kl.coef == 0:
            raise ValueError("algorithm.kl.controller=adaptive needs an initial algorithm.kl.coef > 0")
        if self.algorithm.advantage in group_relative and self.rollout.n < 2:
            raise ValueError(f"rollout.n must be at least 2 for {self.algorithm.advantage} "
                             "(advantages are relative within a group)")
        return self


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """Read YAML (or start from `base`), apply `key=value` overrides, validate strictly."""
    tree: dict[str, Any] = copy.deepcopy(base or {})  # overrides must not write into the caller's dict
    source = "defaults"
    if path is not None:
        source = str(path)
        tree = _deep_merge(tree, read_yaml(path))
    if overrides:
        source += " + overrides"
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(tree, key, value)
    _check_keys(tree, Config, prefix="")
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None
    warn_ineffective(config)
    return config


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(tree).__name__}")
    return tree


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-5` -> ("train.lr", 1e-05); the value is parsed as YAML (so lists and nulls work)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def warn_ineffective(config: Config) -> None:
    """Name settings that cannot take effect in the chosen mode."""
    if config.algorithm.kl.coef == 0 and "estimator" in config.algorithm.kl.model_fields_set:
        warnings.warn("algorithm.kl.estimator has no effect while algorithm.kl.coef is 0", stacklevel=3)
    if config.rollout.engine == "hf" and "kv_cache_gib" in config.rollout.model_fields_set:
        warnings.warn("rollout.kv_cache_gib has no effect with rollout.engine=hf", stacklevel=3)
    algo = config.algorithm
    if algo.kl.coef == 0 and algo.kl.model_fields_set - {"coef", "estimator"}:
        names = ", ".join(f"algorithm.kl.{k}" for k in sorted(algo.kl.model_fields_set - {"coef", "estimator"}))
        warnings.warn(f"{names} has no effect while algorithm.kl.coef is 0", stacklevel=3)
    if algo.correction.mode == "none" and algo.correction.model_fields_set - {"mode"}:
        warnings.warn("algorithm.correction settings have no effect while algorithm.correction.mode is none",
                      stacklevel=3)
    if not algo.dapo.dynamic_sampling and "max_rounds" in algo.dapo.model_fields_set:
        warnings.warn("algorithm.dapo.max_rounds has no effect without algorithm.dapo.dynamic_sampling",
                      stacklevel=3)
    if algo.advantage != "gae" and config.critic.model_fields_set:
        warnings.warn(f"critic.{', critic.'.join(sorted(config.critic.model_fields_set))} has no effect: a critic "
                      "is built only for algorithm.advantage=gae", stacklevel=3)
    if algo.policy_loss == "ppo_clip" and algo.clip_eps < 0.01:
        warnings.warn(f"algorithm.clip_eps={algo.clip_eps} is a GSPO-sized range; ppo_clip usually uses ~0.2",
                      stacklevel=3)
    if config.data.eval is None and config.eval.model_fields_set:
        warnings.warn(f"eval.{', eval.'.join(sorted(config.eval.model_fields_set))} has no effect without data.eval",
                      stacklevel=3)
    train = config.train
    if train.schedule != "async" and train.model_fields_set & {"max_staleness", "on_stale"}:
        names = ", ".join(f"train.{k}" for k in sorted(train.model_fields_set & {"max_staleness", "on_stale"}))
        warnings.warn(f"{names} has no effect under train.schedule={train.schedule}", stacklevel=3)
    if train.schedule != "sync" and config.checkpoint.every:
        warnings.warn(f"checkpoints under train.schedule={train.schedule} resume the learner exactly but not the "
                      "rollouts in flight: a resumed run is not a replay of an uninterrupted one", stacklevel=3)
    if train.schedule != "sync" and algo.correction.mode == "none":
        warnings.warn(f"train.schedule={train.schedule} trains on samples from older policies without correction; "
                      "consider algorithm.correction.mode=tis_token", stacklevel=3)
    placement = config.placement
    if placement.mode == "local" and placement.model_fields_set - {"mode"}:
        names = ", ".join(f"placement.{k}" for k in sorted(placement.model_fields_set - {"mode"}))
        warnings.warn(f"{names} has no effect under placement.mode=local", stacklevel=3)
    if effective_transport(config) == "inprocess" and config.sync.model_fields_set - {"transport"}:
        names = ", ".join(f"sync.{k}" for k in sorted(config.sync.model_fields_set - {"transport"}))
        warnings.warn(f"{names} has no effect with the inprocess transport", stacklevel=3)


def effective_transport(config: Config) -> str:
    """`sync.transport`, with `auto` resolved for the placement."""
    if config.sync.transport != "auto":
        return config.sync.transport
    return "inprocess" if config.placement.mode == "local" else "shm"


def _deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _all_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            paths.extend(_all_paths(sub, path + "."))
    return paths


def _check_keys(tree: dict, model: type[BaseModel], prefix: str) -> None:
    """Unknown keys fail with their full path and the closest known key."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            raise ConfigError(f"unknown config key '{path}'{_suggest(path, key, model)}")
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            if not isinstance(value, dict):
                raise ConfigError(f"'{path}' is a section; give it keys, e.g. {path}.{next(iter(sub.model_fields))}=...")
            _check_keys(value, sub, path + ".")


def _suggest(path: str, key: str, model: type[BaseModel]) -> str:
    local = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    prefix = path[: -len(key)]
    if local:
        return f"; did you mean '{prefix}{local[0]}'?"
    everywhere = _all_paths(Config)
    leaf_matches = [p for p in everywhere if p.rsplit(".", 1)[-1] == key]
    if leaf_matches:
        return f"; did you mean '{leaf_matches[0]}'?"
    close = difflib.get_close_matches(path, everywhere, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f"; known keys here: {', '.join(model.model_fields)}"


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for item in err.errors():
        if not item["loc"]:  # a cross-section check (model validator): its message names the keys
            lines.append(item["msg"].removeprefix("Value error, "))
            continue
        key = ".".join(str(part) for part in item["loc"])
        got = "" if item["type"] == "missing" or "input" not in item else f" (got {item['input']!r})"
        lines.append(f"{key}: {item['msg']}{got}")
    return f"invalid config ({source}):\n  " + "\n  ".join(lines)
