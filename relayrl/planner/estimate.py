"""The workload a config implies and the memory per role (colocated vs disaggregated placement: placement.py).

The arithmetic is the seeds' (docs of issue 7): M_role = P * b_role; colocated peak = max over phases,
disaggregated = sum of pools. The step time is `relayrl/planner/timing.py`. With LoRA (`model.lora`) the
policy is a frozen base at its inference bytes plus an adapter of A parameters at the trainable bytes
(16 B/param), the reference costs nothing (the base with the adapter disabled), the critic is its own frozen
base plus its own adapter, and `sync.lora=adapter` pushes A parameters instead of P. With W learner ranks
(`placement.learner_ranks`, FSDP2) each rank holds 1/W of the trainable states and of the reference, and the
activations of its own micro-batches (unchanged by W); `smallest_ranks` finds the least W whose rank fits.
A vision-language model's tower and connector are in P; a frozen tower (`model.freeze_vision`) costs the policy
its weights only and is not pushed (relayrl/planner/vision.py).
The bf16 copies of the weights a pass holds (autocast's at W = 1, FSDP2's gathered root and layer at W > 1) are
`Memory.copies` (learner_memory.weight_copies); relayrl/planner/simulate.py measures all of this on fake tensors.
Deliberately left out: FSDP2's communication buffers, fragmentation, prefix caching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relayrl.config import Config
from relayrl.config.model import LoraConfig
from relayrl.config.train import TrainConfig
from relayrl.errors import ConfigError
from relayrl.models.shape import ModelShape
from relayrl.planner.hardware import Hardware
from relayrl.planner.learner_memory import LearnerPeak, intermediate_size, learner_peak, weight_copies
from relayrl.planner.teacher import apart_memory, teacher_workload
from relayrl.planner.vision import frozen_bytes, frozen_tower
from relayrl.rollout.memory import engine_share

GIB = 2**30
TEACHER = "teacher.engine"  # an auto key, chosen again for the planned hardware (relayrl/planner/teacher.py)
INFER_BYTES = {"bf16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class Precision:
    train_terms: tuple[tuple[str, int], ...]  # (what, bytes/param) for one trainable copy
    infer_bytes: int  # bytes/param of an inference-only copy
    activation_bytes: int  # bytes of one activation value (relayrl/planner/learner_memory.py counts the values)

    @property
    def train_bytes(self) -> int:
        return sum(b for _, b in self.train_terms)


def precision_for(hardware: Hardware, fp32_master: bool = True, infer_dtype: str | None = None) -> Precision:
    """What relayrl's learner holds per trained parameter: fp32 weights (the masters; on GPU the passes run in bf16
    under autocast or FSDP2's mixed precision, the copies transient), fp32 gradients (the weights' dtype), AdamW's
    m and v: 4 + 4 + 4 + 4 = 16 on CPU and GPU alike (measured on GPU by relayrl/planner/simulate.py).
    `fp32_master=False` (plan.fp32_master=false): a bf16 learner's 2 + 2 + 4 + 4 = 12, which relayrl does not run."""
    terms = (("fp32 weight", 4), ("fp32 grad", 4), ("Adam m", 4), ("Adam v", 4))
    if hardware.kind == "cpu":
        return Precision(terms, INFER_BYTES[infer_dtype or "fp32"], 4)
    if not fp32_master:
        terms = (("bf16 weight", 2), ("bf16 grad", 2), ("Adam m", 4), ("Adam v", 4))
    return Precision(terms, INFER_BYTES[infer_dtype or "bf16"], 2)  # bf16 under autocast


@dataclass(frozen=True)
class Workload:
    """The per-step sizes the config implies."""

    rollout_batch: int  # prompts_per_step * n
    prompt_tokens: int  # data.max_prompt_tokens (an upper bound per prompt)
    response_tokens: int  # rollout.max_tokens
    micro_batch: int
    optimizer_steps: int  # rollout_batch / mini_batch * epochs
    epochs: int
    reference: bool  # algorithm.kl.coef > 0
    critic: bool  # algorithm.advantage == "gae"
    kv_cache_gib: float
    gpu_memory_utilization: float
    # The longest prompt and response expected in a batch (None: the limits above). The engine decodes until
    # the longest response ends; the learner pads every row to the batch's longest sequence.
    longest_prompt_tokens: float | None = None
    longest_response_tokens: float | None = None
    mean_response_tokens: float | None = None  # a response's expected length (e.g. a run's response/length_mean)
    prompt_mean_tokens: float | None = None  # the mean prompt, read from data.train (relayrl/planner/prompts.py)
    group_size: int = 1  # rollout.n
    engine: str = "vllm"  # rollout.engine
    packing: str = "none"  # train.packing
    lora_rank: int = 0  # model.lora.rank; 0 = full fine-tuning
    lora_targets: str | tuple[str, ...] = "all-linear"  # model.lora.target_modules
    lora_sync: str | None = None  # "adapter" or "merged" (relayrl/sync/lora.py); None = full fine-tuning
    learner_ranks: int = 1  # placement.learner_ranks (W) or plan.learner_ranks
    mini_batch: int = 0  # train.mini_batch (W must divide it and the groups of a step); 0 = not checked
    micro_batch_tokens: int | None = None  # train.micro_batch_tokens: micro-batches filled up to this many positions
    checkpointing: bool = False  # learner.activation_checkpointing
    logits_chunk: int = 0  # train.logits_chunk (0: the model's own logits over every position)
    freeze_vision: bool = True  # model.freeze_vision: the policy's vision tower has no grads, no optimizer, no push
    images_per_prompt: float = 0.0  # a vision-language model's images per prompt (relayrl/planner/vision.py)
    image_tokens_per_image: float = 0.0  # the tokens one image becomes in the prompt (counted in its length)
    teacher_params: int = 0  # T: teacher.path's parameters in the learner (relayrl/planner/teacher.py); 0 = none
    teacher_apart_params: int = 0  # teacher.engine=actor: the teachers' parameters on the actor's own GPU
    teacher_forward_params: int = 0  # the largest teacher's (the step's forward, rows split among teachers)
    teacher_engine: str = ""  # teacher.engine as the run chooses it (local, actor, vllm); "" = no teacher

    @property
    def packed(self) -> bool:
        """Whether the learner packs whole groups (relayrl/learner/layout.py; `auto` when that saves >= 10%).
        Estimated only when micro-batches hold whole groups: a token budget fills them with groups, a count
        holds them when one micro-batch is the rollout batch (shuffled mini-batches split groups). Image batches
        are never packed (relayrl/learner/layout.py)."""
        if self.packing == "none" or self.group_size < 2 or self.images_per_prompt:
            return False
        if self.micro_batch_tokens is None and self.micro_batch < self.rollout_batch:
            return False
        if self.packing == "groups":
            return True
        from relayrl.learner.packing import packing_pays  # the learner's own rule (imports torch)

        return packing_pays(self.groups * self.packed_width, self.rollout_batch * self.width)

    @property
    def groups(self) -> int:
        return max(1, self.rollout_batch // self.group_size)

    @property
    def packed_width(self) -> float:
        """A packed row: the prompt once, then every response of the group (at their longest)."""
        return self.prompt + self.group_size * self.response

    def micro_positions(self) -> tuple[int, int]:
        """(forward positions, response positions) of the largest micro-batch, at the limits (memory is sized
        for the longest sequences the config allows). A token budget takes units (whole groups when the learner
        packs, relayrl/learner/batching.py) while they fit, at least one; a count takes micro_batch rows (one
        packed row per group when the learner packs the whole batch)."""
        prompt, response, n = self.prompt_tokens, self.response_tokens, self.group_size
        mini = self.mini_batch or self.rollout_batch
        if self.micro_batch_tokens is not None:
            groups = self.packing != "none" and n > 1
            unit, answer = (prompt + n * response, n * response) if groups else (prompt + response, response)
            units = max(1, mini // n) if groups else mini
            count = max(1, min(units, self.micro_batch_tokens // unit))
            return count * unit, count * answer
        if self.packed:
            groups = max(1, self.micro_batch // n)
            return groups * (prompt + n * response), groups * n * response
        return self.micro_batch * (prompt + response), self.micro_batch * response

    @property
    def micro_batches(self) -> int:
        """Micro-batches in one pass over the rollout batch: mini-batches of micro_batch rows, or with a token
        budget as many units (packed groups, else padded rows) per micro-batch as fit, at least one."""
        mini = self.mini_batch or self.rollout_batch
        minis = max(1, self.rollout_batch // mini)
        if self.micro_batch_tokens is None:
            return minis * math.ceil(mini / self.micro_batch)
        unit, units = (self.packed_width, max(1, mini // self.group_size)) if self.packed else (self.width, mini)
        return minis * math.ceil(units / max(1, int(self.micro_batch_tokens // unit)))

    @property
    def seq_len(self) -> int:
        """The longest sequence the limits allow: memory is sized for it."""
        return self.prompt_tokens + self.response_tokens

    @property
    def prompt(self) -> float:
        return self.prompt_tokens if self.longest_prompt_tokens is None else self.longest_prompt_tokens

    @property
    def prompt_mean(self) -> float:
        """The mean prompt (what the engine prefills); the longest when the data was not read."""
        return self.prompt if self.prompt_mean_tokens is None else self.prompt_mean_tokens

    @property
    def response(self) -> float:
        return self.response_tokens if self.longest_response_tokens is None else self.longest_response_tokens

    @property
    def response_mean(self) -> float:
        """The mean response: what compute-bound decode and the engine's per-token costs scale with (the batch
        thins as responses end); the longest when not given."""
        return min(self.response, self.mean_response_tokens or self.response)

    @property
    def width(self) -> float:
        """Expected padded width of the learner's batch: longest prompt + longest response."""
        return self.prompt + self.response

    @property
    def tokens(self) -> int:
        """Tokens forwarded per pass over the rollout batch, padding included (the learner computes on it)."""
        if self.packed:
            return int(self.groups * self.packed_width)
        return int(self.rollout_batch * self.width)


def workload_from_config(
    config: Config,
    longest_prompt_tokens: float | None = None,
    longest_response_tokens: float | None = None,
    learner_ranks: int | None = None,
    prompt_mean_tokens: float | None = None,
    mean_response_tokens: float | None = None,
    checkpointing: bool | None = None,
    gpu: bool | None = None,
) -> Workload:
    """`learner_ranks`: W in place of placement.learner_ranks (a plan needs no placement.mode=ray);
    `prompt_mean_tokens`: the mean prompt read from data.train; `mean_response_tokens`: a response's expected
    length; `checkpointing`: in place of learner.activation_checkpointing. What `auto` chooses depends on the
    hardware (relayrl/planner/checkpointing.py): an unresolved auto counts as off here, and `make_plan` replaces
    it with its hardware's choice. `gpu`: whether the run's hardware has GPUs, for `teacher.engine: auto` (None:
    this machine's, as the run chooses it)."""
    if checkpointing is None:
        checkpointing = config.learner.activation_checkpointing is True
    return Workload(
        learner_ranks=learner_ranks or config.placement.learner_ranks,
        mini_batch=config.train.mini_batch or 0,  # unset (None: the rollout batch) is 0 here
        longest_prompt_tokens=longest_prompt_tokens,
        longest_response_tokens=longest_response_tokens,
        mean_response_tokens=mean_response_tokens,
        prompt_mean_tokens=prompt_mean_tokens,
        rollout_batch=config.rollout_batch,
        prompt_tokens=config.data.max_prompt_tokens,
        response_tokens=config.rollout.max_tokens,
        micro_batch=micro_batch_rows(
            config.train, config.mini_batch, config.data.max_prompt_tokens + config.rollout.max_tokens
        ),  # from train.micro_batch_tokens when set
        micro_batch_tokens=config.train.micro_batch_tokens,
        checkpointing=bool(checkpointing),
        logits_chunk=config.train.logits_chunk,
        freeze_vision=config.model.freeze_vision,
        optimizer_steps=config.updates_per_step,
        epochs=config.train.epochs,
        reference=config.algorithm.kl.coef > 0,
        critic=config.algorithm.advantage == "gae",
        kv_cache_gib=config.rollout.kv_cache_gib,
        gpu_memory_utilization=engine_share(config.rollout, config.placement, config.reward),
        group_size=config.rollout.n,
        packing=config.train.packing,
        engine=config.rollout.engine,
        **teacher_workload(
            config.teacher,
            config.model,
            config.placement.mode,
            gpu,
            TEACHER in config._auto,
            config.placement.learner_ranks,
        ),
        **lora_workload(config.model.lora, config.sync.lora, config.rollout.engine),
    )


def lora_workload(settings: LoraConfig | None, sync_lora: str, engine: str) -> dict:
    """The adapter's rank, targets and how its weights reach the engine (`model.lora`, `sync.lora`)."""
    from relayrl.models.adapter_sync import lora_sync_mode

    if settings is None:
        return {}
    targets = settings.target_modules
    return {
        "lora_rank": settings.rank,
        "lora_targets": targets if isinstance(targets, str) else tuple(targets),
        "lora_sync": lora_sync_mode(settings, sync_lora, engine),
    }


LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_params(shape: ModelShape, rank: int, targets: str | tuple[str, ...] = "all-linear") -> int:
    """A: LoRA parameters, r * (d_in + d_out) per adapted linear layer of a Llama-family model (`all-linear`:
    every projection of attention and MLP, not the LM head). The MLP width, when config.json is not at hand, is
    what the parameter count leaves after the embeddings and attention (gate, up and down: 3 x hidden x I)."""
    h, q, kv = shape.hidden, shape.q_width, shape.kv_heads * shape.head_dim
    width = intermediate_size(shape)
    dims = {
        "q_proj": h + q,
        "k_proj": h + kv,
        "v_proj": h + kv,
        "o_proj": q + h,
        "gate_proj": h + width,
        "up_proj": h + width,
        "down_proj": width + h,
    }
    chosen = LLAMA_LINEARS if targets == "all-linear" else [t.rsplit(".", 1)[-1] for t in targets]
    return shape.layers * rank * sum(dims[name] for name in chosen if name in dims)


def sync_params(shape: ModelShape, work: Workload) -> int:
    """Parameters one push moves: the adapter alone (sync.lora=adapter), else every weight but a frozen vision
    tower's (the engine keeps the one it loaded)."""
    if work.lora_sync == "adapter":
        return adapter_params(shape, work.lora_rank, work.lora_targets)
    return shape.params - frozen_tower(shape, work)


@dataclass(frozen=True)
class Memory:
    """Bytes per role (whole model, before sharding)."""

    actor: float
    critic: float
    reference: float
    engine_weights: float
    kv_bytes_per_token: int
    engine_devices: int  # devices the engine needs for its weights within its memory fraction
    kv_capacity: float
    kv_tokens: int  # tokens that fit in the KV cache
    concurrent: int  # sequences in flight: min(rollout batch, kv_tokens // seq_len)
    activations: float
    logits: float
    ranks: int = 1  # learner ranks W: the states below are split W ways, activations and logits are per rank
    learner: LearnerPeak | None = None  # the parts of activations and logits (relayrl/planner/learner_memory.py)
    teacher: float = 0.0  # teacher.path's weights, resident in the learner like the reference (never sharded: W=1)
    teacher_apart: float = 0.0  # teacher.engine=actor or vllm: its weights in its own actor, apart from the learner's
    teacher_kv: float = 0.0  # teacher.engine=vllm: its engine's KV cache (relayrl/planner/teacher.py apart_memory)
    teacher_devices: int = 0  # the GPU(s) of the teacher's own actor, added to every layout's count; 0 on a CPU
    gradients: float = 0.0  # of actor and critic: alive from the first backward to the optimizer step only
    copies: float = 0.0  # bf16 copies of the weights an update holds (learner_memory.weight_copies)

    @property
    def states(self) -> float:
        """What FSDP2 shards: the trainable states and the reference (and a teacher, run with W=1 only)."""
        return self.actor + self.critic + self.reference + self.teacher

    @property
    def resident(self) -> float:
        """The states between updates: the learner zeroes its gradients with set_to_none after each optimizer step
        (relayrl/learner/policy.py), so what the engine finds beside it while generating holds none (measured by
        relayrl/planner/simulate.py)."""
        return self.states - self.gradients

    @property
    def rank_trainer(self) -> float:
        """One rank's update phase: 1/W of the states + its own micro-batch's activations and logits + the bf16
        copies of the weights its passes hold (autocast's, or FSDP2's gathered units)."""
        return self.states / self.ranks + self.activations + self.logits + self.copies

    @property
    def engine(self) -> float:
        return self.engine_weights + self.kv_capacity

    @property
    def trainer(self) -> float:
        """The update phase: trainable states + reference + teacher + activations of one micro-batch + the weight
        copies."""
        return self.states + self.activations + self.logits + self.copies


def kv_bytes_per_token(shape: ModelShape, kv_bytes: int) -> int:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_bytes  # 2: K and V


def estimate_memory(shape: ModelShape, work: Workload, hardware: Hardware, precision: Precision) -> Memory:
    P, b = shape.params, precision.infer_bytes
    per_token = kv_bytes_per_token(shape, b)
    weights = P * b
    if hardware.kind == "cpu":  # vLLM CPU: the KV cache is a fixed size (VLLM_CPU_KVCACHE_SPACE), weights apart
        devices, kv_capacity = 1, work.kv_cache_gib * GIB
    else:  # vLLM GPU: weights + KV share utilisation * memory on each of the engine's devices
        budget = work.gpu_memory_utilization * hardware.memory_gb * 1e9
        devices = math.ceil((weights + work.seq_len * per_token) / budget)
        kv_capacity = devices * budget - weights
    kv_tokens = int(kv_capacity // per_token)
    concurrent = min(work.rollout_batch, kv_tokens // work.seq_len)
    if concurrent == 0:
        raise ConfigError(
            f"the KV cache ({kv_capacity / GIB:.2f} GiB, {kv_tokens} tokens) cannot hold one sequence of "
            f"{work.seq_len} tokens; raise rollout.kv_cache_gib"
        )
    peak = learner_peak(
        shape, *work.micro_positions(), precision.activation_bytes, work.checkpointing, work.logits_chunk
    )
    trainable = P * precision.train_bytes  # full fine-tuning; with LoRA: a frozen base and a trained adapter
    if work.lora_rank:
        trainable = P * b + adapter_params(shape, work.lora_rank, work.lora_targets) * precision.train_bytes
    untrained = frozen_tower(shape, work) * (precision.train_bytes - frozen_bytes(precision))  # no grads, no Adam
    trained = (
        adapter_params(shape, work.lora_rank, work.lora_targets) if work.lora_rank else P - frozen_tower(shape, work)
    )
    gradients = trained * sum(b for name, b in precision.train_terms if "grad" in name) * (2 if work.critic else 1)
    teacher_kv, teacher_devices = apart_memory(work, hardware, work.teacher_apart_params * b)
    return Memory(
        actor=trainable - untrained,
        critic=trainable if work.critic else 0.0,
        reference=P * reference_bytes(work, precision) if work.reference and not work.lora_rank else 0.0,
        engine_weights=weights,
        kv_bytes_per_token=per_token,
        engine_devices=devices,
        kv_capacity=kv_capacity,
        kv_tokens=kv_tokens,
        concurrent=concurrent,
        activations=peak.activations,
        logits=peak.logits,
        ranks=work.learner_ranks,
        learner=peak,
        teacher=work.teacher_params * b,  # at the inference bytes, as the reference (teacher.dtype auto)
        teacher_apart=work.teacher_apart_params * b,
        teacher_kv=teacher_kv,
        teacher_devices=teacher_devices,
        gradients=gradients,
        copies=weight_copies(shape, work.learner_ranks, precision.activation_bytes, backward=True),
    )


def reference_bytes(work: Workload, precision: Precision) -> int:
    """Bytes per parameter of the frozen reference: the learner casts it to its inference dtype (bf16 on GPU,
    relayrl/learner/policy.py) before sharded ranks shard it, as relayrl/planner/simulate.py measures."""
    return precision.infer_bytes


def smallest_ranks(memory: Memory, work: Workload, hardware: Hardware, most: int = 1024) -> int | None:
    """The least W whose rank's update phase fits one device, among the W that divide the step's groups and
    the mini-batch (relayrl/learner/process_group.py splits by whole groups); None if none does (the activations and
    logits of one micro-batch, which W does not divide, are too large alone)."""
    per_device = hardware.memory_gb * 1e9
    for ranks in range(1, most + 1):
        if work.groups % ranks or (work.mini_batch and work.mini_batch % ranks):
            continue
        if memory.states / ranks + memory.activations + memory.logits <= per_device:
            return ranks
    return None


def micro_batch_rows(train: TrainConfig, mini_batch: int, longest: int) -> int:
    """Rows of one micro-batch as the planner sizes activations: `train.micro_batch`, or with
    `train.micro_batch_tokens` the `longest` sequences the limits allow (prompt and response) that fit in the
    budget (at least one: a sequence over the budget gets a micro-batch of its own)."""
    budget = train.micro_batch_tokens
    if budget is None:
        return min(train.micro_batch, mini_batch)
    return max(1, min(mini_batch, budget // longest))
