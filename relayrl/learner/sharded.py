"""One rank of a sharded learner: today's `LearnerRole`, with its models wrapped by FSDP2 across W ranks.

Each rank joins the learner group (ranks.py) and wraps the policy, the reference and the critic with
`fully_shard`, per decoder layer and then the root, so it holds 1/W of the parameters, gradients and AdamW
state. Only rank 0 reads the weights; the other ranks build the models on the meta device and receive their
shards from rank 0 (sharded_init.py), so their peak at start is their share, not the model. On GPU, FSDP2's
mixed-precision policy runs the passes in bf16 over fp32 master shards (sharded_init.mixed_precision).

The update is `PolicyLearner.update` unchanged, run by every rank on its share of the batch (whole groups, as
many rows on each rank). Two things make the step independent of W and of the micro-batch split:
- the loss normaliser (tokens or sequences of the mini-batch) is all-reduced over the ranks before any
  micro-batch's loss is divided by it, so each rank's loss is its part of one global sum; the critic's value
  loss divides by the global token count likewise, and each rank reports the global value loss;
- FSDP's reduce-scatter *sums* the ranks' gradients (divide factor 1) instead of averaging them: averaging
  would divide that global sum by W once more.
The adaptive KL controller sees the token-weighted KL of the whole batch, so its coefficient agrees on every
rank. Each rank trains with its share of `rollout.prompts_per_step` and `train.mini_batch` (ranks.rank_config),
so the optimizer steps per training step and the schedule are those of W=1; with several mini-batches a rank
shuffles its own rows.

Weights leave through `named_weights`, one full tensor at a time, gathered by every rank in the same order
(the sync from shards is in relayrl/sync/gather.py). With `model.lora` the HF model inside peft is what is
sharded (base and adapter alike; only the adapter trains) and a push sends what `sync.lora` wants
(sharded_lora.py).

Leaves out: starting the ranks (tests spawn them, placement/learner_ranks.py makes Ray actors) and checkpoint
files (dist_checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from relayrl.config import Config
from relayrl.learner.ranks import all_reduce_sum, join_learner_group, rank_config
from relayrl.learner.role import LearnerRole
from relayrl.learner.sharded_init import fill_from_rank0, full_state_on_rank0, mixed_precision
from relayrl.learner.sharded_lora import push_view
from relayrl.sync.buckets import Layout, make_layout
from relayrl.types import Experience


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer's block list (`model.layers` of an HF decoder, wherever it sits)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__} has no decoder-layer list to shard")


def shard_model(
    model: nn.Module, gradient_divide: float = 1.0, offload: bool = False, precision: MixedPrecisionPolicy | None = None
) -> nn.Module:
    """FSDP2 per decoder layer, then the root. Gradients are summed over the ranks and divided by
    `gradient_divide`: 1 for a loss that already holds the global 1/N. `offload` (learner.offload=params): the
    shards, their gradients and so the optimizer state live in CPU memory (FSDP2's CPUOffloadPolicy).
    `precision`: FSDP2's mixed-precision policy (None: the parameters' own dtype throughout).
    A model built with activation checkpointing (PolicyLearner) keeps it: the wrap goes around its layers."""
    policy = {"offload_policy": CPUOffloadPolicy()} if offload else {}
    if precision is not None:
        policy["mp_policy"] = precision
    for layer in decoder_layers(model):
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(gradient_divide)
            module.set_force_sum_reduction_for_comms(True)  # SUM, then a division (gloo has no PREMUL_SUM or AVG)
    if hasattr(model, "base_model_prefix"):
        model.__class__ = _rooted(type(model))
    return model


class _BaseThroughRoot:
    """`model.base_model` of a sharded causal LM: calling it runs the root's forward (its FSDP hooks gather the
    embeddings, final norm and head) and returns the decoder's output. The learner's layout applies the LM head
    to hidden states itself (train.logits_chunk), so it calls `model.base_model(...)`; called directly, the
    decoder would run outside the root and meet sharded embeddings."""

    def __init__(self, root: nn.Module):
        self.root = root

    def __call__(self, *args, **kwargs):
        return self.root(*args, hidden_states_only=True, **kwargs)

    def __getattr__(self, name: str):
        return getattr(getattr(self.root, self.root.base_model_prefix), name)


def _rooted(cls: type) -> type:
    class Rooted(cls):
        @property
        def base_model(self):
            return _BaseThroughRoot(self)

        def forward(self, *args, hidden_states_only: bool = False, **kwargs):
            if hidden_states_only:
                return getattr(self, self.base_model_prefix)(*args, **kwargs)
            return super().forward(*args, **kwargs)

    Rooted.__name__ = Rooted.__qualname__ = cls.__name__
    return Rooted


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
    network.reshard()


class _GlobalNormaliser:
    """`Objective.normaliser` summed over the ranks: token and sequence counts add up across row shares."""

    def __init__(self, local):
        self.local = local

    def __call__(self, mask: torch.Tensor) -> float:
        return all_reduce_sum(self.local(mask))


class ShardedLearner(LearnerRole):
    def __init__(
        self, config: Config, rank: int, world: int, address: str, port: int, timeout_s: float, threads: int = 0
    ):
        join_learner_group(rank, world, address, port, timeout_s)
        self.rank, self.world = rank, world
        super().__init__(rank_config(config, world), threads, meta=rank > 0)  # only rank 0 reads the weights
        policy = self.policy
        self._shard(policy.network, policy.optimizer)  # with LoRA the HF model inside peft: the forward enters there
        if policy.reference is not None:
            self._shard(policy.reference, None)
        if self.critic is not None:
            self._shard(self.critic.model, self.critic.optimizer)
            self.critic.normaliser = _GlobalNormaliser(self.critic.normaliser)
        policy.objective.normaliser = _GlobalNormaliser(policy.objective.normaliser)
        if config.model.lora is not None:
            _first_pass_with_adapter(policy.network, policy.device)
        controller = policy.objective.kl_controller
        local_update, self.tokens = controller.update, 0.0

        def global_update(kl: float, n_steps: int):
            tokens = all_reduce_sum(self.tokens)
            return local_update(all_reduce_sum(kl * self.tokens) / max(tokens, 1.0), int(all_reduce_sum(n_steps)))

        controller.update = global_update

    def _shard(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Shard one model (built on rank 0, empty elsewhere), fill every rank's shards from rank 0, and point
        its optimizer at them. offload=params on CPU is refused by memory_settings.py."""
        full = full_state_on_rank0(model, self.rank)
        device, offload = self.policy.device, self.config.learner.offload == "params"
        shard_model(model, offload=offload, precision=mixed_precision(self.config, device))
        fill_from_rank0(model, full, device, offload)
        if optimizer is not None:
            _rebind_optimizer(optimizer, self.policy.model if optimizer is self.policy.optimizer else model)

    def prepare(self, exp: Experience) -> Experience:
        exp = super().prepare(exp)
        for model in (self.policy.network, self.policy.reference, self.critic and self.critic.model):
            if model is not None:
                model.reshard()  # a no-grad forward leaves the root's parameters (embeddings, head) gathered
        return exp

    def update(self, step: int, exp: Experience) -> dict[str, float]:
        self.tokens = float(exp.loss_mask.sum())
        stats = super().update(step, exp)
        if self.critic is not None:  # each rank's value loss is its part of the global token mean
            stats["critic/value_loss"] = all_reduce_sum(stats["critic/value_loss"])
        return stats

    # ------------------------------------------------------------------ weights, one full tensor at a time
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank must iterate this to the end, in step: each tensor is an all-gather of its shards."""
        view = push_view(self.policy)  # with LoRA: what sync.lora sends
        view.reshard()
        for name, param in view.named_parameters():
            yield name, param.full_tensor().detach()

    def weight_layout(self, bucket_mb: float, wire_dtype: str) -> Layout:
        """From the global shapes alone: nothing is gathered."""
        shapes = ((n, tuple(p.shape)) for n, p in push_view(self.policy).named_parameters())
        return make_layout(shapes, bucket_mb, wire_dtype)

    def adoptable_parameters(self):
        return None  # shards cannot live in the engine's buckets

    def open_sender(self, transport, layout, checksum, timeout_s, directory, owner=None) -> int:
        from relayrl.sync.gather import SyncPlan, streaming_sender

        self.close_sender()
        self.layout, self.sync_plan = layout, SyncPlan(transport, checksum)
        if self.rank == 0:  # only rank 0 talks to the engines
            self.sender = streaming_sender(transport, layout, checksum, self.sync_group, timeout_s, directory, owner)
        return 0

    def send_weights(self, version: int, only: list[int] | None = None):
        from relayrl.sync.gather import send_from_shards

        return send_from_shards(push_view(self.policy), self.layout, self.sync_plan, self.sender, version, only)

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Every rank runs the forward (its all-gathers); each returns the same values."""
        return super().sequence_logprobs(token_ids)

    # ------------------------------------------------------------------ state (relayrl/learner/dist_checkpoint.py)
    def state(self) -> dict:
        from relayrl.learner.dist_checkpoint import shared_state

        return shared_state(self)

    def checkpoint(self, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
        from relayrl.learner.dist_checkpoint import save_sharded

        return save_sharded(self, run_dir, step, loop_state, keep)

    def load_state(self, checkpoint: str | Path, state: dict) -> None:
        from relayrl.learner.dist_checkpoint import load_any

        load_any(self, checkpoint, state)

    def save(self, run_dir: str | Path, tokenizer=None) -> None:
        from relayrl.learner.dist_checkpoint import save_pretrained_from_shards

        save_pretrained_from_shards(self, Path(run_dir) / "model", tokenizer)
