"""The `placement` section: where the roles run (this process, or Ray actors in a placement group), the
resources each reserves, the deadlines, and what a dead engine or learner costs (a restart, or a stop)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from relayrl.config.section import Section
from relayrl.config.warn import warn


class PlacementConfig(Section):
    mode: Literal["local", "ray"] = Field(
        default="local",
        description="local: every role in this process. ray: each role a Ray actor in a placement group.",
    )
    layout: Literal["colocated", "disaggregated"] = Field(
        default="disaggregated",
        description="ray: roles share one bundle and take turns (colocated), or each role has "
        "its own bundle and engines generate while the learner trains (disaggregated).",
    )
    engines: int = Field(
        default=1, ge=1, description="ray: rollout-engine replicas; each step's prompts are split across them."
    )
    learner_cpus: float = Field(
        default=1.0, gt=0, description="ray: CPUs reserved for the learner (and its reference/critic)."
    )
    engine_cpus: float = Field(default=1.0, gt=0, description="ray: CPUs reserved for each rollout engine.")
    learner_threads: int = Field(
        default=0, ge=0, description="ray: torch threads in the learner (0 = its reserved CPUs)."
    )
    engine_threads: int = Field(default=0, ge=0, description="ray: OpenMP threads per engine (0 = its reserved CPUs).")
    num_cpus: int = Field(default=0, ge=0, description="ray: CPUs Ray may use when it starts the cluster (0 = all).")
    address: str = Field(default="", description="ray: address of a running cluster to join ('' = start one here).")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK",
        description="ray: the placement group's strategy across nodes: PACK fills one node first, SPREAD spreads "
        "the bundles (learner, each engine), STRICT_* require it.",
    )
    learner_resources: dict[str, float] = Field(
        default_factory=dict,
        description="ray: extra Ray resources in the learner's bundle, e.g. {learner_node: 1} pins the learner "
        "(all its ranks) to the nodes started with that custom resource (`ray start --resources`).",
    )
    engine_resources: dict[str, float] = Field(
        default_factory=dict,
        description="ray: extra Ray resources in each engine's bundle, e.g. {engine_node: 1} per engine "
        "(see learner_resources).",
    )
    placement_timeout_s: float = Field(
        default=60.0, gt=0, description="ray: deadline for the placement group to be placed."
    )
    call_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="ray: deadline for any one call into a role (a step's "
        "generate, update, ...); a miss names the role.",
    )
    on_engine_failure: Literal["restart", "stop", "fail"] = Field(
        default="restart",
        description="ray: when an engine actor dies, start a new one, re-sync weights and retry, or stop "
        "(`fail`, the old spelling, is read as stop). The teacher's own actor (teacher.engine=actor or vllm) "
        "too: a new one scores the batch again.",
    )
    max_engine_restarts: int = Field(
        default=3,
        ge=0,
        description="ray: engine restarts allowed per run before giving up; the teacher's own actor has as many, "
        "counted apart (placement/teacher_restarts).",
    )
    on_learner_failure: Literal["restart", "stop"] = Field(
        default="restart",
        description="ray: when the learner (or one of its ranks) dies or misses placement.call_timeout_s, start "
        "the whole learner group again, restore it from the newest intact checkpoint (model.path at step 0 if "
        "there is none), push that version to the engines and redo the steps after it; or stop. A learner call "
        "that raises is never restarted: a restart would meet the same error.",
    )
    max_learner_restarts: int = Field(
        default=2, ge=0, description="ray: learner restarts allowed per run before giving up."
    )
    learner_ranks: int = Field(
        default=1,
        ge=1,
        description="ray: learner ranks (W): one torch.distributed group whose ranks shard the policy, reference "
        "and critic with FSDP2 and split each step's groups (rollout.prompts_per_step and train.mini_batch "
        "must divide by W). 1 = one learner process.",
    )

    @model_validator(mode="after")
    def _one_spelling_of_stop(self) -> PlacementConfig:
        if self.on_engine_failure == "fail":  # the spelling before on_learner_failure had `stop`
            warn("placement.on_engine_failure=fail is now spelled stop (as placement.on_learner_failure): read as stop")
            self.on_engine_failure = "stop"
        return self

    @model_validator(mode="after")
    def _check_learner_ranks(self) -> PlacementConfig:
        if self.learner_ranks > 1 and self.mode != "ray":
            raise ValueError(
                f"placement.learner_ranks={self.learner_ranks} starts that many learner actors: it needs "
                "placement.mode=ray"
            )
        return self
