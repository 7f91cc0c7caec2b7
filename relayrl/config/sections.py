"""The config sections: every key below the root, its type, default, bounds and description.

Each section is a strict pydantic model (unknown keys fail). Their siblings in this package hold the rest:
algorithm.py (`algorithm.*`, `critic`), env.py (`env`), lora.py (`model.lora`), learner.py (`learner`). The root,
loading and the messages are root.py and load.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from relayrl.config.lora import LoraConfig
from relayrl.config.rollout import RolloutConfig  # noqa: F401 - re-exported: the sections of the tree, in one place
from relayrl.config.section import Section
from relayrl.config.warn import warn

INPUT_PATH_RULE = (
    "A relative path is taken against the config file's directory, else the working directory (an "
    "override's: the working directory); the saved config.yaml holds it absolute."
)


class ModelConfig(Section):
    path: str = Field(
        default="", description="HF model directory (config.json + weights + tokenizer). " + INPUT_PATH_RULE
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Learner dtype: auto = float32 on CPU, bf16 autocast with fp32 master weights on GPU.",
    )
    lora: LoraConfig | None = Field(
        default=None, description="Train a LoRA adapter (peft) on a frozen base; absent = full fine-tuning."
    )
    attention: Literal["auto", "sdpa", "eager", "flex_attention"] = Field(
        default="auto",
        description="The learner's attention kernel: auto = the model's own (sdpa for most). flex_attention: "
        "group-packed rows (train.packing) attend through a block-sparse FlexAttention mask, which skips the blocks "
        "where one response would see another, instead of a dense [L, L] mask per row; GPU only (torch has no "
        "FlexAttention backward on CPU). Opt-in until benchmarks/gpu_check.sh has timed it against sdpa on a GPU.",
    )
    freeze_vision: bool = Field(
        default=True,
        description="A vision-language model's vision tower is not trained (the language model and the connector "
        "are), and pushes leave it out. No effect on a text-only model.",
    )


class DataConfig(Section):
    train: str = Field(
        default="",
        description="Training prompts: a .jsonl or .parquet file, or a `datasets` save_to_disk directory, with "
        "`prompt` or `messages`; or `reasoning_gym:TASK?size=N&seed=S&option=value`, or a verifiers taskset's "
        "tasks, `verifiers:TASKSET?option=value` (docs/ecosystem.md). " + INPUT_PATH_RULE,
    )
    eval: str | None = Field(
        default=None,
        description="Held-out prompts, same format; evaluated before and after training. Relative: as data.train.",
    )
    max_prompt_tokens: int = Field(default=256, ge=1, description="Longest prompt, in tokens, after the chat template.")
    on_long_prompt: Literal["error", "drop", "truncate"] = Field(
        default="error",
        description="What to do with a longer prompt: fail naming it, drop it, or keep its last tokens.",
    )
    chat_template: bool = Field(
        default=True,
        description="Render `messages` rows with the tokenizer's chat template (`prompt` rows are used as-is).",
    )
    shuffle: bool = Field(default=True, description="Shuffle the training prompts each epoch (seeded by train.seed).")
    prompt_key: str = Field(
        default="prompt",
        min_length=1,
        description="The column that holds each row's prompt in data.train and data.eval (and train_data): text, "
        "or a chat list (then read as `messages`), e.g. `question` for a dataset that names it so. The column stays "
        "a column too (reward functions get it by name); a row that also has `prompt` or `messages` is refused.",
    )


class RewardComponentConfig(Section):
    """One reward function of a weighted combination (`reward.components`)."""

    fn: str = Field(
        description="Built-in name, `module:function` or `path/file.py:function` (resolved as `reward.fn`)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments bound to the function.")
    weight: float = Field(default=1.0, description="Its weight in the reward: reward = sum of weight * component.")
    name: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="Logged as reward/<name>; empty = the function's name (`math`, `score` of `m:score`).",
    )
    style: Literal["auto", "relayrl", "trl", "verl"] = Field(
        default="auto",
        description="How the function is called: relayrl's fn(prompts, completions, **columns), TRL's (by "
        "keyword), verl's compute_score (per sample); auto = read from its signature.",
    )

    @property
    def label(self) -> str:
        return self.name or self.fn.rpartition(":")[2]


class RewardConfig(Section):
    fn: str = Field(
        default="exact_match",
        description="Built-in name (exact_match, math, regex, code, reward_model, judge, reasoning_gym) or "
        "`module:function` or "
        "`path/file.py:function`. The file, or a module's `module.py`, is looked for as data.train is "
        "(a module beside the config file imports); else the module must be importable.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments bound to the reward function "
        "(reward_model's `path`, judge's `model`: a "
        "relative directory is looked for as data.train).",
    )
    components: list[RewardComponentConfig] = Field(
        default_factory=list,
        description="Several reward functions, each `{fn, kwargs, weight, name}`: reward = sum of weight * component, "
        "each logged as reward/<name>. Set this or `fn`/`kwargs`, not both.",
    )
    style: Literal["auto", "relayrl", "trl", "verl"] = Field(
        default="auto",
        description="How reward.fn is called: relayrl's fn(prompts, completions, **columns), TRL's (by "
        "keyword), verl's compute_score (per sample); auto = read from its signature.",
    )
    on_error: Literal["error", "zero", "skip"] = Field(
        default="error",
        description="A reward that raises, times out or is not a finite number: fail naming the sample, "
        "score it 0, or drop the sample from the batch. Counted as reward/errors, reward/timeouts.",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="Reward worker processes scoring in parallel; 0 = score in the training process "
        "(no timeouts: a hanging reward hangs the run).",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="With workers: seconds one sample may take; a sample over it is killed with its "
        "worker (replaced) and handled per on_error. A batch gets timeout_s per sample.",
    )
    batch_size: int = Field(
        default=8, ge=1, description="With workers: samples per call of a reward function in a worker."
    )
    max_error_frac: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Stop when a reward function fails (raises, times out, not a number) on this "
        "share or more of a scored batch (warned once past half); 1 = when all fail.",
    )

    @model_validator(mode="after")
    def _check_components(self) -> RewardConfig:
        if self.components and self.model_fields_set & {"fn", "kwargs", "style"}:
            raise ValueError(
                "reward.components replaces reward.fn and reward.kwargs: set one or the other "
                "(a single function is `components: [{fn: ..., kwargs: ...}]`)"
            )
        labels = [c.label for c in self.components]
        if duplicated := sorted({label for label in labels if labels.count(label) > 1}):
            raise ValueError(
                f"reward.components: the name {duplicated[0]!r} is used twice; give each component "
                "a distinct `name` (it is logged as reward/<name>)"
            )
        if self.workers == 0 and self.model_fields_set & {"timeout_s", "batch_size"}:
            warn("reward.timeout_s and reward.batch_size have no effect with reward.workers=0")
        return self

    def resolved_components(self) -> list[RewardComponentConfig]:
        """`components`, or the single `fn`/`kwargs` as one component of weight 1."""
        return list(self.components) or [RewardComponentConfig(fn=self.fn, kwargs=self.kwargs, style=self.style)]


class TrainConfig(Section):
    steps: int = Field(default=20, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(default=1e-5, gt=0, description="AdamW peak learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="After warmup: constant or cosine decay."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup, in optimizer steps.")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    grad_clip: float = Field(default=1.0, gt=0, description="Max global gradient norm.")
    mini_batch: int | None = Field(
        default=None, ge=1, description="Responses per optimizer step; default = the whole rollout batch (one step)."
    )
    micro_batch: int = Field(default=16, ge=1, description="Responses per forward/backward (gradient accumulation).")
    micro_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Instead of train.micro_batch: fill each micro-batch up to this many forward positions "
        "(whole groups when packing); one sample over it gets its own (learner/over_budget_units).",
    )
    epochs: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    seed: int = Field(
        default=0,
        ge=0,
        description="Seeds data order, sampling and initialisation: the same config and seed give the same metrics "
        "and samples (sync, one_step_off; async varies with timing: drops, which replica makes which group).",
    )
    threads: int = Field(default=0, ge=0, description="torch intra-op threads for the learner (0 = all cores).")
    packing: Literal["auto", "groups", "none"] = Field(
        default="auto",
        description="Learner forward layout: `groups` packs each group into one row (the prompt once, then "
        "every response, block attention mask), `none` right-pads one row per sample, `auto` "
        "packs when that computes at least 10% fewer positions.",
    )
    logits_chunk: int = Field(
        default=1024,
        ge=0,
        description="Apply the LM head only where a response token is predicted, this many positions at "
        "a time (recomputed in the backward): full-vocabulary logits are never held for more. "
        "0 = take the model's own logits over every position.",
    )
    schedule: Literal["sync", "one_step_off", "async"] = Field(
        default="sync",
        description="sync: generate, then train. one_step_off: generate step k+1 while training on step k. "
        "async: engines generate continuously into a bounded buffer. one_step_off and async "
        "need placement.mode=ray.",
    )
    max_staleness: int = Field(
        default=1, ge=0, description="async: the most policy versions a sample may lag the policy it trains."
    )
    on_stale: Literal["wait", "drop"] = Field(
        default="wait",
        description="async: keep within max_staleness by making producers wait, or by dropping old samples.",
    )
    partial_rollouts: float = Field(
        default=0.0,
        ge=0,
        description="async: over-provision factor for partial rollouts (APRIL): generate this many times "
        "the groups needed, stop when enough finish, continue the rest later (0 = off).",
    )

    @model_validator(mode="after")
    def _one_micro_batch_size(self) -> TrainConfig:
        if self.micro_batch_tokens is not None and "micro_batch" in self.model_fields_set:
            raise ValueError("set train.micro_batch or train.micro_batch_tokens, not both")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        """A dump re-loads: the default micro_batch is left out beside micro_batch_tokens."""
        return {k: v for k, v in handler(self).items() if k != "micro_batch" or self.micro_batch_tokens is None}


class EvalConfig(Section):
    every: int = Field(
        default=0, ge=0, description="Evaluate held-out accuracy every N steps (0 = only before and after)."
    )
    max_prompts: int = Field(default=0, ge=0, description="Evaluate on at most this many held-out prompts (0 = all).")
    temperature: float = Field(
        default=1.0, gt=0, description="Temperature of the sampled evaluation (greedy is also run)."
    )


def logged_step(every: int, step: int, last_step: int) -> bool:
    """Whether `step` writes samples (log.samples.every): a multiple of `every`, or the last step (0: never)."""
    return bool(every) and (step % every == 0 or step == last_step)


class SamplesConfig(Section):
    every: int = Field(
        default=10,
        ge=0,
        description="Write some samples of every N-th step (and of the last) to "
        "<dir>/samples.jsonl: text, reward, advantage, versions, and the turns with each sampled token's "
        "learner-vs-engine log-prob gap (0 = never).",
    )
    max_per_step: int = Field(
        default=16, ge=1, description="Samples written per logged step: the step's first ones, whole groups first."
    )


class LogConfig(Section):
    dir: str = Field(
        default="runs/default",
        description="Run directory: config.yaml (resolved: input paths absolute), "
        "metrics.jsonl, model/. Relative to the working directory (saved absolute; one leading outside it warns).",
    )
    progress: bool = Field(default=True, description="Show a rich progress bar on the console.")
    save_model: bool = Field(default=True, description="Save the final policy with save_pretrained into <dir>/model.")
    samples: SamplesConfig = Field(default_factory=SamplesConfig, description="Per-sample logs (samples.jsonl).")
    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="Extra trackers besides metrics.jsonl and the progress bar: tensorboard (<dir>/tensorboard), "
        "mlflow (sqlite store <dir>/mlflow/mlflow.db), wandb (offline run under <dir>/wandb).",
    )

    @model_validator(mode="after")
    def _check_backends_installed(self) -> LogConfig:
        """A backend's package is an optional extra: a missing one fails here, before any work is done."""
        import importlib.util

        modules = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic"), "wandb": ("wandb",)}
        for backend in self.backends:
            missing = [module for module in modules[backend] if importlib.util.find_spec(module) is None]
            if missing:
                raise ValueError(
                    f"log.backends={backend} needs {', '.join(missing)}, which is not installed: "
                    "pip install 'relayrl[track]' (or pip install --no-deps -r requirements/cpu.lock)"
                )
        return self


class CheckpointConfig(Section):
    every: int = Field(
        default=0, ge=0, description="Write a checkpoint every N steps into <log.dir>/checkpoints (0 = never)."
    )
    keep: int = Field(default=2, ge=1, description="How many of the newest checkpoints to keep.")


class PlacementConfig(Section):
    mode: Literal["local", "ray"] = Field(
        default="local",
        description="local: every role in this process. ray: each role a Ray actor in a placement group.",
    )
    layout: Literal["colocated", "disaggregated"] = Field(
        default="disaggregated",
        description="ray: roles share one bundle and take turns (colocated), or each role has "
        "its own bundle and engines generate while the learner trains (disaggregated).",
    )
    engines: int = Field(
        default=1, ge=1, description="ray: rollout-engine replicas; each step's prompts are split across them."
    )
    learner_cpus: float = Field(
        default=1.0, gt=0, description="ray: CPUs reserved for the learner (and its reference/critic)."
    )
    engine_cpus: float = Field(default=1.0, gt=0, description="ray: CPUs reserved for each rollout engine.")
    learner_threads: int = Field(
        default=0, ge=0, description="ray: torch threads in the learner (0 = its reserved CPUs)."
    )
    engine_threads: int = Field(default=0, ge=0, description="ray: OpenMP threads per engine (0 = its reserved CPUs).")
    num_cpus: int = Field(default=0, ge=0, description="ray: CPUs Ray may use when it starts the cluster (0 = all).")
    address: str = Field(default="", description="ray: address of a running cluster to join ('' = start one here).")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK",
        description="ray: the placement group's strategy across nodes: PACK fills one node first, SPREAD spreads "
        "the bundles (learner, each engine), STRICT_* require it.",
    )
    learner_resources: dict[str, float] = Field(
        default_factory=dict,
        description="ray: extra Ray resources in the learner's bundle, e.g. {learner_node: 1} pins the learner "
        "(all its ranks) to the nodes started with that custom resource (`ray start --resources`).",
    )
    engine_resources: dict[str, float] = Field(
        default_factory=dict,
        description="ray: extra Ray resources in each engine's bundle, e.g. {engine_node: 1} per engine "
        "(see learner_resources).",
    )
    placement_timeout_s: float = Field(
        default=60.0, gt=0, description="ray: deadline for the placement group to be placed."
    )
    call_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="ray: deadline for any one call into a role (a step's "
        "generate, update, ...); a miss names the role.",
    )
    on_engine_failure: Literal["restart", "stop", "fail"] = Field(
        default="restart",
        description="ray: when an engine actor dies, start a new one, re-sync weights and retry, or stop "
        "(`fail`, the old spelling, is read as stop).",
    )
    max_engine_restarts: int = Field(
        default=3, ge=0, description="ray: engine restarts allowed per run before giving up."
    )
    on_learner_failure: Literal["restart", "stop"] = Field(
        default="restart",
        description="ray: when the learner (or one of its ranks) dies or misses placement.call_timeout_s, start "
        "the whole learner group again, restore it from the newest intact checkpoint (model.path at step 0 if "
        "there is none), push that version to the engines and redo the steps after it; or stop. A learner call "
        "that raises is never restarted: a restart would meet the same error.",
    )
    max_learner_restarts: int = Field(
        default=2, ge=0, description="ray: learner restarts allowed per run before giving up."
    )
    learner_ranks: int = Field(
        default=1,
        ge=1,
        description="ray: learner ranks (W): one torch.distributed group whose ranks shard the policy, reference "
        "and critic with FSDP2 and split each step's groups (rollout.prompts_per_step and train.mini_batch "
        "must divide by W). 1 = one learner process.",
    )

    @model_validator(mode="after")
    def _one_spelling_of_stop(self) -> PlacementConfig:
        if self.on_engine_failure == "fail":  # the spelling before on_learner_failure had `stop`
            warn("placement.on_engine_failure=fail is now spelled stop (as placement.on_learner_failure): read as stop")
            self.on_engine_failure = "stop"
        return self

    @model_validator(mode="after")
    def _check_learner_ranks(self) -> PlacementConfig:
        if self.learner_ranks > 1 and self.mode != "ray":
            raise ValueError(
                f"placement.learner_ranks={self.learner_ranks} starts that many learner actors: it needs "
                "placement.mode=ray"
            )
        return self


class SyncConfig(Section):
    transport: Literal["auto", "inprocess", "shm", "broadcast", "disk", "object_store"] = Field(
        default="auto",
        description="How weights reach the engines: auto = inprocess under placement.mode=local; under ray, shm "
        "on one node, broadcast when an engine is on another node than the learner.",
    )
    bucket_mb: float = Field(
        default=64.0, ge=0, description="Pack tensors into buckets of this many MiB (0 = one per tensor)."
    )
    wire_dtype: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Dtype on the wire (bf16 halves the bytes): auto = bf16 where the engine serves bf16 (a GPU "
        "that supports it: fp32 would carry bytes the engine drops), fp32 otherwise.",
    )
    checksum: bool = Field(
        default=True, description="xxh3-64 checksum per bucket, verified by each engine before it loads anything."
    )
    parity_probe: bool = Field(
        default=False,
        description="After each push, compare engine and learner log-probs on a fixed sequence (sync/parity_abs_max).",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="Deadline for one push (every collective and wait within it)."
    )
    lora: Literal["auto", "adapter", "merged"] = Field(
        default="auto",
        description="With model.lora: push only the adapter (the engine loads each version as a new adapter), "
        "or merged full weights; auto = adapter on vLLM with a GPU, merged on CPU (faster there) and on HF.",
    )
    directory: str = Field(
        default="",
        description="disk transport: where the weights file goes ('' = a temporary "
        "directory); relative to the working directory (saved absolute).",
    )
