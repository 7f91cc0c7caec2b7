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
policy), a machine without CUDA, `params` on one learner rank. `auto` offloads one learner between phases; sharded
ranks keep their shards on the GPU unless `between_phases` (each rank moves its shards) or `params` is set: a
rank's share is 1/W of the states, and the move costs host traffic every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relayrl.errors import ConfigError


@dataclass(frozen=True)
class Colocation:
    """What deciding colocated time-sharing reads, across sections (assembled by relayrl/placement/sections.py)."""

    sleep: int | str  # rollout.sleep
    offload: str  # learner.offload
    colocated: bool  # placement.mode=local, or placement.layout=colocated
    learner_ranks: int  # placement.learner_ranks
    schedule: str  # train.schedule
    adapter_push: bool  # model.lora with sync.lora=adapter: the base stays on the engine


def resolve_sleep(c: Colocation, cuda: Callable[[], bool] | None = None) -> dict[str, tuple[int | str, str]]:
    """The choices for `rollout.sleep: auto` (and `learner.offload: auto`), {key: (what the run uses, why)}, for the
    builder to record; refuse a level or an offload that cannot take effect, naming the key."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available
    chosen: dict[str, tuple[int | str, str]] = {}
    sleep = c.sleep
    if sleep == "auto":
        chosen["rollout.sleep"] = auto_level(c, cuda())
        sleep = chosen["rollout.sleep"][0]
    elif sleep != "off":
        _check_level(c, sleep, cuda())
    if c.offload == "auto":
        on = sleep != "off" and c.learner_ranks == 1
        why = "the engine sleeps between phases (rollout.sleep)" if on else "rollout.sleep is off"
        if sleep != "off" and not on:
            why = "sharded ranks keep their 1/W share on the GPU (set between_phases to move it)"
        chosen["learner.offload"] = ("between_phases" if on else "none", why)
    else:
        check_offload(c.offload, c.learner_ranks, cuda)
    return chosen


def check_offload(offload: str, ranks: int, cuda: Callable[[], bool]) -> None:
    """Refuse a `learner.offload` that cannot take effect: `optimizer`, a run without CUDA, or one learner rank
    (`ranks`: placement.learner_ranks)."""
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
    if offload == "params" and ranks < 2:
        raise ConfigError(
            f"learner.offload={offload} needs FSDP2 learner ranks (placement.mode=ray, placement.learner_ranks >= 2); "
            f"placement.learner_ranks={ranks} runs the unsharded learner, which has no offload"
        )


def time_sharing_on(c: Colocation, gpu: bool) -> tuple[bool, bool]:
    """(the engine sleeps between phases, the learner's states leave the device while it generates) for the settings
    as asked (`auto` where auto chose) on a machine with or without a GPU: the settings as set, or `auto` as it would
    resolve there (the planner asks this for its target hardware, whatever this machine has)."""
    sleeps = auto_level(c, gpu)[0] != "off" if c.sleep == "auto" else c.sleep != "off"
    if c.offload == "auto":
        return sleeps, sleeps and c.learner_ranks == 1
    return sleeps, c.offload == "between_phases"


def auto_level(c: Colocation, gpu: bool) -> tuple[int | str, str]:
    if not gpu:
        return "off", "no GPU here (vLLM's CPU platform has no sleep mode)"
    if not c.colocated:
        return "off", "placement.layout=disaggregated: the engines have devices of their own"
    if c.schedule != "sync":
        return "off", f"train.schedule={c.schedule} generates while it trains"
    if c.adapter_push:
        return 1, "colocated on a GPU; level 1 keeps the base weights (sync.lora=adapter pushes adapters only)"
    return 2, "colocated on a GPU: the engine's weights are dropped while the learner trains, the push reloads them"


def _check_level(c: Colocation, level: int | str, gpu: bool) -> None:
    if not gpu:
        raise ConfigError(
            f"rollout.sleep={level} needs a GPU: vLLM's CPU platform has no sleep mode (use rollout.sleep=auto or off)"
        )
    if c.schedule != "sync":
        raise ConfigError(
            f"rollout.sleep={level} frees the engine between phases, but train.schedule={c.schedule} "
            "generates while it trains: use train.schedule=sync or rollout.sleep=off"
        )
    if not c.colocated:
        raise ConfigError(
            f"rollout.sleep={level} time-shares a device, but placement.layout=disaggregated gives the engines "
            "devices of their own: use placement.layout=colocated or rollout.sleep=off"
        )
