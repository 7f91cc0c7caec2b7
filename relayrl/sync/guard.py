"""The push guard: no silent no-op. A run whose engine never holds the trained weights (a skipped bucket, an
adapter bound to no module, a tower dropped by sleep) "succeeds" while training nothing; this stops it within
one step, naming the push, its policy version and its tensors.

Two checks, both against `sync.max_mismatch` (a mean |engine - learner| log-prob that bf16 numerics stay under:
the H200 demo measured 0.007 in bf16, ~1e-7 in fp32):
- the parity probe (`sync.parity_probe`): teacher-forced log-probs of one fixed sequence, the learner's taken
  before the push (its weights are final then, and it is still on its device under time-sharing), the engine's
  after it (its KV cache awake). A push that changed no served log-prob while the learner's moved, or a mean gap
  past the threshold, stops the run at that push;
- each step's samples (`mismatch/logprob_abs_mean`, tokens sampled by the version being trained): a mean gap
  past the threshold says the engine that sampled them did not serve that version; the run stops after the update.
Left out: which of the pushed tensors is wrong (an engine's own parameter names differ from the learner's), and
replicas beyond the first for the probe (the samples' check covers every replica).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relayrl.errors import SyncError

if TYPE_CHECKING:
    from relayrl.learner.result import MismatchByVersion
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.sync.base import LearnerWeights, WeightSync
    from relayrl.types import Prompt

OFF_HINT = "sync.max_mismatch=0 turns this check off"


@dataclass
class PushGuard:
    max_mismatch: float  # 0: no threshold (the no-op check still runs with a probe)
    probe_ids: list[int] | None  # the parity probe's sequence; None: no probe
    learned: list[float] | None = None  # the learner's probe log-probs at the last check
    served: list[float] | None = None  # the engine's, at the last check
    pending: list[float] | None = None  # the learner's, of the weights being pushed
    last: dict[str, float] = field(default_factory=dict)  # sync/parity_abs_{max,mean} of the last push

    @classmethod
    def off(cls) -> PushGuard:
        return cls(0.0, None)

    def start(self, learner: LearnerWeights, engines: EngineGroup) -> None:
        """Before the first step (both sides hold the same weights): the probe's starting point."""
        if self.probe_ids:
            self.learned = learner.sequence_logprobs(self.probe_ids)
            self.served = engines.prompt_logprobs(self.probe_ids)

    def before_push(self, learner: LearnerWeights) -> None:
        """The learner's probe log-probs of the weights about to be pushed."""
        if self.probe_ids:
            self.pending = learner.sequence_logprobs(self.probe_ids)

    def after_push(self, engines: EngineGroup, sync: WeightSync) -> None:
        """The engine's probe log-probs now; raise if the push changed none of them while the learner's moved, or
        left them further from the learner's than `max_mismatch`."""
        if not self.probe_ids or self.pending is None:
            return
        served, learned = engines.prompt_logprobs(self.probe_ids), self.pending
        gaps = [abs(a - b) for a, b in zip(served, learned)]
        mean = sum(gaps) / len(gaps)
        self.last = {"sync/parity_abs_max": max(gaps), "sync/parity_abs_mean": mean}
        moved = _largest_change(self.learned, learned)
        if self.served == served and moved > 0:
            raise SyncError(
                f"{describe_push(sync)} changed no log-prob the engine serves, while the learner's moved by up to "
                f"{moved:.2e} on the parity probe ({len(self.probe_ids)} tokens): the engine still serves the "
                "previous weights"
            )
        if self.max_mismatch and mean > self.max_mismatch:
            raise SyncError(
                f"after {describe_push(sync)}, the engine's log-probs differ from the learner's by {mean:.3g} on "
                f"average on the parity probe (largest {max(gaps):.3g}), past sync.max_mismatch="
                f"{self.max_mismatch:g}: the weights did not land as sent ({OFF_HINT})"
            )
        self.served, self.learned, self.pending = served, learned, None

    def check_samples(self, step: int, mismatch: MismatchByVersion, trained: int, sync: WeightSync) -> None:
        """Raise if the step's samples of version `trained` (the version the update started from) disagree
        with the learner's log-probs by more than `max_mismatch` on average."""
        fresh = [part for version, part in mismatch.items() if version >= trained]  # as mismatch/* counts them
        tokens = sum(n for _, _, n in fresh)
        if not self.max_mismatch or not tokens:
            return
        mean, largest = sum(total for total, _, _ in fresh) / tokens, max(top for _, top, _ in fresh)
        if mean <= self.max_mismatch:
            return
        raise SyncError(
            f"step {step}: the engine's log-probs of the {tokens} tokens it sampled at policy version {trained} "
            f"differ from the learner's by {mean:.3g} on average (largest {largest:.3g}), "
            f"past sync.max_mismatch={self.max_mismatch:g}: the engine did not serve version {trained}; "
            f"{describe_push(sync, trained)} did not land as sent ({OFF_HINT})"
        )


def describe_push(sync: WeightSync, version: int | None = None) -> str:
    """'the push of policy version V (transport, N tensors: a, b, c and M more)'."""
    names = sync.tensors
    if not names:  # nothing pushed yet in this process: the engine loaded its weights itself
        return f"the weights the engine started from (policy version {sync.version}, model.path or a checkpoint)"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    version = sync.version if version is None else version
    return f"the push of policy version {version} ({sync.transport}, {len(names)} tensors: {shown})"


def _largest_change(before: list[float] | None, after: list[float]) -> float:
    return 0.0 if before is None else max(abs(a - b) for a, b in zip(before, after))


def probe_sequence(first: Prompt, last: Prompt, max_len: int) -> list[int] | None:
    """The parity probe's token ids: the data's first and last prompts, those without images (a teacher-forced
    forward takes none), cut to the context; None when both have images."""
    ids = [token for prompt in (first, last) if not prompt.images for token in prompt.token_ids]
    return ids[: max_len - 1] or None
