"""The `learner` config section: the learner's memory options.

The section is pure pydantic. Whether an offload can take effect on this machine (a CUDA device, sharded ranks) is
checked when the config is resolved (`check_offload`, relayrl/rollout/sleep.py, beside `learner.offload: auto`). The
switch that turns activation checkpointing on is relayrl/learner/activation_checkpointing.py.

- `learner.activation_checkpointing`: every decoder layer's activations are recomputed in the backward
  instead of kept (HF's `gradient_checkpointing_enable`, non-reentrant `torch.utils.checkpoint`), for the
  policy and the critic. It changes neither the loss nor the gradients. `auto` is chosen when the config is
  resolved (relayrl/planner/checkpointing.py): on for a colocated GPU run whose update would not fit beside the
  engine's share without it, off otherwise (always off on CPU).
- `learner.return_freed_memory`: a CPU learner's process returns freed blocks to the system at once
  (relayrl/learner/malloc.py), so its peak RSS is its live tensors, at a time cost measured there.
- `learner.offload=params`: FSDP2's `CPUOffloadPolicy` on every `fully_shard` of the learner ranks:
  parameters, gradients and the AdamW state live in CPU memory, shards are copied to the GPU for each
  layer's forward and backward, and the optimizer step runs on the CPU. FSDP2 has no optimizer-only
  offload, so `optimizer` is refused with that explanation rather than silently meaning `params`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.section import Section


class LearnerConfig(Section):
    """`learner`: memory and speed options of the policy and critic learners."""

    activation_checkpointing: bool | Literal["auto"] = Field(
        default="auto",
        description="Recompute each decoder layer's activations in the backward instead of keeping them "
        "(policy and critic): activation memory of one layer instead of all, for about one more forward. auto = on "
        "for a colocated GPU run whose planned update (checkpointing off) exceeds what the engine's "
        "rollout.gpu_memory_utilization leaves the learner of its GPU; off otherwise, and always off on CPU.",
    )
    return_freed_memory: bool = Field(
        default=False,
        description="CPU learners: fix glibc's mmap threshold at 64 KiB so freed activation blocks go back to the "
        "system: peak RSS follows the live tensors (checkpointed, 8k response tokens: 406 vs 900 MB) at a time cost "
        "that shrinks with length (1.8x at 1k tokens, 1.2x at 8k, 1.02x at 16k). relayrl/learner/malloc.py.",
    )
    compile: bool = Field(
        default=False,
        description="torch.compile each decoder layer of the policy (dynamic shapes: one compile for every "
        "sequence length), before FSDP2 wraps it, as torchtitan does. Opt-in: the first update pays the compile "
        "(~95 s for a 2-layer toy on 2 CPU cores; on a GPU, benchmarks/gpu_check.sh times it); the loss and "
        "gradients are the eager ones (relayrl/learner/compile.py).",
    )
    offload: Literal["auto", "none", "optimizer", "params", "between_phases"] = Field(
        default="auto",
        description="GPU learners: `between_phases` = the learner's parameters, gradients and AdamW state leave the "
        "device while the engine generates (colocated time-sharing, with rollout.sleep; on learner ranks each moves "
        "its shards); `params` = FSDP2's CPUOffloadPolicy on learner ranks (placement.learner_ranks >= 2: everything "
        "in CPU memory, the optimizer step on the CPU); auto = between_phases when rollout.sleep is on and the learner "
        "is one process, else none. `optimizer` alone is not an FSDP2 policy and is refused.",
    )
