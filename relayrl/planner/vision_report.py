"""What `relayrl plan` prints of a vision-language model's vision part (relayrl/planner/vision.py counts it):
its section (tower, connector, image tokens, images per prompt, encoder FLOPs), the formulas' symbols that
change with a frozen tower, and the one-line summary under the tables. Nothing here for a text-only model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.planner.prompts import PromptLengths
from relayrl.planner.vision import encoder_flops_per_image, frozen_bytes, frozen_tower, patches_per_image

if TYPE_CHECKING:
    from relayrl.planner import Plan

Rows = list[tuple[str, str, str]]  # (name, formula with its inputs, value), as report.py's
FROZEN = "frozen: no grads, no optimizer state, not synced"


def _millions(n: float) -> str:
    return f"{n / 1e6:.2f}M"


def tower_state(plan: Plan) -> str:
    """How the policy holds its tower: frozen, trained, or (LoRA) inside the frozen base."""
    if frozen_tower(plan.shape, plan.workload):
        return FROZEN
    if plan.workload.lora_rank:
        return "part of the LoRA's frozen base"
    return "trained: grads, optimizer state, synced (model.freeze_vision=false)"


def image_source(plan: Plan) -> str:
    """Where the images per prompt and their tokens come from."""
    p = plan.prompts
    if isinstance(p, PromptLengths):
        return f"counted in the {p.sampled} rows sampled from data.train: their `images`, the image tokens in their ids"
    return f"assumed: one image per prompt (data.train not read: {p}), at the config's image tokens"


def vision_rows(plan: Plan) -> Rows:
    """The vision section: what the tower and connector weigh, and the images they read per step."""
    s, w = plan.shape, plan.workload
    tower, connector = encoder_flops_per_image(s, w)
    patches = patches_per_image(s, w)
    return [
        (
            "vision tower",
            f"T: the tower's parameters (model.freeze_vision); {tower_state(plan)}",
            _count(s.vision_params),
        ),
        ("connector", "C: image features -> the language model's width (trained)", _count(s.connector_params)),
        ("language model", "P - T - C: what runs per token (FLOPs, decode bytes)", _count(s.text_params)),
        ("images per prompt", image_source(plan), f"{w.images_per_prompt:g}"),
        (
            "image tokens",
            "per image in the prompt; patches the tower encodes per image",
            f"{w.image_tokens_per_image:g}; {patches:g}",
        ),
        ("in prompt tokens", _expanded_text(plan), ""),
        (
            "encoder FLOPs",
            "per image: 2 x T x patches + 2 x C x image tokens",
            f"{(tower + connector) / 1e6:,.2f} MFLOP",
        ),
    ]


def _expanded_text(plan: Plan) -> str:
    """Whether the prompt lengths the plan uses count the image tokens (they do when data.train was read)."""
    if isinstance(plan.prompts, PromptLengths):
        return (
            "yes: data.train's prompts are tokenised with each <image> expanded by the processor, so the prompt "
            f"tokens above include their {plan.prompts.image_tokens:g} image tokens (mean per prompt)"
        )
    return "data.train not read: the prompt limit data.max_prompt_tokens counts the expanded image tokens"


def _count(n: int) -> str:
    return f"{n:,} ({_millions(n)})"


def trained_params(plan: Plan) -> str:
    """The symbol of the parameters an optimizer step and a push touch: P, or P - T with a frozen tower."""
    return "(P - T)" if frozen_tower(plan.shape, plan.workload) else "P"


def actor_formula(plan: Plan, trainable: str) -> str:
    """The actor's bytes: `trainable`, or with a frozen tower its parameters at their weights' bytes only."""
    if not frozen_tower(plan.shape, plan.workload):
        return trainable
    pr = plan.precision
    return f"(P - T) x {pr.train_bytes} + T x {frozen_bytes(pr)} (frozen tower: weights only, no grads, no Adam)"


def encoder_term(plan: Plan) -> str:
    """What a pass's formula adds for the images its prompts hold (the vision encoder row gives its share)."""
    return " + vision encoder" if plan.shape.vision_params and plan.workload.images_per_prompt else ""


def encoder_formula(plan: Plan) -> str:
    """The step time's vision encoder row: where its seconds are counted."""
    w = plan.workload
    images = w.rollout_batch * w.images_per_prompt
    backward = "connector" if w.freeze_vision else "tower + connector"
    return (
        f"{images:g} images x encoder FLOPs, in prefill, each log-prob pass and the update (+ 2 x forward for the "
        f"{backward}'s backward); counted in those phases above"
    )


def vision_line(plan: Plan) -> str | None:
    """The summary under the tables: the vision part is counted, and how."""
    s, w = plan.shape, plan.workload
    if not s.vision_params:
        return None
    return (
        f"vision tower {_millions(s.vision_params)} params ({tower_state(plan)}) + connector "
        f"{_millions(s.connector_params)} params, in every role's weights; {w.image_tokens_per_image:g} image tokens "
        f"per image, {w.images_per_prompt:g} image(s) per prompt, in the prompt lengths and the step time"
    )
