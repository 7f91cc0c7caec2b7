"""Rollout engines: the protocols, vLLM (the default) and HF generate (the fallback), a local engine as a group."""

from relayrl.rollout.base import Engine, EngineGroup, Sampling, build_engine, engine_from_config

__all__ = ["Engine", "EngineGroup", "Sampling", "build_engine", "engine_from_config"]
