"""How the learner's models are spread over processes, chosen once when the learner is built (learner/role.py).

- `OneProcess`: the policy, reference and critic whole in this process; checkpoints are `save_pretrained`
  directories with the optimizer's state beside them; a push reads the parameters as they are (the shared-memory
  transport may adopt them).
- `ShardedRanks` (relayrl/learner/sharded.py): this process is one of W FSDP2 ranks; checkpoints are
  torch.distributed.checkpoint shards; a push gathers one parameter at a time and rank 0 streams the buckets.

The learner calls its distribution at the few points where the two differ: the rank's share of the config,
once the models are built (`attach`), around a step's passes and update, when weights leave, and when state is
saved or restored. Everything else (the passes, the losses, the optimizer step) is the same code for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from relayrl.run.checkpoint import WRITE_ERRORS, CheckpointError, newest_kept, save_checkpoint, write_cause
from relayrl.sync.buckets import BucketLayout, layout_of
from relayrl.sync.transports import Manifest, make_sender

if TYPE_CHECKING:
    from relayrl.learner.result import UpdateResult
    from relayrl.learner.role import LearnerRole
    from relayrl.learner.settings import LearnerSettings
    from relayrl.types import Experience


class Distribution(Protocol):
    empty_models: bool  # build the models on the meta device: their weights arrive from rank 0 in `attach`
    host_models: bool  # read the weights into CPU memory (sharded rank 0): `attach` shards them onto the device

    def share(self, settings: LearnerSettings) -> LearnerSettings:
        """The settings this process trains with (a rank's share of each step's prompts and mini-batches)."""
        ...

    def attach(self, learner: LearnerRole) -> None:
        """Set up the built models (shard them, make the loss normalisers global)."""
        ...

    def after_passes(self, learner: LearnerRole) -> None:
        """After the no-grad passes of `prepare`."""
        ...

    def update(self, learner: LearnerRole, step: int, exp: Experience, sample_rows: int) -> UpdateResult:
        """`learner.train_step(step, exp, sample_rows)`, with whatever the ranks must agree on around it."""
        ...

    def named_weights(self, learner: LearnerRole) -> Iterator[tuple[str, torch.Tensor]]: ...

    def weight_layout(self, learner: LearnerRole, bucket_mb: float, wire_dtype: str) -> BucketLayout: ...

    def open_sender(self, learner: LearnerRole, transport, layout, checksum, timeout_s, directory, owner) -> int:
        """The push's sending end on `learner.sender`; returns the parameters moved into shared memory."""
        ...

    def send_weights(self, learner: LearnerRole, version: int, only: list[int] | None) -> Manifest | None: ...

    def state(self, learner: LearnerRole) -> dict: ...

    def checkpoint(self, learner: LearnerRole, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str: ...

    def load_state(self, learner: LearnerRole, checkpoint: str | Path, state: dict) -> None: ...

    def save(self, learner: LearnerRole, run_dir: str | Path, tokenizer=None) -> None: ...

    def move_states(self, learner: LearnerRole, device: str) -> int:
        """`learner.offload=between_phases`: every state the learner holds to `device` (relayrl/learner/offload.py);
        the bytes moved."""
        ...


class OneProcess:
    """The whole learner in this process (see the module docstring)."""

    empty_models = False
    host_models = False

    def share(self, settings: LearnerSettings) -> LearnerSettings:
        return settings

    def attach(self, learner: LearnerRole) -> None:
        pass

    def after_passes(self, learner: LearnerRole) -> None:
        pass

    def update(self, learner: LearnerRole, step: int, exp: Experience, sample_rows: int) -> UpdateResult:
        return learner.train_step(step, exp, sample_rows)

    # ------------------------------------------------------------------ weights
    def named_weights(self, learner: LearnerRole) -> Iterator[tuple[str, torch.Tensor]]:
        return learner.policy.named_weights()

    def weight_layout(self, learner: LearnerRole, bucket_mb: float, wire_dtype: str) -> BucketLayout:
        return layout_of(self.named_weights(learner), bucket_mb, wire_dtype)

    def open_sender(self, learner: LearnerRole, transport, layout, checksum, timeout_s, directory, owner) -> int:
        learner.sender = make_sender(
            transport, layout, checksum, learner.sync_group, timeout_s, directory or None, owner
        )
        return learner.sender.adopt(learner.policy.model.named_parameters())

    def send_weights(self, learner: LearnerRole, version: int, only: list[int] | None) -> Manifest:
        sender = learner.sender
        assert sender is not None, "open_sender runs before the first push"
        return sender.send(self.named_weights(learner), version, only)

    # ------------------------------------------------------------------ state
    def state(self, learner: LearnerRole) -> dict:
        policy, critic = learner.policy, learner.critic
        return {
            "optimizer": policy.optimizer.state_dict(),
            "scheduler": policy.scheduler.state_dict(),
            "generator": policy.generator.get_state(),
            "kl_coef": policy.objective.kl_controller.coef,
            "torch_rng": torch.get_rng_state(),
            "critic": None
            if critic is None
            else {
                "model": critic.trainable_state(),  # with LoRA: its adapter and value head
                "optimizer": critic.optimizer.state_dict(),
                "generator": critic.generator.get_state(),
            },
        }

    def checkpoint(self, learner: LearnerRole, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
        """The policy, the learner's state and the loop's state as one atomic checkpoint."""
        return str(save_checkpoint(run_dir, step, learner.policy.model, {**loop_state, **self.state(learner)}, keep))

    def load_state(self, learner: LearnerRole, checkpoint: str | Path, state: dict) -> None:
        from relayrl.learner.dist_checkpoint import is_sharded, load_any

        if is_sharded(checkpoint):  # written by placement.learner_ranks > 1: resharded into this one process
            return load_any(learner, checkpoint, state)
        policy, critic = learner.policy, learner.critic
        policy.load_model(Path(checkpoint) / "model")  # full weights, or with LoRA the adapter
        policy.optimizer.load_state_dict(state["optimizer"])
        policy.scheduler.load_state_dict(state["scheduler"])
        policy.generator.set_state(state["generator"])
        policy.objective.kl_controller.coef = state["kl_coef"]
        if critic is not None:
            critic.load_trainable_state(state["critic"]["model"])
            critic.optimizer.load_state_dict(state["critic"]["optimizer"])
            critic.generator.set_state(state["critic"]["generator"])
        torch.set_rng_state(state["torch_rng"])

    def move_states(self, learner: LearnerRole, device: str) -> int:
        from relayrl.learner.offload import move_learner

        return move_learner(learner, device)

    def save(self, learner: LearnerRole, run_dir: str | Path, tokenizer=None) -> None:
        """The final policy (and critic); a failed write (disk full) names the path, the cause and what is kept."""
        target = Path(run_dir) / "model"
        try:
            learner.policy.save(target, tokenizer)
            if learner.critic is not None:
                target = Path(run_dir) / "critic"
                learner.critic.save(target)
        except WRITE_ERRORS as err:
            raise CheckpointError(
                f"could not save the final model to {target} ({write_cause(err)}); {newest_kept(run_dir)}"
            ) from err
