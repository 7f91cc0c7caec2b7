"""Settings that cannot take effect in the chosen mode: each is warned about by name when a config is loaded
(`max_staleness` under `sync`, a KL estimator at coefficient 0, sync keys the transport does not read, ...), or,
for a setting that an `auto` choice leaves without effect, once the choices are made (`warn_chosen`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.config.model import warn_lora
from relayrl.config.sync import SYNC_KEYS, effective_transport
from relayrl.config.teacher import warn_teacher
from relayrl.config.warn import warn

if TYPE_CHECKING:
    from relayrl.config.root import Config


def warn_ineffective(config: Config) -> None:
    """Name settings that cannot take effect in the chosen mode (a `ConfigWarning` each)."""
    _warn_algorithm(config)
    warn_lora(config)  # relayrl/config/model.py: a LoRA run at a full fine-tuning learning rate
    warn_teacher(
        config.teacher, config.algorithm.distill
    )  # relayrl/config/teacher.py: distillation settings without a teacher
    train = config.train
    if train.schedule != "async" and train.model_fields_set & {"max_staleness", "on_stale"}:
        names = ", ".join(f"train.{k}" for k in sorted(train.model_fields_set & {"max_staleness", "on_stale"}))
        warn(f"{names} has no effect under train.schedule={train.schedule}")
    if train.schedule != "sync" and config.checkpoint.every:
        warn(
            f"checkpoints under train.schedule={train.schedule} lose no prompt, but the rollouts in flight or "
            "buffered at one are drawn again and generated with the checkpoint's weights: a resumed run is not a "
            "replay of an uninterrupted one"
        )
    off_policy = train.schedule == "one_step_off" or (train.schedule == "async" and train.max_staleness > 0)
    if off_policy and config.algorithm.correction.mode == "none":
        warn(
            f"train.schedule={train.schedule} trains on samples from older policies without correction; "
            "consider algorithm.correction.mode=tis_token"
        )
    placement = config.placement
    if placement.mode == "local" and placement.model_fields_set - {"mode"}:
        names = ", ".join(f"placement.{k}" for k in sorted(placement.model_fields_set - {"mode"}))
        warn(f"{names} has no effect under placement.mode=local")
    transport = effective_transport(config)
    if idle := sorted(config.sync.model_fields_set - SYNC_KEYS[transport]):
        names = ", ".join(f"sync.{k}" for k in idle)
        warn(f"{names} has no effect with the {transport} transport")


def _warn_algorithm(config: Config) -> None:
    algo = config.algorithm
    if algo.kl.coef == 0 and "estimator" in algo.kl.model_fields_set:
        warn("algorithm.kl.estimator has no effect while algorithm.kl.coef is 0")
    if config.rollout.engine == "hf" and "kv_cache_gib" in config.rollout.model_fields_set:
        warn("rollout.kv_cache_gib has no effect with rollout.engine=hf")
    if algo.kl.coef == 0 and algo.kl.model_fields_set - {"coef", "estimator"}:
        names = ", ".join(f"algorithm.kl.{k}" for k in sorted(algo.kl.model_fields_set - {"coef", "estimator"}))
        warn(f"{names} has no effect while algorithm.kl.coef is 0")
    if algo.correction.mode == "none" and algo.correction.model_fields_set - {"mode"}:
        warn("algorithm.correction settings have no effect while algorithm.correction.mode is none")
    if not algo.dapo.dynamic_sampling and "max_rounds" in algo.dapo.model_fields_set:
        warn("algorithm.dapo.max_rounds has no effect without algorithm.dapo.dynamic_sampling")
    if algo.advantage != "gae" and config.critic.model_fields_set:
        warn(
            f"critic.{', critic.'.join(sorted(config.critic.model_fields_set))} has no effect: a critic "
            "is built only for algorithm.advantage=gae"
        )
    if algo.policy_loss == "ppo_clip" and algo.clip_eps < 0.01:
        warn(f"algorithm.clip_eps={algo.clip_eps} is a GSPO-sized range; ppo_clip usually uses ~0.2")
    if config.data.eval is None and config.eval.model_fields_set:
        warn(f"eval.{', eval.'.join(sorted(config.eval.model_fields_set))} has no effect without data.eval")


def warn_chosen(config: Config) -> None:
    """Name settings that an `auto` choice left without effect (run once the choices are made: relayrl/build.py)."""
    chose_hf = config._engine_choice is not None and config.rollout.engine == "hf"
    if chose_hf and "kv_cache_gib" in config.rollout.model_fields_set:
        warn("rollout.kv_cache_gib has no effect with rollout.engine=hf (auto's choice)")
