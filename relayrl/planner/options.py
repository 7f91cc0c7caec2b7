"""`relayrl plan`'s own keys, `plan.*`: what to plan on (hardware, the model's shape, expected lengths) and the
placement dry run. They are the command's, not the run's: a run's config never holds them (relayrl/config/ is the
run's tree), but they load the same way (`relayrl.config.load.load_command_section`: strict keys, did-you-mean).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.section import Section

# the model-shape keys: each overrides a field of model.path's config.json (key, what it is, an example)
SHAPE_KEYS = (
    ("params", "parameters in all", "7e9"),
    ("layers", "decoder layers", "32"),
    ("hidden", "hidden size", "4096"),
    ("kv_heads", "key/value heads (grouped-query attention)", "8"),
    ("head_dim", "size of one attention head", "128"),
    ("vocab", "vocabulary size", "152064"),
)


class PlanOptions(Section):
    hardware: str = Field(default="H100-80GB", description="H100-80GB, H200, A100-80GB, A10G, L4 or cpu.")
    measure: bool = Field(
        default=False,
        description="Measure this CPU (plan.hardware=cpu): bandwidth, peak FLOP/s, the model's matmuls at the "
        "plan's shapes, the engine's fixed costs (~30 s).",
    )
    params: float | None = Field(default=None, gt=0, description="The model's parameters in all, for config.json's.")
    layers: float | None = Field(default=None, gt=0, description="The model's decoder layers, for config.json's.")
    hidden: float | None = Field(default=None, gt=0, description="The model's hidden size, for config.json's.")
    kv_heads: float | None = Field(default=None, gt=0, description="The model's key/value heads, for config.json's.")
    head_dim: float | None = Field(
        default=None, gt=0, description="The model's attention head size, for config.json's."
    )
    vocab: float | None = Field(default=None, gt=0, description="The model's vocabulary size, for config.json's.")
    fp32_master: bool = Field(
        default=True, description="An fp32 master copy of the weights: 16 B/param, else 12 (GPU)."
    )
    infer_dtype: Literal["bf16", "fp8", "fp32"] | None = Field(
        default=None, description="Engine/reference weights (default: bf16 on GPU, fp32 on CPU)."
    )
    offload: bool = Field(default=False, description="Trainer states leave the device while generating.")
    learner_ranks: int | None = Field(
        default=None, ge=1, description="Learner ranks W (default placement.learner_ranks)."
    )
    prompt_tokens: float | None = Field(
        default=None,
        description="Expected longest prompt of a batch (default data.max_prompt_tokens): the learner pads every "
        "row to the batch's longest sequence.",
    )
    response_tokens: float | None = Field(
        default=None,
        description="Expected longest response of a batch (default rollout.max_tokens); e.g. a previous run's "
        "response/length_max.",
    )
    mean_response_tokens: float | None = Field(
        default=None,
        description="Expected mean response (default the longest): compute-bound decode and the engine's per-token "
        "costs scale with it; e.g. a previous run's response/length_mean.",
    )
    simulate: bool = Field(
        default=False,
        description="Run the learner of the config on fake tensors (W fake ranks, plan.learner_ranks) and print one "
        "GPU's bytes per phase beside the plan's (relayrl/planner/simulate.py; seconds to minutes on CPU).",
    )
    place: bool = Field(
        default=False,
        description="Place the roles on Ray as the run would (placement.address, this machine, or plan.nodes) and "
        "print where each lands; starts no engine and loads no weights.",
    )
    nodes: int | None = Field(default=None, ge=1, description="With plan.place: simulate a cluster of this many nodes.")
    gpus_per_node: int = Field(default=0, ge=0, description="With plan.nodes: logical GPUs on each node.")
    cpus_per_node: int = Field(default=8, ge=1, description="With plan.nodes: CPUs on each node.")
    as_json: bool = Field(default=False, description="With plan.place: the rows as a JSON list of objects.")
