"""`ShardedRanks`: the learner's distribution (learner/distribution.py) when this process is one of W FSDP2 ranks.

Each rank joins the learner group (process_group.py) and wraps the policy, the reference and the critic with
`fully_shard`, per decoder layer and then the root, so it holds 1/W of the parameters, gradients and AdamW
state. Only rank 0 reads the weights, into CPU memory; every rank shards a model on the meta device and receives
its shards from rank 0 (sharded_init.py), so no rank's device holds the whole model: its peak at start is its share. On GPU, FSDP2's
mixed-precision policy runs the passes in bf16 over fp32 master shards (sharded_init.mixed_precision).

The update is `PolicyLearner.update` unchanged, run by every rank on its share of the batch (whole groups, the
smaller shares padded with rows that train nothing, so that every rank has as many rows: split_by_groups in
process_group.py). Two things make the step independent of W and of the micro-batch split:
- the loss normaliser (tokens or sequences of the mini-batch) is all-reduced over the ranks before any
  micro-batch's loss is divided by it, so each rank's loss is its part of one global sum; the critic's value
  loss divides by the global token count likewise, and each rank reports the global value loss;
- FSDP's reduce-scatter *sums* the ranks' gradients (divide factor 1) instead of averaging them: averaging
  would divide that global sum by W once more.
The adaptive KL controller sees the token-weighted KL of the whole batch, so its coefficient agrees on every
rank. Each rank trains with its share of `rollout.prompts_per_step` and `train.mini_batch` (process_group.rank_settings),
so the optimizer steps per training step and the schedule are those of W=1; with several mini-batches a rank
shuffles its own rows.

Weights leave through `named_weights`, one full tensor at a time, gathered by every rank in the same order
(the sync from shards is in relayrl/sync/gather.py). With `model.lora` the HF model inside peft is what is
sharded (base and adapter alike; only the adapter trains) and a push sends what `sync.lora` wants
(sharded_lora.py).

A rank is a `LearnerRole(config, distribution=ShardedRanks(RankGroup(...)))`: the same learner class as one
process, with this distribution chosen once. Leaves out: starting the ranks (tests spawn them,
placement/learner_ranks.py makes Ray actors that each hold one) and checkpoint files (dist_checkpoint.py).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from relayrl.learner.process_group import all_reduce_sum, join_learner_group, rank_settings, real_rows
from relayrl.learner.sharded_init import fill_from_rank0, full_state_on_rank0, mixed_precision
from relayrl.learner.sharded_lora import push_view
from relayrl.sync.buckets import make_layout

if TYPE_CHECKING:
    from relayrl.learner.result import UpdateResult
    from relayrl.learner.role import LearnerRole
    from relayrl.learner.settings import LearnerSettings
    from relayrl.sync.buckets import BucketLayout
    from relayrl.sync.gather import SyncPlan
    from relayrl.types import Experience


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Every transformer block of the model, each FSDP2's unit: the layers of each `...layers` ModuleList (an HF
    decoder's `model.layers`; a vision-language model's text decoder and its vision encoder both)."""
    blocks = [
        block
        for name, module in model.named_modules()
        if name.endswith("layers") and isinstance(module, nn.ModuleList)
        for block in module
    ]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no decoder-layer list to shard")
    return blocks


def shard_model(
    model: nn.Module, gradient_divide: float = 1.0, offload: bool = False, precision: MixedPrecisionPolicy | None = None
) -> nn.Module:
    """FSDP2 per decoder layer, then the root. Gradients are summed over the ranks and divided by
    `gradient_divide`: 1 for a loss that already holds the global 1/N. `offload` (learner.offload=params): the
    shards, their gradients and so the optimizer state live in CPU memory (FSDP2's CPUOffloadPolicy).
    `precision`: FSDP2's mixed-precision policy (None: the parameters' own dtype throughout).
    A model built with activation checkpointing (PolicyLearner) keeps it: the wrap goes around its layers."""
    policy: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()} if offload else {}
    if precision is not None:
        policy["mp_policy"] = precision
    for layer in transformer_blocks(model):
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(gradient_divide)
            module.set_force_sum_reduction_for_comms(True)  # SUM, then a division (gloo has no PREMUL_SUM or AVG)
    if hasattr(model, "base_model_prefix"):  # a causal LM: its decoder alone, through the root's FSDP hooks
        model.decoder_forward = types.MethodType(_decoder_forward, model)  # pyright: ignore[reportArgumentType] - an instance method, not a submodule
        register_fsdp_forward_method(model, "decoder_forward")
    return model


def _decoder_forward(root: nn.Module, *args, **kwargs):
    """The decoder's output of a sharded causal LM, run as the root's forward (FSDP2's hooks gather the
    embeddings and final norm, and set up the backward). The learner's layout applies the LM head to hidden
    states itself (train.logits_chunk); calling the decoder directly would meet sharded embeddings."""
    return getattr(root, str(root.base_model_prefix))(*args, **kwargs)


def _rebind_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """Point a fresh optimizer (no state yet) at the sharded parameters, which `fully_shard` created anew; its
    schedule stays attached to it."""
    (group,) = optimizer.param_groups
    group["params"] = [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def _first_pass_with_adapter(network: nn.Module, device: str) -> None:
    """FSDP2 settles each layer's gradient dtypes at its first forward, from the parameters that require grad
    then (with mixed precision: reduce in fp32 into fp32 shards). A LoRA policy's first forward would be the
    reference pass, whose disabled adapter peft marks as not requiring grad: the layers would be left with no
    reduce dtype and the bf16 gradients refused by the fp32 shards. So a one-token forward, adapter on, comes
    first."""
    network(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device))
    cast(FSDPModule, network).reshard()


class _GlobalNormaliser:
    """`Objective.normaliser` summed over the ranks: token and sequence counts add up across row shares."""

    def __init__(self, local):
        self.local = local

    def __call__(self, mask: torch.Tensor) -> float:
        return all_reduce_sum(self.local(mask))


@dataclass(frozen=True)
class RankGroup:
    """Where this rank joins the learner's process group: its rank of `world`, the rendezvous, the deadline."""

    rank: int
    world: int
    address: str
    port: int
    timeout_s: float
    cpu_collectives: bool = False  # learner.offload=params: gloo beside NCCL for the offloaded shards


class ShardedRanks:
    """The learner's models FSDP2-sharded across the ranks of `group` (see the module docstring)."""

    def __init__(self, group: RankGroup):
        join_learner_group(group.rank, group.world, group.address, group.port, group.timeout_s, group.cpu_collectives)
        self.rank, self.world = group.rank, group.world
        self.empty_models = group.rank > 0  # only rank 0 reads the weights,
        self.host_models = group.rank == 0  # into CPU memory: its device gets its shards only
        self.tokens = 0.0  # the rank's trained tokens this update: the KL controller's weight
        self.padding = 0  # the rank's padding rows this update
        self.layout: BucketLayout | None = None
        self.sync_plan: SyncPlan | None = None

    def share(self, settings: LearnerSettings) -> LearnerSettings:
        return rank_settings(settings, self.world)

    def attach(self, learner: LearnerRole) -> None:
        policy, critic = learner.policy, learner.critic
        self._shard(learner, policy.network, policy.optimizer)  # with LoRA the HF model inside peft
        if policy.reference is not None:
            self._shard(learner, policy.reference, None)
        if critic is not None:
            self._shard(learner, critic.model, critic.optimizer)
            critic.normaliser = _GlobalNormaliser(critic.normaliser)
        policy.objective.normaliser = _GlobalNormaliser(policy.objective.normaliser)
        if learner.settings.model.lora is not None:
            _first_pass_with_adapter(policy.network, policy.device)
        policy.objective.kl_controller = _GlobalKL(policy.objective.kl_controller, self)  # pyright: ignore[reportAttributeAccessIssue] - the same two members

    def _shard(self, learner: LearnerRole, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Shard one model (loaded into rank 0's CPU memory, empty elsewhere), fill every rank's shards from rank 0,
        and point its optimizer at them. offload=params on CPU is refused by relayrl/config/learner.py."""
        held = full_state_on_rank0(model, self.rank)  # rank 0's model is on meta now, as the others'
        device, offload = learner.policy.device, learner.settings.learner.offload == "params"
        shard_model(model, offload=offload, precision=mixed_precision(learner.settings.model, device))
        fill_from_rank0(model, held, device, offload)
        del held  # rank 0's host copy goes
        if optimizer is not None:
            _rebind_optimizer(optimizer, learner.policy.model if optimizer is learner.policy.optimizer else model)

    def after_passes(self, learner: LearnerRole) -> None:
        critic = learner.critic
        for model in (learner.policy.network, learner.policy.reference, critic and critic.model):
            if model is not None:
                cast(FSDPModule, model).reshard()  # a no-grad forward leaves the root's parameters gathered

    def update(self, learner: LearnerRole, step: int, exp: Experience, sample_rows: int) -> UpdateResult:
        self.tokens = float(exp.loss_mask.sum())
        self.padding = len(exp) - real_rows(exp)  # split_by_groups' rows, which the KL controller does not count
        result = learner.train_step(step, exp, sample_rows)
        if learner.critic is None:
            return result
        value_loss = all_reduce_sum(result.metrics["critic/value_loss"])  # each rank's part of the global token mean
        return replace(result, metrics={**result.metrics, "critic/value_loss": value_loss})

    # ------------------------------------------------------------------ weights, one full tensor at a time
    def named_weights(self, learner: LearnerRole) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank must iterate this to the end, in step: each tensor is an all-gather of its shards."""
        view = push_view(learner.policy)  # with LoRA: what sync.lora sends
        view.reshard()
        for name, param in view.named_parameters():
            if name not in learner.policy.frozen:  # a frozen vision tower stays as the engine loaded it
                yield name, cast(DTensor, param).full_tensor().detach()

    def weight_layout(self, learner: LearnerRole, bucket_mb: float, wire_dtype: str) -> BucketLayout:
        """From the global shapes alone: nothing is gathered."""
        view = push_view(learner.policy)
        shapes = ((n, tuple(p.shape)) for n, p in view.named_parameters() if n not in learner.policy.frozen)
        return make_layout(shapes, bucket_mb, wire_dtype)

    def open_sender(self, learner: LearnerRole, transport, layout, checksum, timeout_s, directory, owner) -> int:
        """Shards cannot live in the engine's buckets: nothing is adopted. Only rank 0 talks to the engines."""
        from relayrl.sync.gather import SyncPlan, streaming_sender

        self.layout, self.sync_plan = layout, SyncPlan(transport, checksum)
        if self.rank == 0:
            learner.sender = streaming_sender(
                transport, layout, checksum, learner.sync_group, timeout_s, directory, owner
            )
        return 0

    def send_weights(self, learner: LearnerRole, version: int, only: list[int] | None):
        from relayrl.sync.gather import send_from_shards

        assert self.layout is not None and self.sync_plan is not None, "open_sender runs before the first push"
        return send_from_shards(push_view(learner.policy), self.layout, self.sync_plan, learner.sender, version, only)

    def move_states(self, learner: LearnerRole, device: str) -> int:
        """learner.offload=between_phases: this rank's shards (policy, reference, critic) and their AdamW state to
        `device` (relayrl/learner/offload.py); the bytes moved. Every rank moves its own, no collective."""
        from relayrl.learner.offload import move_learner

        return move_learner(learner, device)

    # ------------------------------------------------------------------ state (relayrl/learner/dist_checkpoint.py)
    def state(self, learner: LearnerRole) -> dict:
        from relayrl.learner.dist_checkpoint import shared_state

        return shared_state(learner)

    def checkpoint(self, learner: LearnerRole, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
        from relayrl.learner.dist_checkpoint import save_sharded

        return save_sharded(learner, run_dir, step, loop_state, keep)

    def load_state(self, learner: LearnerRole, checkpoint: str | Path, state: dict) -> None:
        from relayrl.learner.dist_checkpoint import load_any

        load_any(learner, checkpoint, state)

    def save(self, learner: LearnerRole, run_dir: str | Path, tokenizer=None) -> None:
        from relayrl.learner.dist_checkpoint import save_pretrained_from_shards

        save_pretrained_from_shards(learner, Path(run_dir) / "model", tokenizer)


class _GlobalKL:
    """The adaptive KL controller fed the token-weighted KL of the whole batch, so its coefficient agrees on every
    rank; reads and writes of `coef` go to the rank's own controller (checkpoints set it)."""

    def __init__(self, local, ranks: ShardedRanks):
        self.local, self.ranks = local, ranks

    @property
    def coef(self) -> float:
        return self.local.coef

    @coef.setter
    def coef(self, value: float) -> None:
        self.local.coef = value

    def update(self, kl: float, n_steps: int):
        tokens = self.ranks.tokens
        mean = all_reduce_sum(kl * tokens) / max(all_reduce_sum(tokens), 1.0)
        return self.local.update(mean, int(all_reduce_sum(n_steps - self.ranks.padding)))


def sharded_learner(
    settings: LearnerSettings, rank: int, world: int, address: str, port: int, timeout_s: float, threads: int = 0
) -> LearnerRole:
    """One rank's learner: joins the group at `address:port`, then builds and shards its models."""
    from relayrl.learner.role import LearnerRole

    offload = settings.learner.offload == "params"
    return LearnerRole(settings, threads, ShardedRanks(RankGroup(rank, world, address, port, timeout_s, offload)))
