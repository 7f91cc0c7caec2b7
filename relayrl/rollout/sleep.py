"""`rollout.sleep: auto` and the `learner.offload: auto` that follows it, resolved once before a run is built
(`relayrl.build.resolve`), and an offload as set checked against this machine.

Colocated time-sharing (relayrl/placement/time_sharing.py) frees the engine's memory while the learner trains and
the learner's while the engine generates. It is on by default where it can help and work: a colocated run (in one
process, or `placement.layout=colocated`) on a GPU under `train.schedule=sync`. Level 2 drops the engine's weights
(the next push brings new ones anyway); level 1 keeps them in CPU memory, which a LoRA run that pushes adapters only
(`sync.lora=adapter`) needs for its base. Elsewhere it is off, and the reason is noted beside `auto` in the dump:
vLLM's CPU platform has no sleep mode; an overlapped schedule generates while it trains. Whether there is a GPU is
this process's view (a driver without one, in front of a GPU cluster, gets `off`: set `rollout.sleep` to 1 or 2).
An offload the user set is refused where it cannot take effect (`check_offload`): `optimizer` (FSDP2 has no such
policy), a machine without CUDA, `params` on one learner rank, `between_phases` on sharded ranks.
"""

from __future__ import annotations

from collections.abc import Callable

from relayrl.errors import ConfigError


def resolve_sleep(config, cuda: Callable[[], bool] | None = None) -> None:
    """Replace `rollout.sleep: auto` (and `learner.offload: auto`) by what the run uses; refuse a level or an
    offload that cannot take effect, naming the key."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available
    colocated = config.placement.mode == "local" or config.placement.layout == "colocated"
    sleep = config.rollout.sleep
    if sleep == "auto":
        level, reason = auto_level(config, colocated, cuda())
        config.choose("rollout.sleep", level, reason)
    elif sleep != "off":
        _check_level(config, sleep, colocated, cuda())
    if config.learner.offload == "auto":
        on = config.rollout.sleep != "off" and config.placement.learner_ranks == 1
        why = "the engine sleeps between phases (rollout.sleep)" if on else "rollout.sleep is off"
        if config.rollout.sleep != "off" and not on:
            why = "sharded ranks move their shards with learner.offload=params instead"
        config.choose("learner.offload", "between_phases" if on else "none", why)
    else:
        check_offload(config, cuda)


def check_offload(config, cuda: Callable[[], bool]) -> None:
    """Refuse a `learner.offload` that cannot take effect: `optimizer`, a run without CUDA, or one learner rank."""
    offload = config.learner.offload
    if offload in ("none", "auto"):  # auto: resolved to none or between_phases with rollout.sleep
        return
    if offload == "optimizer":
        raise ConfigError(
            "learner.offload=optimizer is not available: FSDP2 has no optimizer-only offload; its CPUOffloadPolicy "
            "(learner.offload=params) moves parameters, gradients and the optimizer state to CPU together"
        )
    if not cuda():
        moves = "FSDP2 shards" if offload == "params" else "the learner's states"
        raise ConfigError(
            f"learner.offload={offload} needs a CUDA device (it moves {moves} off the GPU); this machine has "
            "none, and on CPU the states already live in CPU memory: use learner.offload=none"
        )
    ranks = config.placement.learner_ranks
    if offload == "params" and ranks < 2:
        raise ConfigError(
            f"learner.offload={offload} needs FSDP2 learner ranks (placement.mode=ray, placement.learner_ranks >= 2); "
            f"placement.learner_ranks={ranks} runs the unsharded learner, which has no offload"
        )
    if offload == "between_phases" and ranks > 1:
        raise ConfigError(
            f"learner.offload=between_phases moves a whole learner off its GPU; placement.learner_ranks={ranks} "
            "shards it: use learner.offload=params (FSDP2 keeps the shards in CPU memory)"
        )


def time_sharing_on(config, gpu: bool) -> tuple[bool, bool]:
    """(the engine sleeps between phases, the learner's states leave the device while it generates) for `config` on
    a machine with or without a GPU: the settings as set, or `auto` as it would resolve there (the planner asks
    this for its target hardware, whatever this machine has)."""
    colocated = config.placement.mode == "local" or config.placement.layout == "colocated"
    asked = "auto" if "rollout.sleep" in config._auto else config.rollout.sleep
    sleeps = auto_level(config, colocated, gpu)[0] != "off" if asked == "auto" else asked != "off"
    offload = config.learner.offload
    if "learner.offload" in config._auto or offload == "auto":
        return sleeps, sleeps and config.placement.learner_ranks == 1
    return sleeps, offload == "between_phases"


def auto_level(config, colocated: bool, gpu: bool) -> tuple[int | str, str]:
    if not gpu:
        return "off", "no GPU here (vLLM's CPU platform has no sleep mode)"
    if not colocated:
        return "off", "placement.layout=disaggregated: the engines have devices of their own"
    if config.train.schedule != "sync":
        return "off", f"train.schedule={config.train.schedule} generates while it trains"
    if config.model.lora is not None and config.sync.lora == "adapter":
        return 1, "colocated on a GPU; level 1 keeps the base weights (sync.lora=adapter pushes adapters only)"
    return 2, "colocated on a GPU: the engine's weights are dropped while the learner trains, the push reloads them"


def _check_level(config, level: int, colocated: bool, gpu: bool) -> None:
    if not gpu:
        raise ConfigError(
            f"rollout.sleep={level} needs a GPU: vLLM's CPU platform has no sleep mode (use rollout.sleep=auto or off)"
        )
    if config.train.schedule != "sync":
        raise ConfigError(
            f"rollout.sleep={level} frees the engine between phases, but train.schedule={config.train.schedule} "
            "generates while it trains: use train.schedule=sync or rollout.sleep=off"
        )
    if not colocated:
        raise ConfigError(
            f"rollout.sleep={level} time-shares a device, but placement.layout=disaggregated gives the engines "
            "devices of their own: use placement.layout=colocated or rollout.sleep=off"
        )
