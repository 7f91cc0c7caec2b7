"""The vision part of a plan: a vision-language model's tower and connector in memory, sync and time.

Memory: every role holds the tower and the connector, at the bytes it holds its weights in (P counts them,
relayrl/models/shape.py): the engine and the reference at b_infer, the policy at b_train. With
`model.freeze_vision` (the default) the policy's tower has no gradient and no optimizer state: it costs only its
weight terms (b_frozen = b_train minus the gradient and Adam's moments). The critic's value model does not freeze
it; with LoRA the tower is part of the frozen base already.
Sync: a full push leaves the frozen tower out (`PolicyLearner.named_weights`), and so do a sharded learner's
gathers; an adapter push is the adapter; a merged push is every weight.
Time: the encoder runs once per image in every pass that reads a prompt: the engine's prefill, each log-prob pass
and the update (the learner pads image batches, it never packs them: relayrl/learner/layout.py). FLOPs per
image: 2 x T x patches (the tower's weights over its patches) + 2 x C x image tokens (the connector's over the
tokens it makes); attention inside the tower is left out. The update adds a backward (two forwards) for what
trains: the connector always, the tower only when not frozen.
Images per prompt: counted from the `images` of the rows the planner samples from data.train
(relayrl/planner/prompts.py, which also counts their image tokens); without them, one image per prompt is
assumed at the image tokens the config fixes. Left out: the tower's activations in the update when it trains,
the engine's encoder cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relayrl.models.shape import ModelShape

if TYPE_CHECKING:
    from relayrl.planner.estimate import Precision, Workload
    from relayrl.planner.prompts import PromptLengths

STATE_TERMS = ("grad", "Adam")  # what a frozen parameter lacks: its gradient and the optimizer's moments


def frozen_bytes(precision: Precision) -> int:
    """Bytes per frozen parameter in the policy: its weight terms only (b_train without grad and Adam m, v)."""
    return sum(b for name, b in precision.train_terms if not any(term in name for term in STATE_TERMS))


def frozen_tower(shape: ModelShape, work: Workload) -> int:
    """Parameters of the policy's tower that have no gradient and no optimizer state and are not pushed:
    the tower under model.freeze_vision in full fine-tuning; 0 otherwise (with LoRA the whole base is frozen)."""
    return shape.vision_params if work.freeze_vision and not work.lora_rank else 0


def vision_workload(shape: ModelShape, prompts: PromptLengths | str) -> dict[str, float]:
    """`Workload.images_per_prompt` and `image_tokens_per_image`: from the sampled rows when data.train was
    read, else one image per prompt at the config's image tokens. Empty for a text-only model."""
    if not shape.vision_params:
        return {}
    from relayrl.planner.prompts import PromptLengths

    configured = float(shape.image_tokens or 0)
    if not isinstance(prompts, PromptLengths):
        return {"images_per_prompt": 1.0, "image_tokens_per_image": configured}
    per_image = prompts.image_tokens / prompts.images if prompts.images else 0.0
    return {"images_per_prompt": prompts.images, "image_tokens_per_image": per_image or configured}


def patches_per_image(shape: ModelShape, work: Workload) -> float:
    """Patches the tower encodes per image: the image tokens times the patches merged into each, else the
    config's fixed patches."""
    if shape.patch_merge and work.image_tokens_per_image:
        return work.image_tokens_per_image * shape.patch_merge
    return float(shape.image_patches or 0)


def encoder_flops_per_image(shape: ModelShape, work: Workload) -> tuple[float, float]:
    """(tower, connector) forward FLOPs of one image: 2 x T x patches, 2 x C x image tokens."""
    tower = 2 * shape.vision_params * patches_per_image(shape, work)
    return tower, 2 * shape.connector_params * work.image_tokens_per_image


@dataclass(frozen=True)
class EncoderTime:
    """Seconds of the vision encoder (tower + connector) inside the step's phases, already counted in them."""

    prefill: float  # the engine's, over the rollout batch's images
    forward: float  # one learner log-prob pass's
    update: float  # the update's: every epoch's forward and the backward of what trains

    def in_step(self, work: Workload) -> float:
        passes = (work.optimizer_steps > 1) + work.reference + work.critic  # old, reference, critic log-probs
        return self.prefill + passes * self.forward + (1 + work.critic) * self.update


def encoder_time(
    shape: ModelShape, work: Workload, prefill_rate: float, forward_rate: float, update_rate: float
) -> EncoderTime:
    """The encoder's seconds at each phase's rate (FLOP/s of all the devices that phase runs on)."""
    images = work.rollout_batch * work.images_per_prompt
    if not images or not shape.vision_params:
        return EncoderTime(0.0, 0.0, 0.0)
    tower, connector = encoder_flops_per_image(shape, work)
    trained = connector + (0.0 if work.freeze_vision else tower)  # the backward's two forwards run over these
    forward = (tower + connector) * images
    return EncoderTime(
        prefill=forward / prefill_rate,
        forward=forward / forward_rate,
        update=work.epochs * (forward + 2 * trained * images) / update_rate,
    )
