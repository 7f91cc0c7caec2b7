"""The learner role: the policy (with its reference), the optional critic and teacher, behind one small interface.

The controller talks to this object and nothing inside it. Under `placement.mode=local` it lives in the
driver; under `ray` the same class runs inside an actor (or one per rank, `placement.learner_ranks`) and the
controller holds a proxy with the same methods (`relayrl/placement/handles.py`). Methods therefore take and
return values (an `Experience` comes back filled) rather than mutating the caller's objects, and checkpoints
are written from here, where the weights are. How the models are spread over processes (whole here, or FSDP2
shards across ranks) is its `distribution`, chosen once (relayrl/learner/distribution.py). The sending half of
a weight transport (`WeightSource`) lives here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from relayrl.learner.critic import Critic
from relayrl.learner.distribution import Distribution, OneProcess
from relayrl.learner.offload import return_cached_blocks
from relayrl.learner.policy import PolicyLearner
from relayrl.learner.result import UpdateResult
from relayrl.learner.teacher import Teachers
from relayrl.sync.base import LearnerWeights
from relayrl.sync.endpoints import WeightSource

if TYPE_CHECKING:
    from relayrl.learner.settings import LearnerSettings
    from relayrl.sync.buckets import BucketLayout
    from relayrl.sync.transports import Manifest
    from relayrl.types import Experience


class Learner(LearnerWeights, Protocol):
    """What the controller calls on the learner, wherever it runs: a `LearnerRole` here, a proxy on one in a Ray
    actor (relayrl/placement/handles.py), or a handle on W sharded ranks; the Ray syncs add the `WeightSource` half."""

    def prepare(self, exp: Experience) -> Experience: ...

    def score_teacher(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience: ...

    def update(self, step: int, exp: Experience, sample_rows: int = 0) -> UpdateResult:
        """The step's optimizer updates; `sample_rows`: how many first rows of the batch the step logs to
        samples.jsonl, whose pre-update log-probs come back in the result (0: none)."""
        ...

    def checkpoint(self, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str: ...

    def load_state(self, checkpoint: str | Path, state: dict) -> None: ...

    def save(self, run_dir: str | Path, tokenizer=None) -> None: ...


class LearnerRole(WeightSource):
    def __init__(self, settings: LearnerSettings, threads: int = 0, distribution: Distribution | None = None):
        """`distribution`: how the models are spread (default: whole, in this process). Sharded ranks other than
        0 build their models on the meta device, without reading weights, rank 0 reads them into CPU memory;
        `attach` shards them and fills every rank's shards from rank 0."""
        if threads:
            torch.set_num_threads(threads)
        self.distribution = distribution or OneProcess()
        self.settings = settings = self.distribution.share(settings)
        empty, host = self.distribution.empty_models, self.distribution.host_models
        if empty or host:
            from relayrl.learner.sharded_init import empty_causal_lm, load_on_host

            self.policy = PolicyLearner(settings, empty_causal_lm if empty else load_on_host)
        else:
            self.policy = PolicyLearner(settings)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        gae = settings.algorithm.advantage == "gae"
        self.critic = Critic(settings, device, empty, on_host=host) if gae else None
        teacher = settings.teacher  # teacher.engine=actor or vllm: the teacher is a role of its own, not loaded here
        self.teacher = Teachers.local(teacher, self.policy) if teacher and teacher.engine in ("auto", "local") else None
        self.distribution.attach(self)
        self._colocated_free()  # the load's peak (one process: whole models; W ranks: a full tensor in flight)

    def _colocated_free(self) -> None:
        """An engine shares this GPU: the allocator's cached blocks go back (relayrl/learner/offload.py)."""
        if self.settings.colocated:
            return_cached_blocks(self.policy.device)

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
        self.distribution.after_passes(self)
        return exp

    def score_teacher(self, exp: Experience, teacher_rows: Experience | None = None) -> Experience:
        """On-policy distillation: the teacher's log-probs of the sampled tokens (`teacher.path`), once per sample.
        `teacher_rows`: with `teacher.prompt`, the same responses after the teacher's prompt
        (relayrl/algorithms/teacher_prompt.py); the teacher scores those, aligned back to `exp`'s columns."""
        if self.teacher is None:
            raise RuntimeError(
                "score_teacher called on a learner built without teacher.path, or whose teacher is a role of its own "
                "(teacher.engine=actor or vllm)"
            )
        return self.teacher.score(exp, teacher_rows)

    def update(self, step: int, exp: Experience, sample_rows: int = 0) -> UpdateResult:
        result = self.distribution.update(self, step, exp, sample_rows)
        self._colocated_free()  # the update's activations and gradients: the engine wakes into that room
        return result

    def train_step(self, step: int, exp: Experience, sample_rows: int = 0) -> UpdateResult:
        """The critic (if any) regresses on the returns; the actor waits out critic.warmup_steps. The critic's
        metrics come first in the result's."""
        critic = {} if self.critic is None else self.critic.update(exp)
        if self.critic is not None and step < self.settings.critic.warmup_steps:
            return UpdateResult(critic)
        actor = self.policy.update(exp, sample_rows)
        return dataclasses.replace(actor, metrics={**critic, **actor.metrics})

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return self.distribution.state(self)

    def load_state(self, checkpoint: str | Path, state: dict) -> None:
        self.distribution.load_state(self, checkpoint, state)

    def checkpoint(self, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
        """Write the policy, this role's state and the loop's state as one atomic checkpoint."""
        return self.distribution.checkpoint(self, run_dir, step, loop_state, keep)

    def save(self, run_dir: str | Path, tokenizer=None) -> None:
        """The final policy (and critic) as `save_pretrained` directories under `run_dir`."""
        self.distribution.save(self, run_dir, tokenizer)

    def offload_states(self) -> int:
        """learner.offload=between_phases: parameters, gradients and optimizer state off the device (the engine
        generates meanwhile); the bytes moved."""
        return self.distribution.move_states(self, "cpu")

    def reload_states(self) -> int:
        """Back on the device for the update (the inverse of `offload_states`)."""
        return self.distribution.move_states(self, self.policy.device)

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.distribution.named_weights(self)

    def weight_layout(self, bucket_mb: float, wire_dtype: str) -> BucketLayout:
        return self.distribution.weight_layout(self, bucket_mb, wire_dtype)

    def open_sender(
        self,
        transport: str,
        layout: BucketLayout,
        checksum: bool,
        timeout_s: float,
        directory: str,
        owner: int | None = None,
    ) -> int:
        self.close_sender()
        return self.distribution.open_sender(self, transport, layout, checksum, timeout_s, directory, owner)

    def send_weights(self, version: int, only: list[int] | None = None) -> Manifest | None:
        return self.distribution.send_weights(self, version, only)

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of tokens 1..N-1 at temperature 1 (the parity probe's learner side). On
        sharded ranks every rank runs the forward (its all-gathers); each returns the same values."""
        ids = torch.tensor([token_ids], device=self.policy.device)
        logits = self.policy.model(input_ids=ids).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

    def close(self) -> None:
        self.close_sender()
