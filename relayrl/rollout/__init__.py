"""Rollout engines: the protocol, vLLM (the default) and HF generate (the fallback)."""

from relayrl.rollout.base import RolloutEngine, Sampling, build_engine, engine_from_config

__all__ = ["RolloutEngine", "Sampling", "build_engine", "engine_from_config"]
