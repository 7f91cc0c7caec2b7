"""`relayrl plan plan.simulate=true`: a learner rank's device memory over one step, measured by running relayrl's
own learner (relayrl/learner/: `LearnerRole`, its policy, reference and critic, LoRA, activation checkpointing,
FSDP2 through `ShardedRanks`) on tensors that have shapes and bytes but no storage.

How (the recipe of torchtitan's scripts/estimate/estimation.py, adapted to run the learner unchanged):
- the models are built on the meta device from model.path's config.json (no weights read) and given fake storage
  with `to_empty` inside a `FakeTensorMode`, on the CPU device (a CPU build of torch cannot make fake `cuda`
  tensors; the bytes are the same);
- W > 1: the process joins torch's `fake` process group as rank 0 of W (collectives return at once), so
  `fully_shard` splits every model as on W GPUs; rank 0 is simulated because it alone reads the models (into host
  memory: fake tensors on the meta device, not counted) and copies each full tensor to its device to broadcast it;
- the GPU's numerics are set where the learner reads them from the device: bf16 autocast for the passes, the
  reference cast to bf16 (before it is sharded at W > 1), FSDP2's bf16 mixed-precision policy at W > 1
  (sharded_init.mixed_precision);
- the step's batch is real (small integer tensors): the learner's data-dependent reads (lengths, masks) run as they
  do; scalars read from the fake outputs (metrics, the gradient norm) read 0 (`ScalarsReadZero`);
- `torch.distributed._tools.MemTracker` counts every storage the step creates or frees, per device.
  Its per-module hooks are left off (`DeviceTracker`): they refuse a frozen model (the reference's parameters take
  no gradient hook) and a root module run twice in one phase (a pass over several micro-batches), and the device
  totals, which are what a GPU must hold, do not need them. FSDPMemTracker's categories need those hooks too.

Phases, in bytes on one GPU (rank 0): `load` (the peak while the learner is built and sharded), `after_load` (live
bytes once it is: a colocated learner returns its cached blocks then, relayrl/learner/role.py), `first_pass` (the
run's first pre-update passes, with the forward layout's one-time check against the model's own logits,
relayrl/learner/layout.py), `passes` (the pre-update passes of one micro-batch: old log-probs when needed, the
reference, the critic's values), `update` (the
optimizer step of one micro-batch, the second one, so AdamW's state exists as in every later step), `after_update`
(live bytes after it: what a colocated learner keeps reserved once it returns its cached blocks,
relayrl/learner/offload.py `return_cached_blocks`), `after_offload` (learner.offload=between_phases moves the states out, a sharded rank its shards; without it
`after_update` stays).
Leaves out what only a GPU has: the caching allocator's rounding and fragmentation, NCCL's and cuBLAS's workspaces,
the CUDA context (~0.5 GB), kernels' own scratch (attention, fused log-softmax).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

from relayrl.learner.distribution import OneProcess
from relayrl.learner.sharded import RankGroup, ShardedRanks, _rebind_optimizer, shard_model
from relayrl.learner.sharded_init import fill_from_rank0, full_state_on_rank0, mixed_precision

if TYPE_CHECKING:
    from relayrl.learner.role import LearnerRole
    from relayrl.learner.settings import LearnerSettings
    from relayrl.planner.estimate import Workload
    from relayrl.types import Experience

PHASES = ("load", "after_load", "first_pass", "passes", "update", "after_update", "after_offload")


@dataclass(frozen=True)
class SimulatedMemory:
    """Peak bytes on one GPU (learner rank 0 of `ranks`) per phase (PHASES), and the batch that set them."""

    ranks: int
    rows: int  # rows of the simulated micro-batch
    positions: int  # its forward positions (rows x (longest prompt + longest response))
    phases: dict[str, float]
    seconds: float  # wall time of the simulation here


class DeviceTracker(MemTracker):
    """MemTracker's per-device accounting without its per-module hooks (see the module docstring); `mark()` starts
    a new phase: the peak restarts from what is live now."""

    def _pre_fw_hook(self, *args) -> None:
        pass

    def _post_fw_hook(self, *args) -> None:
        pass

    def _pre_bw_hook(self, *args) -> None:
        pass

    def _post_bw_hook(self, *args) -> None:
        pass

    def mark(self) -> None:
        self._peak_mem_snap = self.get_tracker_snapshot()
        self._peak_mem = {device: snap["Total"] for device, snap in self._peak_mem_snap.items()}

    def _bytes(self, kind: str) -> float:
        """Bytes on the CPU device, where the fake storage lives (the meta-built models hold none)."""
        return float(self.get_tracker_snapshot(kind).get(torch.device("cpu"), {}).get("Total", 0))

    @property
    def peak(self) -> float:
        return self._bytes("peak")

    @property
    def live(self) -> float:
        return self._bytes("current")


class ScalarsReadZero(TorchDispatchMode):
    """A Python number read from a fake tensor (a metric, the gradient norm) is 0: it has no value to read."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            return 0.0 if args[0].is_floating_point() else 0
        return func(*args, **(kwargs or {}))


def materialize(model: torch.nn.Module, fake: FakeTensorMode, tracker: DeviceTracker) -> None:
    """Fake storage for a meta-built model (what reading its fp32 weights onto the GPU allocates), counted."""
    with fake:
        model.to_empty(device="cpu")
    tie = getattr(model, "tie_weights", None)  # to_empty gives a tied head its own tensor; a loaded model shares one
    if callable(tie):
        tie()
    tracker.track_external(model)


def cast_frozen(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """`model.to(dtype)` for a frozen model: fake parameters cannot be swapped in place, so each is replaced (a
    parameter two modules share, a tied head, stays shared)."""
    cast: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in cast:
                    cast[id(param)] = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
                module._parameters[name] = cast[id(param)]


def gpu_numerics(learner: LearnerRole) -> None:
    """What PolicyLearner sets from a CUDA device with model.dtype auto/bfloat16: bf16 autocast for the passes."""
    if learner.settings.model.dtype in ("auto", "bfloat16"):
        learner.policy.autocast = torch.autocast("cpu", dtype=torch.bfloat16)


class SimulatedProcess(OneProcess):
    """One learner process (W = 1) on one GPU: the models as `load_causal_lm` would put them there."""

    empty_models = True

    def __init__(self, fake: FakeTensorMode, tracker: DeviceTracker):
        super().__init__()
        self.fake, self.tracker = fake, tracker

    def attach(self, learner: LearnerRole) -> None:
        policy, critic = learner.policy, learner.critic
        materialize(policy.model, self.fake, self.tracker)
        if policy.reference is not None:
            materialize(policy.reference, self.fake, self.tracker)
            if learner.settings.model.dtype in ("auto", "bfloat16"):
                cast_frozen(policy.reference, torch.bfloat16)  # PolicyLearner's cast of one process on GPU
        if critic is not None:
            materialize(critic.model, self.fake, self.tracker)
            _rebind_optimizer(critic.optimizer, critic.model)
        _rebind_optimizer(policy.optimizer, policy.model)  # to_empty made new parameters of the meta-built ones
        gpu_numerics(learner)
        super().attach(learner)


class SimulatedRanks(ShardedRanks):
    """Rank 0 of W FSDP2 ranks in torch's fake process group: it loads each model whole into host memory (fake
    tensors on the meta device, which the tracker does not count), then `ShardedRanks` shards it and fills the
    shards on the device from that host copy, one full tensor in flight at a time, as on GPU (bf16 mixed
    precision)."""

    def __init__(self, world: int, fake: FakeTensorMode, tracker: DeviceTracker):
        super().__init__(RankGroup(0, world, "fake", 0, 0.0))
        self.empty_models = True  # built on meta; `attach` gives rank 0 its whole host copy first, as loading does
        self.fake, self.tracker = fake, tracker

    def attach(self, learner: LearnerRole) -> None:
        policy, critic = learner.policy, learner.critic
        on_host(policy.model, self.fake)  # rank 0 loads every model whole, in CPU memory, before any is sharded
        if policy.reference is not None:
            on_host(policy.reference, self.fake)
            if learner.settings.model.dtype in ("auto", "bfloat16"):
                cast_frozen(policy.reference, torch.bfloat16)  # PolicyLearner's cast on GPU, before sharding
        if critic is not None:
            on_host(critic.model, self.fake)
        super().attach(learner)
        gpu_numerics(learner)

    def _shard(self, learner: LearnerRole, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        held = full_state_on_rank0(model, self.rank)
        offload = learner.settings.learner.offload == "params"
        shard_model(model, offload=offload, precision=mixed_precision(learner.settings.model, "cuda"))
        materialize(model, self.fake, self.tracker)  # the shards' storage on the device (fill_from_rank0's to_empty)
        fill_from_rank0(model, held, "cpu", offload)  # each full tensor copied to the device, sliced, freed
        del held
        if optimizer is not None:
            _rebind_optimizer(optimizer, learner.policy.model if optimizer is learner.policy.optimizer else model)


def on_host(model: torch.nn.Module, fake: FakeTensorMode) -> None:
    """Fake storage on the meta device for a meta-built model: rank 0's host copy (sharded_init.load_on_host), not
    counted on the device; copying one of its tensors to the device (`.to("cpu")` here) makes a counted one."""
    with fake:
        model.to_empty(device="meta")
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()


@contextmanager
def fake_ranks(world: int):
    """Torch's `fake` process group as rank 0 of `world` (none for one process), torn down after."""
    if world == 1:
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def step_batch(rows: int, prompt: int, response: int, group_size: int) -> Experience:
    """One micro-batch at the limits: `rows` samples of the longest prompt and response, in groups of `group_size`
    (real tensors: the learner reads their lengths and masks)."""
    from relayrl.types import Experience

    width = prompt + response
    loss_mask = torch.zeros(rows, width - 1)
    loss_mask[:, prompt - 1 :] = 1.0
    return Experience(
        input_ids=torch.ones(rows, width, dtype=torch.long),
        attention_mask=torch.ones(rows, width, dtype=torch.long),
        loss_mask=loss_mask,
        behaviour_logprobs=torch.zeros(rows, width - 1),
        rewards=torch.zeros(rows),
        group_ids=torch.arange(rows) // group_size,
        versions=torch.zeros(rows, width - 1, dtype=torch.long),
        prompt_lengths=torch.full((rows,), prompt),
        forks=torch.zeros(rows, dtype=torch.bool),
    )


def simulate(settings: LearnerSettings, work: Workload, offload: bool, rows: int | None = None) -> SimulatedMemory:
    """A learner rank's bytes per phase on GPU at W = `work.learner_ranks` for the learner `settings`
    (placement/sections.learner_settings; model.path holding a config.json) and the step's sizes `work`
    (planner/estimate.workload_from_config); `offload`: the states leave the GPU between phases, as the run chooses
    there (`Plan.offload`); `rows`: the micro-batch's samples (default the planner's)."""
    from relayrl.learner.role import LearnerRole

    start = time.perf_counter()
    settings = with_checkpointing(settings, work.checkpointing)  # the plan's choice for its GPU (auto resolved there)
    world, rows = work.learner_ranks, rows or work.micro_batch
    fake, tracker, phases = FakeTensorMode(allow_non_fake_inputs=True), DeviceTracker(), {}
    # whole groups where the planner expects the learner to pack them, else rows of distinct groups (shuffled
    # mini-batches rarely put two samples of a group in one micro-batch)
    exp = step_batch(rows, work.prompt_tokens, work.response_tokens, work.group_size if work.packed else 1)
    with fake_ranks(world), tracker, ScalarsReadZero():
        distribution = SimulatedProcess(fake, tracker) if world == 1 else SimulatedRanks(world, fake, tracker)
        role = LearnerRole(settings, 0, distribution)
        # a build that runs no op (no cast, one process) leaves MemTracker's peak unset: the live bytes are the peak
        phases["load"], phases["after_load"] = max(tracker.peak, tracker.live), tracker.live
        exp = measured(tracker, phases, "first_pass", role.prepare, exp)  # with the layout's one-time check
        exp.advantages, exp.returns = torch.ones_like(exp.loss_mask), torch.zeros_like(exp.loss_mask)
        role.update(0, exp)  # the first update creates AdamW's state, which every later step holds
        exp = measured(tracker, phases, "passes", role.prepare, exp)
        measured(tracker, phases, "update", lambda batch: role.update(1, batch), exp)
        phases["after_update"] = tracker.live
        phases["after_offload"] = phases["after_update"] - (offloaded_bytes(role) if offload else 0.0)
    return SimulatedMemory(world, rows, rows * (work.prompt_tokens + work.response_tokens), phases,
                           time.perf_counter() - start)  # fmt: skip


def with_checkpointing(settings: LearnerSettings, on: bool) -> LearnerSettings:
    """`settings` with learner.activation_checkpointing as the plan has it (this CPU machine resolved auto to off)."""
    from dataclasses import replace

    return replace(settings, learner=settings.learner.model_copy(update={"activation_checkpointing": on}))


def measured(tracker: DeviceTracker, phases: dict[str, float], phase: str, run, exp: Experience):
    """`run(exp)` with its peak recorded as `phase`."""
    tracker.mark()
    out = run(exp)
    phases[phase] = tracker.peak
    return out


def offloaded_bytes(role: LearnerRole) -> float:
    """What learner.offload=between_phases moves off the GPU (relayrl/learner/offload.py): the models and the
    optimizers' tensor state, this rank's shards."""
    from relayrl.learner.offload import held_bytes, learner_states

    return float(held_bytes(*learner_states(role)))
