"""The one step that turns a validated config's `auto` choices into what the run uses, each decided by the package
that owns it, in this order:

1. `rollout.engine: auto` -> vllm or hf (relayrl/rollout/choice.py), with the reason the dump prints;
2. `rollout.tensor_parallel` > 1: vLLM ranks, their heads and devices (relayrl/rollout/vllm_tp.py), after the
   engine is known;
3. `sync.lora: auto` -> adapter or merged (relayrl/sync/lora.py), after the engine is known;
4. `rollout.sleep: auto` and `learner.offload: auto` -> colocated time-sharing on or off (relayrl/rollout/sleep.py);
5. `sync.wire_dtype: auto` -> bf16 or fp32, the engine's dtype (relayrl/sync/buckets.py).

This is the one place the config package reaches into runtime packages, and it does so lazily: validating a tree
(`Config.model_validate`) imports none of them (docs/architecture.md states the rule a test checks). Resolving
twice changes nothing; a dump writes `auto` back (so a reload chooses again, on its own machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config.root import Config


def resolve(config: Config) -> Config:
    """Make the config's `auto` choices in place (once) and return it; a choice that cannot hold is a ConfigError."""
    if config._resolved:
        return config
    try:
        if config.rollout.engine == "auto":
            from relayrl.rollout.choice import resolve_auto

            resolve_auto(config)
        if config.rollout.tensor_parallel > 1:
            from relayrl.rollout.vllm_tp import check_tensor_parallel

            check_tensor_parallel(config)
        if config.model.lora is not None and config.sync.lora == "auto":
            from relayrl.sync.lora import resolve_lora_auto

            resolve_lora_auto(config)
        from relayrl.rollout.sleep import resolve_sleep  # after sync.lora: an adapter push keeps level 1

        resolve_sleep(config)
        if config.sync.wire_dtype == "auto":
            from relayrl.sync.buckets import resolve_wire_dtype

            resolve_wire_dtype(config)
    except ValueError as err:  # a rule's own message, as validation would have given it
        raise ConfigError(f"invalid config:\n  {err}") from None
    config._resolved = True
    return config
