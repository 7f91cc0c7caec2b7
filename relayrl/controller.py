"""The synchronous training loop: generate -> reward -> log-probs -> advantages -> update -> sync.

The controller owns the order of the phases and nothing else: algorithms are pure functions, the engine,
learner and sync are built once in `build_trainer` and the step reads the same whatever they are.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from relayrl.algorithms.advantages import ADVANTAGES, AdvantageInputs, degenerate_group_fraction, make_inputs
from relayrl.algorithms.dapo import GroupCollector, overlong_mask, soft_overlong_penalty
from relayrl.checkpoint import checkpoint_root, latest_checkpoint
from relayrl.config import Config, dump_config
from relayrl.data.source import PromptSampler, load_prompts, show_first_prompt
from relayrl.errors import ConfigError
from relayrl.evaluate import evaluate
from relayrl.learner.batching import make_experience
from relayrl.learner.policy import MISMATCH_BY_VERSION, mismatch_metrics
from relayrl.learner.role import LearnerRole
from relayrl.metrics.samples import log_samples
from relayrl.metrics.timeline import Timeline
from relayrl.metrics.timer import StepTimer
from relayrl.metrics.trackers import build_trackers
from relayrl.models.loading import check_model_dir, context_length, load_tokenizer, pad_token_id
from relayrl.preemption import Interrupted, StopSignals
from relayrl.rewards import load_reward
from relayrl.rewards.service import RewardService, add_counts, build_reward_service
from relayrl.rollout import RolloutEngine, Sampling
from relayrl.run_dir import claim
from relayrl.schedules.overlap import SCHEDULES
from relayrl.sync.inprocess import InProcessSync
from relayrl.types import Prompt, Rollout, Score


@dataclass
class Trainer:
    config: Config
    engine: RolloutEngine  # a local engine, or an EngineGroup of Ray actors
    learner: LearnerRole  # or a RemoteRole with the same methods
    sync: InProcessSync  # or a RaySync
    rewards: RewardService
    sampler: PromptSampler
    eval_prompts: list[Prompt]
    tokenizer: object  # a transformers tokenizer
    run_dir: Path
    data_metrics: dict
    advantage_fn: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]]
    pad_id: int
    close: Callable[[], None] = lambda: None  # release actors and shared memory
    timeline: Timeline | None = None
    schedule: object = None  # where rollouts come from: relayrl/schedules/overlap.py
    signals: StopSignals = field(default_factory=StopSignals)  # SIGTERM/SIGINT: stop after the current step

    def step(self, step: int) -> dict[str, float]:
        cfg, timer = self.config, StepTimer(self.timeline, step)
        rollouts, scores, collect_metrics = self.schedule.batch(step, timer)
        with timer("logprobs"):
            exp = self.learner.prepare(make_experience(rollouts, scores, self.pad_id))
        with timer("advantage"):
            inputs = make_inputs(exp.rewards, exp.loss_mask, exp.group_ids, exp.values)
            penalty = self.learner.reward_penalty(exp) if cfg.algorithm.kl.placement == "reward" else None
            if penalty is not None:
                inputs.token_rewards = inputs.token_rewards + penalty
            exp.advantages, exp.returns = self.advantage_fn(inputs)
            if cfg.algorithm.dapo.overlong_filter:  # truncated responses count in their group, train nothing
                exp.loss_mask = exp.loss_mask * overlong_mask(rollouts)[:, None]
        with timer("update"):
            stats = self.learner.update(step, exp)
        stats.update(mismatch_metrics(stats.pop(MISMATCH_BY_VERSION, {}), self.sync.version))  # the trained version
        with timer("sync"):
            self.sync.push(self.learner, self.engine)
        self.schedule.published(self.sync.version)
        metrics = {**stats, **rollout_metrics(exp, rollouts), **collect_metrics, **self.sync.last, **timer.metrics()}
        lags = staleness_metrics(exp, self.sync.version - 1)
        if lags and "stale/mean" in metrics:  # the learner counted optimizer steps within this step's update
            metrics["stale/mean"] += lags["stale/version_mean"] * self.learner_updates_per_step
            metrics["stale/max"] += lags["stale/version_max"] * self.learner_updates_per_step
        metrics.update(lags)
        if hasattr(self.engine, "metrics"):
            metrics.update(self.engine.metrics())
        self._record_engine_spans(step)
        tokens = float(exp.loss_mask.sum())
        if "time/generate" in metrics:
            metrics["throughput/rollout_tokens_per_s"] = tokens / metrics["time/generate"]
        metrics["throughput/update_tokens_per_s"] = tokens * cfg.train.epochs / metrics["time/update"]
        metrics["throughput/samples_per_s"] = len(rollouts) / metrics["time/step"]
        if "learner/positions" not in metrics:  # a learner that does not count: one padded row per sample
            positions = float(exp.attention_mask.numel())
            metrics["learner/positions"] = positions
            metrics["learner/padding_frac"] = 1.0 - float(exp.attention_mask.sum()) / positions
        log_samples(
            self.run_dir,
            cfg.log.samples.every,
            cfg.log.samples.max_per_step,
            step,
            cfg.train.steps - 1,
            rollouts,
            scores,
            exp,
        )
        return metrics

    @property
    def learner_updates_per_step(self) -> int:
        return self.config.updates_per_step

    def _record_engine_spans(self, step: int) -> None:
        if self.timeline is not None:
            for replica, start, end in getattr(self.engine, "take_spans", lambda: [])():
                self.timeline.add(step, f"engine {replica}", "generate", start, end)
            self.timeline.flush()

    def collect(self, step: int, timer: StepTimer) -> tuple[list, list, dict[str, float]]:
        """Generate and score one batch; with DAPO dynamic sampling, keep only groups with a reward signal and
        generate more (up to dapo.max_rounds) until prompts_per_step groups are collected."""
        dapo, n_prompts = self.config.algorithm.dapo, self.config.rollout.prompts_per_step
        collector = GroupCollector(n_prompts, dapo.max_rounds) if dapo.dynamic_sampling else None
        metrics: dict[str, float] = {}
        for round_index in range(dapo.max_rounds if collector else 1):
            prompts = self.sampler.next(n_prompts)
            with timer("generate"):
                rollouts = self.engine.generate(prompts, self.sampling(step, round_index), self.sync.version)
            with timer("reward"):
                rollouts, scores, round_metrics = self.score(rollouts)
            metrics = add_counts(metrics, round_metrics)
            if collector is None:
                break
            collector.add(rollouts, scores)
            if collector.full:
                break
        if collector is not None:
            metrics.update(collector.metrics())
            kept = collector.take()
            rollouts, scores = kept if kept[0] else (rollouts, scores)  # nothing informative: a zero-signal step
        if dapo.overlong_buffer:
            lengths = [len(r.response_ids) for r in rollouts]
            penalty = soft_overlong_penalty(lengths, self.config.rollout.max_tokens, dapo.overlong_buffer)
            scores = [
                Score(s.reward + float(p), {**s.components, "overlong": float(p)}) for s, p in zip(scores, penalty)
            ]
        return rollouts, scores, metrics

    def score(self, rollouts: list[Rollout]) -> tuple[list[Rollout], list[Score], dict[str, float]]:
        """Score through the reward service; a group with a skipped sample (on_error=skip) is dropped whole,
        as group-relative advantages need every member."""
        scores, metrics = self.rewards.score(rollouts)
        skipped = {r.prompt.id for r, s in zip(rollouts, scores) if s is None}
        if skipped:
            kept = [(r, s) for r, s in zip(rollouts, scores) if r.prompt.id not in skipped]
            rollouts, scores = [r for r, _ in kept], [s for _, s in kept]
            metrics["reward/skipped_groups"] = float(len(skipped))
        return rollouts, scores, metrics

    def sampling(self, step: int, round_index: int = 0) -> Sampling:
        r = self.config.rollout
        seed = (self.config.train.seed * 100_003 + step) * 64 + round_index
        return Sampling(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=r.max_tokens,
            min_tokens=r.min_tokens,
            stop=tuple(r.stop),
            seed=seed,
        )

    def evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        r = self.config.rollout
        score = functools.partial(lambda rewards, rollouts: rewards.score(rollouts)[0], self.rewards)
        # the policy's length rules (max/min tokens, stop strings) hold at evaluation as in training
        greedy = evaluate(self.engine, self.eval_prompts, score, Sampling.greedy(r.max_tokens, r.stop, r.min_tokens))
        sampled = evaluate(
            self.engine,
            self.eval_prompts,
            score,
            Sampling(
                n=1,
                temperature=self.config.eval.temperature,
                max_tokens=r.max_tokens,
                min_tokens=r.min_tokens,
                stop=tuple(r.stop),
                seed=self.config.train.seed,
            ),
        )
        return {"eval/greedy": greedy, "eval/sampled": sampled}

    def run(self, start_step: int = 0, before: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
        cfg = self.config
        before = self.evaluate() if before is None else before
        with self.signals.during_steps():  # a signal from here on ends the current step first
            trackers = build_trackers(cfg, self.run_dir)
            self.schedule = SCHEDULES[cfg.train.schedule](self)  # async producers start generating here
            try:
                for step in range(start_step, cfg.train.steps):
                    metrics = self.step(step)
                    if step == 0:
                        metrics.update(self.data_metrics)
                    last = step == cfg.train.steps - 1
                    if not last and cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                        metrics.update(self.evaluate())
                    trackers.log(step, metrics)
                    saved = None
                    if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                        saved = self.checkpoint(step, before)
                    if self.signals.requested:  # preempted: this step is done and logged; save it and stop
                        raise Interrupted(
                            self.signals.requested, self.run_dir, step, saved or self.checkpoint(step, before)
                        )
            finally:
                self.schedule.close()
                trackers.close()
            after = self.evaluate()
            if cfg.log.save_model:
                self.learner.save(str(self.run_dir), self.tokenizer)
        result = {"before": before, "after": after}
        (self.run_dir / "eval.json").write_text(json.dumps(_eval_json(result), indent=2) + "\n")
        return result

    def checkpoint(self, step: int, before: dict[str, float]) -> str:
        return self.learner.checkpoint(
            str(self.run_dir), step, self.loop_state(step, before), self.config.checkpoint.keep
        )

    def loop_state(self, step: int, before: dict[str, float]) -> dict:
        """What the loop itself needs to continue exactly after `step` (the learner adds its own state)."""
        return {"step": step, "before": before, "version": self.sync.version, "sampler": self.sampler.state()}

    def load_state(self, checkpoint: Path, state: dict) -> int:
        """Restore a checkpoint into the built trainer (engines included); returns the step to start from."""
        self.learner.load_state(str(checkpoint), state)
        self.sampler.load_state(state["sampler"])
        self.sync.push(self.learner, self.engine, version=state["version"])
        return state["step"] + 1


def staleness_metrics(exp, trained_version: int) -> dict[str, float]:
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


def rollout_metrics(exp, rollouts) -> dict[str, float]:
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float32)
    return {
        "reward/mean": float(exp.rewards.mean()),
        "reward/std": float(exp.rewards.std()) if len(rollouts) > 1 else 0.0,
        "reward/degenerate_group_frac": degenerate_group_fraction(exp.rewards, exp.group_ids),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }


def _eval_json(result: dict) -> dict:
    return {when: {k.split("/")[-1]: v for k, v in values.items()} for when, values in result.items()}


def build_trainer(config: Config, resume_step: int | None = None, overwrite: bool = False) -> Trainer:
    """Construct every role once: in this process (`placement.mode=local`) or as Ray actors (`ray`).

    Model, data and reward are validated before anything is written: only then is `log.dir` claimed
    (relayrl/run_dir.py), so a mistaken command never touches a previous run."""
    check_model_dir(config.model.path)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    tokenizer = load_tokenizer(config.model.path)
    data = config.data
    prompts, long_stats = load_prompts(
        data.train, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template
    )
    show_first_prompt(prompts, long_stats, tokenizer)  # what the model is shown, before any time is spent
    data_metrics = {"data/prompts_dropped": long_stats.dropped, "data/prompts_truncated": long_stats.truncated}
    eval_prompts = []
    if data.eval:
        eval_prompts, eval_stats = load_prompts(
            data.eval, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template
        )
        eval_prompts = eval_prompts[: config.eval.max_prompts or None]
        data_metrics.update(
            {"data/eval_prompts_dropped": eval_stats.dropped, "data/eval_prompts_truncated": eval_stats.truncated}
        )
    max_len = max(len(p.token_ids) for p in prompts + eval_prompts) + config.rollout.max_tokens
    check_context(config, max_len)
    for component in config.reward.resolved_components():  # a bad reward spec fails here, not after the roles
        load_reward(component.fn, component.kwargs, component.style)
    run_dir = claim(config.log.dir, dump_config(config), resume_step, overwrite)
    probe_ids = (prompts[0].token_ids + prompts[-1].token_ids)[: max_len - 1] if config.sync.parity_probe else None
    engine, learner, sync, close = build_roles(config, max_len, probe_ids)
    rewards = build_reward_service(config.reward, on_ray=config.placement.mode == "ray")  # after Ray is up
    advantage_fn = functools.partial(ADVANTAGES[config.algorithm.advantage], **advantage_knobs(config))
    trainer = Trainer(
        config=config,
        engine=engine,
        learner=learner,
        sync=sync,
        rewards=rewards,
        sampler=PromptSampler(prompts, config.train.seed, data.shuffle),
        eval_prompts=eval_prompts,
        tokenizer=tokenizer,
        run_dir=run_dir,
        data_metrics=data_metrics,
        advantage_fn=advantage_fn,
        pad_id=pad_token_id(tokenizer),
        close=lambda: (rewards.close(), close()),
        timeline=Timeline(run_dir / "timeline.jsonl"),
    )
    return trainer


def build_roles(config: Config, max_len: int, probe_ids: list[int] | None):
    """(engine, learner, sync, close) for the configured placement."""
    if config.placement.mode == "ray":
        from relayrl.placement.build import build_ray_roles, shutdown

        learner, engines, sync, group = build_ray_roles(config, max_len, probe_ids)
        return engines, learner, sync, functools.partial(shutdown, learner, engines, group)
    from relayrl.rollout import engine_from_config  # the same construction as a Ray engine actor's

    engine = engine_from_config(config, max_len)
    return engine, LearnerRole(config), InProcessSync(probe_ids=probe_ids), lambda: None


def advantage_knobs(config: Config) -> dict:
    """The config values each estimator takes (the others have none)."""
    algo = config.algorithm
    return {
        "grpo": {"std_normalize": algo.std_normalize},
        "reinforce_pp": {"gamma": algo.gamma},
        "gae": {"gamma": algo.gamma, "lam": algo.lam},
    }.get(algo.advantage, {})


def check_context(config: Config, max_len: int) -> None:
    limit = context_length(config.model.path)
    if limit is not None and max_len > limit:
        raise ConfigError(
            f"the longest prompt plus rollout.max_tokens={config.rollout.max_tokens} is {max_len} "
            f"tokens, over the model's context of {limit}: lower data.max_prompt_tokens="
            f"{config.data.max_prompt_tokens} or rollout.max_tokens"
        )


def train(config: Config, resume: str | None = None, overwrite: bool = False) -> dict[str, dict[str, float]]:
    """Run training into `log.dir`; with `resume`, continue the run in that directory from its newest intact
    checkpoint; with `overwrite`, replace a run already in `log.dir`. SIGTERM/SIGINT raise `Interrupted`
    once the current step is saved (relayrl/preemption.py), after every role is closed."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if resume is not None and overwrite:
        raise ConfigError("--resume continues a run and --overwrite replaces it: pass one of them")
    found = None
    with StopSignals() as signals:
        try:
            if resume is not None:
                found = latest_checkpoint(resume)
                if found is None:
                    raise ConfigError(f"--resume {resume}: no usable checkpoint in {checkpoint_root(resume)}")
                config.log.dir = str(resume)
            trainer = build_trainer(config, None if found is None else found[1]["step"], overwrite)
            trainer.signals = signals
            try:
                if found is None:
                    return trainer.run()
                start = trainer.load_state(*found)
                print(f"resuming from {found[0]} at step {start}")
                return trainer.run(start_step=start, before=found[1]["before"])
            finally:
                trainer.close()
        except Interrupted as stop:
            stop.run_dir = config.log.dir
            if stop.checkpoint is None and found is not None:  # stopped before the resumed run's first step
                stop.checkpoint = found[0]
            raise
