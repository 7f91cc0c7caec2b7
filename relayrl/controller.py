"""The synchronous training loop: generate -> reward -> log-probs -> advantages -> update -> sync.

The controller owns the order of the phases and nothing else: algorithms are pure functions; the engines,
learner and sync (relayrl/placement/), the schedule with its rollout source (relayrl/schedules/,
relayrl/rollout/source.py) and the advantage stage are built once in `build_trainer`, and the step reads the
same whatever they are. Its metrics are assembled in relayrl/metrics/step_metrics.py.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from relayrl.algorithms.advantages import ADVANTAGES, TOKEN_LEVEL, AdvantageInputs, make_inputs, turn_reward_tensor
from relayrl.algorithms.dapo import overlong_mask
from relayrl.checkpoint import checkpoint_root, latest_checkpoint
from relayrl.config import Config, dump_config
from relayrl.data.source import PromptSampler, load_prompts, longest_prompt_tokens, show_first_prompt
from relayrl.envs.source import MultiTurnSource, check_env, response_budget
from relayrl.errors import ConfigError, RoleFailure
from relayrl.evaluate import evaluate
from relayrl.learner.batching import make_experience
from relayrl.learner.role import Learner
from relayrl.metrics.samples import log_samples
from relayrl.metrics.step_metrics import step_metrics
from relayrl.metrics.timeline import Timeline
from relayrl.metrics.timer import StepTimer
from relayrl.metrics.trackers import build_trackers
from relayrl.models.loading import check_model_dir, context_length, load_tokenizer, pad_token_id
from relayrl.placement import build_roles
from relayrl.preemption import Interrupted, StopSignals
from relayrl.rewards import load_reward
from relayrl.rewards.service import RewardService, build_reward_service
from relayrl.rollout import EngineGroup, Sampling
from relayrl.rollout.source import Batch, RolloutSource
from relayrl.run_dir import claim
from relayrl.schedules.overlap import SCHEDULES, Schedule
from relayrl.sync.base import WeightSync
from relayrl.types import Experience, Prompt, Rollout


@dataclass
class Trainer:
    config: Config
    engines: EngineGroup  # one local engine, or Ray actors (relayrl/placement/)
    learner: Learner  # a LearnerRole, or a handle on one in an actor
    sync: WeightSync  # in-process, or a transport between actors
    rewards: RewardService
    sampler: PromptSampler
    make_schedule: Callable[[], Schedule]  # the train.schedule's, drawing on a RolloutSource
    advantages: Callable[[Experience, list[Rollout]], Experience]  # the estimator and DAPO's overlong filter
    eval_prompts: list[Prompt]
    tokenizer: object  # a transformers tokenizer
    run_dir: Path
    data_metrics: dict
    pad_id: int
    close: Callable[[], None] = lambda: None  # release actors and shared memory
    timeline: Timeline | None = None
    multiturn: MultiTurnSource | None = None  # env.fn: held-out evaluation runs trajectories (relayrl/envs/)
    schedule: Schedule | None = None  # made when the run starts (async producers begin generating then)
    signals: StopSignals = field(default_factory=StopSignals)  # SIGTERM/SIGINT: stop after the current step

    def step(self, step: int) -> dict[str, float]:
        """One training step as named phases (DESIGN.md section 1); every variant was chosen in build_trainer."""
        timer = StepTimer(self.timeline, step)
        batch = self.schedule.batch(step, timer)  # generate and reward, overlapped as the schedule says
        with timer("logprobs"):  # old and reference log-probs, values, a KL penalty in the reward
            exp = self.learner.prepare(make_experience(batch.rollouts, batch.scores, self.pad_id))
        with timer("advantage"):
            exp = self.advantages(exp, batch.rollouts)
        with timer("update"):
            stats = self.learner.update(step, exp)
        trained = self.sync.version  # the version this update started from
        with timer("sync"):
            self.sync.push(self.learner, self.engines)
        self.schedule.published(self.sync.version)
        metrics = step_metrics(self.config, trained, batch, exp, stats, timer, self.sync.last, self.engines.metrics())
        self.record(step, batch, exp)
        return metrics

    def record(self, step: int, batch: Batch, exp: Experience) -> None:
        """The engines' generate spans on the timeline, and the step's samples (log.samples)."""
        if self.timeline is not None:
            for replica, start, end in self.engines.take_spans():
                self.timeline.add(step, f"engine {replica}", "generate", start, end)
            self.timeline.flush()
        samples, last = self.config.log.samples, self.config.train.steps - 1
        log_samples(self.run_dir, samples.every, samples.max_per_step, step, last, batch.rollouts, batch.scores, exp)

    def evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        if self.multiturn is not None:
            return self.multiturn.evaluate(self.eval_prompts)
        r = self.config.rollout
        score = functools.partial(lambda rewards, rollouts: rewards.score(rollouts)[0], self.rewards)
        # the policy's length rules (max/min tokens, stop strings) hold at evaluation as in training
        greedy = evaluate(self.engines, self.eval_prompts, score, Sampling.greedy(r.max_tokens, r.stop, r.min_tokens))
        sampled = evaluate(
            self.engines,
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
            self.schedule = self.make_schedule()  # async producers start generating here
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
        sampler = self.schedule.sampler_state() if self.schedule else self.sampler.state()  # what was trained
        return {"step": step, "before": before, "version": self.sync.version, "sampler": sampler}

    def load_state(self, checkpoint: Path, state: dict) -> int:
        """Restore a checkpoint into the built trainer (engines included); returns the step to start from."""
        self.learner.load_state(str(checkpoint), state)
        self.sampler.load_state(state["sampler"])
        self.sync.push(self.learner, self.engines, version=state["version"])
        return state["step"] + 1


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
    prompts, eval_prompts, data_metrics = load_data(config, tokenizer)
    longest = longest_prompt_tokens(prompts, eval_prompts)  # a large file: its limit
    check_env(config, longest)  # env.fn: multi-turn rollouts (relayrl/envs/), a whole trajectory in the context
    max_len = longest + response_budget(config)
    check_context(config, max_len)
    for component in config.reward.resolved_components():  # a bad reward spec fails here, not after the roles
        load_reward(component.fn, component.kwargs, component.style)
    run_dir = claim(config.log.dir, dump_config(config), resume_step, overwrite)
    probe_ids = (prompts[0].token_ids + prompts[-1].token_ids)[: max_len - 1] if config.sync.parity_probe else None
    roles = build_roles(config, max_len, probe_ids)
    rewards = build_reward_service(config.reward, on_ray=config.placement.mode == "ray")  # after Ray is up
    sampler = PromptSampler(prompts, config.train.seed, config.data.shuffle)
    source = (MultiTurnSource if config.env.fn else RolloutSource)(config, roles.engines, rewards, sampler, roles.sync)
    advantage_fn = functools.partial(ADVANTAGES[config.algorithm.advantage], **advantage_knobs(config))
    return Trainer(
        config=config,
        engines=roles.engines,
        learner=roles.learner,
        sync=roles.sync,
        rewards=rewards,
        sampler=sampler,
        make_schedule=functools.partial(SCHEDULES[config.train.schedule], source, config),
        advantages=functools.partial(
            estimate_advantages,
            advantage_fn,
            config.algorithm.dapo.overlong_filter,
            per_turn=config.algorithm.advantage in TOKEN_LEVEL,
        ),
        eval_prompts=eval_prompts,
        tokenizer=tokenizer,
        run_dir=run_dir,
        data_metrics=data_metrics,
        pad_id=pad_token_id(tokenizer),
        close=lambda: (rewards.close(), roles.close(), source.close() if config.env.fn else None),
        timeline=Timeline(run_dir / "timeline.jsonl"),
        multiturn=source if config.env.fn else None,
    )


def load_data(config: Config, tokenizer) -> tuple[list[Prompt], list[Prompt], dict[str, float]]:
    """(training prompts, held-out prompts, data/* metrics), the first prompt shown as the model sees it."""
    data = config.data
    prompts, long_stats = load_prompts(
        data.train, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template
    )
    show_first_prompt(prompts, long_stats, tokenizer)  # what the model is shown, before any time is spent
    data_metrics = {"data/prompts_dropped": long_stats.dropped, "data/prompts_truncated": long_stats.truncated}
    data_metrics["data/prompts_unknown_chars"] = long_stats.unknown
    eval_prompts = []
    if data.eval:
        eval_prompts, eval_stats = load_prompts(
            data.eval, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template
        )
        eval_prompts = eval_prompts[: config.eval.max_prompts or None]
        data_metrics.update(
            {"data/eval_prompts_dropped": eval_stats.dropped, "data/eval_prompts_truncated": eval_stats.truncated}
        )
    return prompts, eval_prompts, data_metrics


def estimate_advantages(
    advantage_fn: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]],
    overlong_filter: bool,
    exp: Experience,
    rollouts: list[Rollout],
    per_turn: bool = False,
) -> Experience:
    """Advantages and returns from the rewards (plus the learner's per-token KL penalty when it is in the
    reward); with DAPO's overlong filter, truncated responses count in their group but train nothing.
    `per_turn` (token-level estimators): a multi-turn trajectory's turns' rewards sit on their turns' ends."""
    placed = turn_reward_tensor(rollouts, exp.prompt_lengths, exp.loss_mask.shape[1]) if per_turn else None
    inputs = make_inputs(exp.rewards, exp.loss_mask, exp.group_ids, exp.values, placed)
    if exp.reward_penalty is not None:
        inputs.token_rewards = inputs.token_rewards + exp.reward_penalty
    exp.advantages, exp.returns = advantage_fn(inputs)
    if overlong_filter:
        exp.loss_mask = exp.loss_mask * overlong_mask(rollouts)[:, None]
    return exp


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
        except RoleFailure as failure:  # a role died for good: say how to continue from the last checkpoint
            raise RoleFailure(with_resume_hint(str(failure), config.log.dir), failure.role, failure.died) from failure


def with_resume_hint(message: str, run_dir: str) -> str:
    """`message`, plus the command that continues the run in `run_dir` when it holds an intact checkpoint."""
    found = latest_checkpoint(run_dir, log=lambda *_: None) if Path(run_dir, "config.yaml").exists() else None
    if found is None:
        return message
    command = shlex.join(["relayrl", "train", str(Path(run_dir) / "config.yaml"), "--resume", str(run_dir)])
    return f"{message}\nresume with: {command}"
