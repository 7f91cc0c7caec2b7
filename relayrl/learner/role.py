"""The learner role: the policy (with its reference) and the optional critic, behind one small interface.

The controller talks to this object and nothing inside it. Under `placement.mode=local` it lives in the
driver; under `ray` the same class runs inside an actor and the controller holds a proxy with the same
methods (`relayrl/placement/roles.py`). Methods therefore take and return values (an `Experience` comes
back filled) rather than mutating the caller's objects, and checkpoints are written from here, where
the weights are. The sending half of a weight transport (`WeightSource`) lives here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from relayrl.config import Config
from relayrl.learner.critic import Critic
from relayrl.learner.policy import PolicyLearner
from relayrl.run.checkpoint import WRITE_ERRORS, CheckpointError, newest_kept, save_checkpoint, write_cause
from relayrl.sync.endpoints import WeightSource
from relayrl.types import Experience


class Learner(Protocol):
    """What the controller calls on the learner, wherever it runs: a `LearnerRole` here, a proxy on one in a Ray
    actor (relayrl/placement/roles.py), or a handle on W sharded ranks; the syncs add the `WeightSource` half."""

    def prepare(self, exp: Experience) -> Experience: ...

    def update(self, step: int, exp: Experience) -> dict[str, float]: ...

    def checkpoint(self, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str: ...

    def load_state(self, checkpoint: str | Path, state: dict) -> None: ...

    def save(self, run_dir: str | Path, tokenizer=None) -> None: ...


class LearnerRole(WeightSource):
    def __init__(self, config: Config, threads: int = 0, meta: bool = False):
        """`meta` (sharded learner ranks other than 0): the models are built on the meta device, without reading
        their weights; sharded.py fills their shards from rank 0."""
        if threads:
            torch.set_num_threads(threads)
        self.config = config
        if meta:
            from relayrl.learner.sharded_init import empty_causal_lm

            self.policy = PolicyLearner(config, empty_causal_lm)
        else:
            self.policy = PolicyLearner(config)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.critic = Critic(config, device, meta) if config.algorithm.advantage == "gae" else None

    def ping(self) -> int:
        return torch.get_num_threads()

    # ------------------------------------------------------------------ the step
    def prepare(self, exp: Experience) -> Experience:
        """The passes over the pre-update policy: old and reference log-probs, critic values; and with
        kl.placement=reward, the per-token KL penalty the advantage estimator adds to the rewards."""
        self.policy.fill_logprobs(exp)
        if self.critic is not None:
            exp.values = self.critic.values(exp)
        exp.reward_penalty = self.policy.objective.reward_penalty(exp)  # None unless kl.placement=reward
        return exp

    def update(self, step: int, exp: Experience) -> dict[str, float]:
        """The critic (if any) regresses on the returns; the actor waits out critic.warmup_steps."""
        stats = {} if self.critic is None else self.critic.update(exp)
        if self.critic is None or step >= self.config.critic.warmup_steps:
            stats.update(self.policy.update(exp))
        return stats

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        policy, critic = self.policy, self.critic
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

    def load_state(self, checkpoint: str | Path, state: dict) -> None:
        from relayrl.learner.dist_checkpoint import is_sharded, load_any

        if is_sharded(checkpoint):  # written by placement.learner_ranks > 1: resharded into this one process
            return load_any(self, checkpoint, state)
        policy = self.policy
        policy.load_model(Path(checkpoint) / "model")  # full weights, or with LoRA the adapter
        policy.optimizer.load_state_dict(state["optimizer"])
        policy.scheduler.load_state_dict(state["scheduler"])
        policy.generator.set_state(state["generator"])
        policy.objective.kl_controller.coef = state["kl_coef"]
        if self.critic is not None:
            self.critic.load_trainable_state(state["critic"]["model"])
            self.critic.optimizer.load_state_dict(state["critic"]["optimizer"])
            self.critic.generator.set_state(state["critic"]["generator"])
        torch.set_rng_state(state["torch_rng"])

    def checkpoint(self, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
        """Write the policy, this role's state and the loop's state as one atomic checkpoint."""
        return str(save_checkpoint(run_dir, step, self.policy.model, {**loop_state, **self.state()}, keep))

    def save(self, run_dir: str | Path, tokenizer=None) -> None:
        """The final policy (and critic); a failed write (disk full) names the path, the cause and what is kept."""
        target = Path(run_dir) / "model"
        try:
            self.policy.save(target, tokenizer)
            if self.critic is not None:
                target = Path(run_dir) / "critic"
                self.critic.save(target)
        except WRITE_ERRORS as err:
            raise CheckpointError(
                f"could not save the final model to {target} ({write_cause(err)}); {newest_kept(run_dir)}"
            ) from err

    # ------------------------------------------------------------------ weights
    def adoptable_parameters(self):
        return self.policy.model.named_parameters()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.policy.named_weights()

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 at temperature 1 (the parity probe's learner side)."""
        ids = torch.tensor([token_ids], device=self.policy.device)
        logits = self.policy.model(input_ids=ids).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

    def close(self) -> None:
        self.close_sender()
