"""Environments for multi-turn rollouts: the protocol, `Step`, loading by spec, built-ins, and their workers."""

from relayrl.envs.base import Environment, Step, load_env_class, make_env

__all__ = ["Environment", "Step", "load_env_class", "make_env"]
