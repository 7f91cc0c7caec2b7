"""Rollout engines: the protocols, vLLM and HF generate, a local engine as a group.

The names below load on first use (PEP 562), so `relayrl.rollout.choice`, which every config validation
reads, does not import torch: `relayrl plan` and `relayrl config` stay light."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Engine", "EngineGroup", "Sampling", "build_engine", "engine_from_config"]

if TYPE_CHECKING:
    from relayrl.rollout.base import Engine, EngineGroup, Sampling, build_engine, engine_from_config


def __getattr__(name: str):
    if name in __all__:
        from relayrl.rollout import base

        return getattr(base, name)
    raise AttributeError(f"module 'relayrl.rollout' has no attribute {name!r}")
