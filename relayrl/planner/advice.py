"""A placement the code can express, and the overrides that give it: `relayrl plan`'s last line.

The memory model (estimate.py) says how many devices each phase needs; this turns that into settings relayrl runs:
- one device, colocated: `placement.mode=local` (generate, then train, in one process);
- colocated on more: W learner ranks and W engines, learner rank i and engine i sharing GPU i
  (`placement.layout=colocated`, placement/cluster.py), the least W that fits;
- otherwise disaggregated: W learner ranks on a GPU each and one engine of T tensor-parallel GPUs.
A teacher in its own actor (teacher.engine=actor or vllm) adds its own GPU(s) to each (relayrl/planner/teacher.py).
W must divide `rollout.prompts_per_step` and the mini-batch (each rank trains whole groups, learner/process_group.py);
colocated time-sharing (`rollout.sleep`, `learner.offload=between_phases`) is billed as the config resolves on the
target hardware; the advice bills an offload at W = 1 only (`auto` offloads one learner; sharded ranks keep their
states unless `learner.offload=between_phases` is set), so a W it advises fits without moving the shards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from relayrl.planner.estimate import Memory, Workload, estimate_memory
from relayrl.planner.hardware import Hardware
from relayrl.planner.placement import place


@dataclass(frozen=True)
class Advice:
    text: str
    overrides: tuple[str, ...]  # what to add to the config (or the command line) to get it

    @property
    def line(self) -> str:
        return f"{self.text}; overrides: {' '.join(self.overrides)}" if self.overrides else self.text


def advise(shape, work: Workload, hardware: Hardware, precision, memory: Memory, sleep: bool, offload: bool) -> Advice:
    """The smallest expressible placement for this workload on `hardware` (see the module docstring)."""
    util = work.gpu_memory_utilization
    one = place(memory, hardware, util, offload, sleep)
    if one.colocated and one.colocated_devices == 1 and work.learner_ranks == 1:
        return Advice("colocated on 1 device: one process generates, then trains", ("placement.mode=local",))
    for ranks in _rank_counts(work, hardware.devices_per_node):
        sharded = replace(work, learner_ranks=ranks)
        per_rank = estimate_memory(shape, sharded, hardware, precision)
        placed = place(per_rank, hardware, util, offload and ranks == 1, sleep)
        teacher = placed.teacher_devices  # a teacher's own actor holds GPU(s) of its own in every layout
        if placed.colocated and placed.colocated_devices <= ranks + teacher and per_rank.engine_devices == 1:
            return Advice(
                f"colocated on {ranks + teacher} devices: learner rank i and engine i share GPU i"
                + (f", the teacher's actor has {teacher} of its own" if teacher else ""),
                ("placement.mode=ray", "placement.layout=colocated", f"placement.learner_ranks={ranks}",
                 f"placement.engines={ranks}"),
            )  # fmt: skip
    return _disaggregated(shape, work, hardware, precision, memory)


def _disaggregated(shape, work: Workload, hardware: Hardware, precision, memory: Memory) -> Advice:
    tp = memory.engine_devices
    for ranks in _rank_counts(work, 1 << 12):
        per_rank = estimate_memory(shape, replace(work, learner_ranks=ranks), hardware, precision)
        if per_rank.rank_trainer <= hardware.memory_gb * 1e9:
            overrides = ["placement.mode=ray", "placement.layout=disaggregated", f"placement.learner_ranks={ranks}"]
            overrides += ["placement.engines=1"] + ([f"rollout.tensor_parallel={tp}"] if tp > 1 else [])
            devices = ranks + tp + memory.teacher_devices
            nodes = -(-devices // hardware.devices_per_node)
            teacher = f" + the teacher's actor's {memory.teacher_devices}" if memory.teacher_devices else ""
            return Advice(
                f"disaggregated: {ranks} learner rank(s) + one engine of {tp} GPU(s){teacher} = {devices} devices "
                f"({nodes} node(s) of {hardware.devices_per_node})",
                tuple(overrides),
            )
    if work.teacher_engine == "local":
        return Advice(
            "no placement fits: one learner rank cannot hold its update phase (a teacher in the learner's process "
            "runs with W=1; teacher.engine=actor gives it an actor of its own beside sharded ranks)",
            (),
        )
    return Advice("no placement fits: even one learner rank per device cannot hold its update phase", ())


def _rank_counts(work: Workload, most: int):
    """W = 1, 2, ... up to `most`, keeping those that divide the step's groups and the mini-batch; W = 1 only with a
    teacher in the learner's process (relayrl/config/teacher.py refuses placement.learner_ranks > 1 beside one)."""
    groups = work.rollout_batch // max(1, work.group_size)
    mini_batch = work.mini_batch or work.rollout_batch
    for ranks in range(1, 1 + (1 if work.teacher_engine == "local" else most)):
        if groups % ranks == 0 and mini_batch % ranks == 0:
            yield ranks
