"""Rollout engines: the protocols, vLLM and HF generate, tensor-parallel vLLM ranks, a local engine as a group,
and how a run builds its engine. Rollout *sources* (what the schedules draw batches from) are relayrl/sources/.

The names below load on first use (PEP 562), so `relayrl.rollout.choice`, which resolving a config reads, does
not import torch: `relayrl plan` and `relayrl config` stay light."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Engine", "EngineGroup", "build_engine", "engine_from_settings"]

if TYPE_CHECKING:
    from relayrl.rollout.build import build_engine, engine_from_settings
    from relayrl.rollout.protocols import Engine, EngineGroup


def __getattr__(name: str):
    if name in ("Engine", "EngineGroup"):
        from relayrl.rollout import protocols

        return getattr(protocols, name)
    if name in ("build_engine", "engine_from_settings"):
        from relayrl.rollout import build

        return getattr(build, name)
    raise AttributeError(f"module 'relayrl.rollout' has no attribute {name!r}")
