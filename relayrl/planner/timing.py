"""The predicted time of one synchronous RL step, phase by phase, from FLOPs, bytes and fixed costs.

FLOPs per token of a forward: 2 per matmul weight (`ModelShape.matmul_params`: every linear layer and the LM
head, not the embedding lookup) plus attention, QK^T and AV over `context` positions: 2 x 2 x layers x
q_width x context (causal: half the sequence on average). A backward costs two forwards (dX and dW), so the
update is 3 forwards per epoch; a log-prob pass is 1. Prefill counts the mean prompt (the engine does not pad),
the learner's passes the padded width (the longest prompt and response of a batch) or packed groups. Decode steps are bound by bytes (weights once plus the KV
cache read) or by FLOPs at the concurrent batch, whichever is slower, plus the engine's fixed costs. The
optimizer reads and writes every trainable state once per optimizer step (2 x b_train x P bytes). With W
learner ranks the passes are data-parallel over the W ranks, and a sync first all-gathers every parameter from
its shards: each rank receives the (W - 1)/W it lacks of P x 4 B (fp32 shards, `full_tensor()`) over the link,
once per push (relayrl/sync/gather.py: a broadcast's checksums follow their buckets).
Rates (FLOP/s per device) come from a hardware profile (peak x MFU for passes, peak for decode and prefill:
the seeds' assumptions) or, with plan.measure, from this machine's matmuls at the model's own shapes
(`probe.py`; the learner's passes through the model's own layers, `pass_probe.py`), which also gives the
engine's fixed costs per call, step, token and sequence and its reload's fixed cost and cost per byte. Left
out: with a hardware profile, elementwise ops (norms, activations, the log-softmax over the vocabulary); data
movement between phases; overlap of phases.
A vision-language model: a token's forward multiplies by the language model's weights only, a decode step
streams those, and the vision encoder's FLOPs per image join prefill, the log-prob passes and the update
(relayrl/planner/vision.py); the optimizer and the gathers leave a frozen tower out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from relayrl.models.shape import ModelShape
from relayrl.planner.estimate import Memory, Precision, Workload, sync_params
from relayrl.planner.hardware import Hardware
from relayrl.planner.learner_probe import LearnerOverhead
from relayrl.planner.pass_probe import PassRates
from relayrl.planner.placement import Placement
from relayrl.planner.probe import EngineOverhead, MatmulRates
from relayrl.planner.vision import encoder_time, frozen_tower


@dataclass(frozen=True)
class Rates:
    """FLOP/s per device of each kind of pass, and the engine's fixed costs (None: not measured, taken as 0)."""

    update: float
    forward: float
    decode: float
    prefill: float
    engine: EngineOverhead | None
    source: str
    learner: LearnerOverhead | None = None  # the learner's fixed costs per update and micro-batch (measured)


def profile_rates(hardware: Hardware) -> Rates:
    achieved = hardware.peak_tflops * 1e12 * hardware.mfu
    peak = hardware.peak_tflops * 1e12
    return Rates(
        achieved,
        achieved,
        peak,
        peak,
        None,
        f"{hardware.name}: passes at peak x MFU {hardware.mfu:g}, "
        "decode and prefill at peak, engine fixed costs not counted",
    )


def measured_rates(
    passes: PassRates, matmul: MatmulRates, engine: EngineOverhead | None, learner: LearnerOverhead | None = None
) -> Rates:
    return Rates(
        passes.update,
        passes.forward,
        matmul.decode,
        matmul.prefill,
        engine,
        f"measured here: the model's passes at {passes.rows:,} rows, its matmuls at {matmul.prefill_rows:,} rows "
        f"(prefill) and {matmul.decode_rows:,} rows (decode)"
        + (f", {engine.engine} engine fixed costs" if engine else "")
        + (", learner fixed costs" if learner else ""),
        learner,
    )


def forward_flops_per_token(shape: ModelShape, context: float) -> float:
    return 2 * shape.matmul_params + 4 * shape.layers * shape.q_width * context


def decode_step_time(
    shape: ModelShape,
    infer_bytes: int,
    batch: float,
    context: float,
    kv_bytes_per_token: int,
    mem_bw: float,
    rate: float,
) -> tuple[float, str]:
    """One decode step: the language model's weights streamed once + `batch` sequences' KV caches of `context`
    tokens read, or the step's FLOPs at `rate`, whichever is slower."""
    memory_s = (shape.text_params * infer_bytes + batch * context * kv_bytes_per_token) / mem_bw
    compute_s = batch * forward_flops_per_token(shape, context) / rate
    return (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")


def engine_overhead_time(engine: EngineOverhead | None, steps: float, tokens: float, sequences: int) -> float:
    if engine is None:
        return 0.0
    return engine.per_call + engine.per_step * steps + engine.per_token * tokens + engine.per_sequence * sequences


@dataclass(frozen=True)
class StepTime:
    replicas: int  # engine replicas on the rollout devices
    concurrent: int  # sequences each replica decodes together
    train_devices: int
    prefill: float
    decode_step: float
    decode_bound: str
    decode_waves: int
    decode_steps: float  # waves x the longest response
    decode: float
    engine_overhead: float
    old_logprobs: float
    ref_logprobs: float
    critic: float
    update: float  # the update's FLOPs
    optimizer: float  # the optimizer's bytes
    sync: float
    gather: float = 0.0  # W > 1: the all-gathers of the shards before the sync sends
    update_fixed: float = 0.0  # measured: per update x optimizer steps + per micro-batch x micro-batches
    vision: float = 0.0  # the vision encoder's share of prefill, log-prob passes and update (counted in them)
    teacher_logprobs: float = 0.0  # teacher.path: its forward over the batch (the policy's forward x T / P;
    # several teachers: the largest one's T, a bound, as each row meets one teacher)

    @property
    def generate(self) -> float:
        return self.prefill + self.decode + self.engine_overhead

    @property
    def update_phase(self) -> float:
        return self.update + self.optimizer + self.update_fixed

    @property
    def total(self) -> float:
        return (
            self.generate
            + self.old_logprobs
            + self.ref_logprobs
            + self.teacher_logprobs
            + self.critic
            + self.update_phase
            + self.sync
            + self.gather
        )


def estimate_time(
    shape: ModelShape,
    work: Workload,
    memory: Memory,
    placement: Placement,
    hardware: Hardware,
    precision: Precision,
    rates: Rates,
) -> StepTime:
    """Phases run one after another (a synchronous step) on the recommended placement: the rollout batch is
    split over the engine replicas, and training is data-parallel over the trainer devices at ideal scaling."""
    if placement.colocated:  # it fits one node, so its device count is finite
        rollout_devices = train_devices = int(placement.colocated_devices) - placement.teacher_devices
    else:
        rollout_devices, train_devices = placement.rollout_devices, placement.trainer_devices
    if work.learner_ranks > 1:
        train_devices = work.learner_ranks
    replicas = max(1, rollout_devices // memory.engine_devices)
    per_replica = min(memory.concurrent, math.ceil(work.rollout_batch / replicas))  # sequences decoded together
    P, mem_bw = shape.params - frozen_tower(shape, work), hardware.mem_bw_gbs * 1e9  # trained (P - frozen tower)
    decode_step = functools.partial(  # (batch, context) -> one decode step on one replica
        decode_step_time,
        shape,
        precision.infer_bytes,
        kv_bytes_per_token=memory.kv_bytes_per_token,
        mem_bw=mem_bw * memory.engine_devices,
        rate=rates.decode * memory.engine_devices,
    )
    step, bound = decode_step(per_replica, work.prompt + work.response / 2)
    waves = math.ceil(work.rollout_batch / (replicas * per_replica))  # rounds of sequences the KV caches hold
    steps = waves * work.response
    live = per_replica * work.response_mean / work.response  # the mean batch: ended responses leave it
    mean_step, _ = decode_step(live, work.prompt + work.response_mean / 2)
    pass_flops = forward_flops_per_token(shape, work.width / 2) * work.tokens  # one forward over the batch
    prefill_rate = rates.prefill * replicas * memory.engine_devices
    encoder = encoder_time(shape, work, prefill_rate, rates.forward * train_devices, rates.update * train_devices)
    forward = pass_flops / (rates.forward * train_devices) + encoder.forward
    update = 3 * pass_flops * work.epochs / (rates.update * train_devices) + encoder.update
    prompts = work.rollout_batch * work.prompt_mean  # the engine does not pad prompts
    return StepTime(
        replicas=replicas,
        concurrent=per_replica,
        train_devices=train_devices,
        prefill=forward_flops_per_token(shape, work.prompt_mean / 2) * prompts / prefill_rate + encoder.prefill,
        decode_step=step,
        decode_bound=bound,
        decode_waves=waves,
        decode_steps=steps,
        decode=steps * mean_step,
        engine_overhead=engine_overhead_time(
            rates.engine,
            steps,
            work.rollout_batch / replicas * work.response_mean,
            math.ceil(work.rollout_batch / replicas),
        ),  # one replica's share
        # else the update's own forward gives them; a teacher's signal needs them before the update
        old_logprobs=forward if work.optimizer_steps > 1 or work.teacher_forward_params else 0.0,
        ref_logprobs=forward if work.reference else 0.0,
        critic=forward + update if work.critic else 0.0,
        update=update,
        optimizer=work.optimizer_steps * 2 * precision.train_bytes * P / (mem_bw * train_devices),
        sync=sync_time(sync_params(shape, work) * precision.infer_bytes, hardware, rates.engine),  # LoRA: A, not P
        gather=gather_time(shape, work, hardware),
        update_fixed=learner_fixed_time(rates.learner, work),
        vision=encoder.in_step(work),
        teacher_logprobs=forward * work.teacher_forward_params / shape.params,
    )


def sync_time(nbytes: float, hardware: Hardware, engine: EngineOverhead | None) -> float:
    """The bytes over the link, then (measured engines) the engine's reload: its fixed cost and its cost per byte."""
    reload = engine.reload + engine.reload_per_byte * nbytes if engine else 0.0
    return nbytes / (hardware.link_gbs * 1e9) + reload


def learner_fixed_time(learner: LearnerOverhead | None, work: Workload) -> float:
    if learner is None:
        return 0.0
    return learner.per_update * work.optimizer_steps + learner.per_micro_batch * work.micro_batches * work.epochs


GATHER_BYTES = 4  # the shards are fp32 (FSDP2 keeps fp32 master shards; bf16 is only the compute copy)


def gathered_bytes(shape: ModelShape, work: Workload) -> float:
    """Bytes one rank receives in one gather pass: P x 4 B x (W - 1)/W (a frozen vision tower is not pushed, so
    not gathered)."""
    ranks = work.learner_ranks
    return (shape.params - frozen_tower(shape, work)) * GATHER_BYTES * (ranks - 1) / ranks


def gather_time(shape: ModelShape, work: Workload, hardware: Hardware) -> float:
    """Seconds of the sync's all-gathers: `gathered_bytes` per rank over the link, once per push."""
    return gathered_bytes(shape, work) / (hardware.link_gbs * 1e9)
