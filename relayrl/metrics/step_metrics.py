"""One training step's metrics row, assembled from what each phase reported: the learner's update statistics,
the batch (rewards, lengths, what collecting it measured), the sync's last push, the engines' own metrics
and the step's timer; plus what is derived from them: staleness, engine/trainer mismatch by version,
throughput and the learner's padding.

The training loop (relayrl/controller.py) calls `step_metrics` once per step; nothing here runs a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.advantages import degenerate_group_fraction
from relayrl.algorithms.distill import distill_metrics
from relayrl.learner.policy import mismatch_metrics

if TYPE_CHECKING:
    from relayrl.learner.result import UpdateResult
    from relayrl.metrics.timer import StepTimer
    from relayrl.sources.base import Batch
    from relayrl.types import Experience, Rollout


def step_metrics(
    updates_per_step: int,
    epochs: int,
    trained_version: int,
    batch: Batch,
    exp: Experience,
    update: UpdateResult,
    timer: StepTimer,
    sync_metrics: dict[str, float],
    role_metrics: dict[str, float],
) -> dict[str, float]:
    """The row for metrics.jsonl and the trackers. `updates_per_step`, `epochs`: the run's optimizer steps per
    step and passes over each batch (`Config.updates_per_step`, `train.epochs`). `trained_version`: the policy version the update started
    from; `timer` is read now, so call this once the step's phases (the push included) are done."""
    stats = {**update.metrics, **mismatch_metrics(update.mismatch, trained_version)}
    metrics = {**stats, **rollout_metrics(exp, batch.rollouts), **batch.metrics, **sync_metrics, **timer.metrics()}
    lags = staleness_metrics(exp, trained_version)
    if lags and "stale/mean" in metrics:  # the learner counted optimizer steps within this step's update
        metrics["stale/mean"] += lags["stale/version_mean"] * updates_per_step
        metrics["stale/max"] += lags["stale/version_max"] * updates_per_step
    metrics.update(lags)
    metrics.update(distill_metrics(exp.old_logprobs, exp.teacher_logprobs, exp.loss_mask))  # teacher.path: distill/*
    metrics.update(role_metrics)  # placement/*: restarts of engines and learner, engine start time
    tokens = float(exp.loss_mask.sum())
    if "time/generate" in metrics:
        metrics["throughput/rollout_tokens_per_s"] = tokens / metrics["time/generate"]
    metrics["throughput/update_tokens_per_s"] = tokens * epochs / metrics["time/update"]
    metrics["throughput/samples_per_s"] = len(batch.rollouts) / metrics["time/step"]
    if "learner/positions" not in metrics:  # a learner that does not count: one padded row per sample
        positions = float(exp.attention_mask.numel())
        metrics["learner/positions"] = positions
        metrics["learner/padding_frac"] = 1.0 - float(exp.attention_mask.sum()) / positions
    return metrics


def staleness_metrics(exp: Experience, trained_version: int) -> dict[str, float]:
    """How many policy versions each trained token lags the policy it updates: `stale/version_{mean,max}`
    and a histogram `stale/hist/<k>` (token fractions). The step adds lag x updates-per-step to the
    learner's `stale/{mean,max}` (optimizer steps)."""
    mask = exp.loss_mask.bool()
    if not mask.any():
        return {}
    lag = (trained_version - exp.versions[mask]).clamp(min=0)
    out = {"stale/version_mean": float(lag.float().mean()), "stale/version_max": float(lag.max())}
    counts = torch.bincount(lag.long())
    out.update({f"stale/hist/{k}": float(c) / lag.numel() for k, c in enumerate(counts.tolist()) if c})
    return out


def rollout_metrics(exp: Experience, rollouts: list[Rollout]) -> dict[str, float]:
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float32)
    rewards = exp.rewards if exp.forks is None else exp.rewards[~exp.forks]  # one per trajectory, not per fork
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/degenerate_group_frac": degenerate_group_fraction(exp.rewards, exp.group_ids),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }
