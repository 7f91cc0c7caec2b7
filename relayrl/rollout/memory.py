"""Who takes how much of a GPU that holds a vLLM engine: `rollout.gpu_memory_utilization: auto` resolved, and the
shares of the roles that load onto one GPU (the rollout engine, a judge's engine) added up before either loads.

vLLM takes `gpu_memory_utilization` x the GPU's memory for its weights and KV cache, and refuses to start when less
is free ("Free memory ... less than desired GPU memory utilization"). relayrl decides the shares first:
- an engine alone on its GPU (disaggregated) takes `ALONE` (0.9, vLLM's own default: the rest is CUDA's context and
  the allocator's slack);
- an engine beside a learner rank (`placement.mode=local`, `placement.layout=colocated`) takes `COLOCATED`, the share
  `relayrl plan` bills it: the learner's states must fit in the rest (the plan checks they do);
- a judge reward (`reward.fn=judge`) in the driver's process shares the engine's GPU under `placement.mode=local`: it
  takes its own `reward.kwargs.gpu_memory_utilization` (default `JUDGE`) and the engine's auto share gives it up.
Every GPU engine claims its share in this process's ledger (`claim`) before vLLM starts; a claim that would bring
one GPU past 1, or past what the GPU has free, is refused naming both roles and the numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config.placement import PlacementConfig
    from relayrl.config.reward import RewardConfig
    from relayrl.config.rollout import RolloutConfig

log = logging.getLogger(__name__)
ALONE = 0.9
COLOCATED = 0.5
JUDGE = 0.3
ROLLOUT = "the rollout engine (rollout.gpu_memory_utilization)"
JUDGE_ROLE = "the judge reward's engine (reward.kwargs.gpu_memory_utilization)"
REWARD_MODEL_ROLE = "the reward model (reward.kwargs.device)"


def judge_share(placement: PlacementConfig, reward: RewardConfig) -> float | None:
    """The share a judge reward's engine takes of the rollout engine's GPU, or None where none shares it (no judge,
    or a placement whose rewards run apart from the engine's process)."""
    if placement.mode != "local":
        return None
    judges = [c for c in reward.resolved_components() if c.fn == "judge"]
    return sum(float(c.kwargs.get("gpu_memory_utilization", JUDGE)) for c in judges) if judges else None


def resolve_engine_share(colocated: bool, judge: float | None) -> tuple[float, str]:
    """`rollout.gpu_memory_utilization: auto` -> (the share, why), for `Config.choose` to record and the dump to show."""
    base, why = (COLOCATED, "beside a learner rank: the share relayrl plan bills") if colocated else (ALONE, "alone")
    if judge is None:
        return base, f"the engine's GPU {why}"
    share = round(min(base, ALONE - judge), 4)
    if share <= 0:
        raise ConfigError(
            f"reward.kwargs.gpu_memory_utilization={judge:g} leaves the rollout engine nothing of its GPU "
            f"({ALONE:g} in all for the engines): lower the judge's share"
        )
    return share, f"the engine's GPU {why}, less the judge reward's {judge:g} on the same GPU"


def check_shares(engine: float | str, judge: float | None) -> None:
    """An engine's and a judge's shares of one GPU (placement.mode=local) must add up to at most 1."""
    if judge is not None and engine != "auto" and float(engine) + judge > 1:
        raise ConfigError(
            f"rollout.gpu_memory_utilization={float(engine):g} and the judge reward's "
            f"reward.kwargs.gpu_memory_utilization={judge:g} share one GPU under placement.mode=local and add up to "
            f"{float(engine) + judge:g} > 1: lower one (rollout.gpu_memory_utilization: auto leaves the judge its share)"
        )


def engine_share(rollout: RolloutConfig, placement: PlacementConfig, reward: RewardConfig) -> float:
    """The rollout engine's share as the config gives it: a number, or what `auto` resolves to for it."""
    if rollout.gpu_memory_utilization != "auto":
        return float(rollout.gpu_memory_utilization)
    return resolve_engine_share(colocated(placement), judge_share(placement, reward))[0]


def colocated(placement: PlacementConfig) -> bool:
    """Whether the engine shares its GPU with a learner rank."""
    return placement.mode == "local" or placement.layout == "colocated"


def chosen_share(value: float | str) -> float:
    """The engine's share once the config is resolved (relayrl/build.py `resolve` chooses `auto`)."""
    if value == "auto":
        raise ConfigError("rollout.gpu_memory_utilization is still auto where the engine is built: resolve the config")
    return float(value)


@dataclass
class GpuLedger:
    """The shares of the GPUs claimed by engines in this process, by device index and role."""

    shares: dict[int, dict[str, float]] = field(default_factory=dict)

    def claim(self, device: int, role: str, share: float, free_bytes: int | None = None, total_bytes: int = 0):
        """Record `role`'s share of GPU `device`; refuse one that, with the others', passes 1 or the memory free."""
        held = {r: s for r, s in self.shares.get(device, {}).items() if r != role}
        if held and sum(held.values()) + share > 1:
            raise ConfigError(_refusal(device, role, share, held, "add up past 1"))
        if free_bytes is not None and share * total_bytes > free_bytes:
            taken = {"what else holds it (a learner, another process)": round(1 - free_bytes / total_bytes, 3)}
            need, free = share * total_bytes / 2**30, free_bytes / 2**30
            what = f"do not fit: {need:.1f} GiB asked, {free:.1f} GiB free"
            raise ConfigError(_refusal(device, role, share, {**held, **taken}, what))
        self.shares.setdefault(device, {})[role] = share


def _refusal(device: int, role: str, share: float, held: dict[str, float], what: str) -> str:
    holders = " and ".join(f"{r} at {s:g}" for r, s in held.items())
    return (
        f"GPU {device}: {role} asks for {share:g} of its memory, beside {holders}: the shares {what}. Give the two "
        f"shares that add up to at most 1 (rollout.gpu_memory_utilization: auto leaves a judge its share under "
        f"placement.mode=local), or run the judge on another GPU"
    )


LEDGER = GpuLedger()


def claim_gpu(role: str, share: float) -> None:
    """Claim `share` of this process's current GPU for `role` before vLLM starts (a no-op without one)."""
    import torch

    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(device)
    LEDGER.claim(device, role, share, free, total)
    log.info("GPU %d: %s takes %g of its %.1f GiB", device, role, share, total / 2**30)


def claim_bytes(role: str, device: str, nbytes: int) -> None:
    """Claim what a model of `nbytes` takes of GPU `device` (a reward model moved there), as an engine claims its
    share: refused beside engines whose shares leave too little, or past what the GPU has free (a no-op off GPU)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    free, total = torch.cuda.mem_get_info(index)
    LEDGER.claim(index, role, round(nbytes / total, 4), free, total)
