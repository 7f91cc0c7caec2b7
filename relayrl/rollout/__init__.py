"""Rollout engines: the protocol, vLLM (the default) and HF generate (the fallback)."""

from relayrl.rollout.base import RolloutEngine, Sampling, build_engine

__all__ = ["RolloutEngine", "Sampling", "build_engine"]
