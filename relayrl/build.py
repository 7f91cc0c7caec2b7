"""Building a run: every role constructed once, every variant chosen once, before the first step.

First the config's `auto` choices are made (`resolve`: the engine, tensor-parallel ranks, the LoRA sync, colocated
sleep and offload, the wire dtype), each by the package that owns it; a loaded config is only validated
(relayrl/config/ imports no runtime code), so every caller that reads a chosen value resolves it first. Model,
data and reward are checked before anything is written; only then is `log.dir` claimed
(relayrl/run/directory.py), so a mistaken command never touches a previous run. Then the roles are placed
(relayrl/placement/: in this process or as Ray actors), the reward service started, the rollout source chosen
(single- or multi-turn, relayrl/sources/), the schedule and the advantage stage bound. The step that runs them is
relayrl/controller.py; `train` is a whole run: build, resume from a checkpoint, run, close.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relayrl.algorithms.stage import advantage_stage
from relayrl.algorithms.teacher_prompt import TeacherPrompt
from relayrl.algorithms.teacher_routes import TeacherRoutes
from relayrl.config import Config, DataConfig, dump_config
from relayrl.config.effects import warn_chosen
from relayrl.config.sync import resolve_parity_probe
from relayrl.config.warn import gathered
from relayrl.controller import LoopSettings, Trainer
from relayrl.data.source import PromptSampler, PromptTable, load_prompts, longest_prompt_tokens, show_first_prompt
from relayrl.errors import ConfigError, RoleFailure
from relayrl.learner.teacher import check_teacher_dir, choose_teacher_engine, teacher_keys
from relayrl.metrics.timeline import Timeline
from relayrl.models.loading import check_model_dir, load_tokenizer, pad_token_id
from relayrl.placement import build_roles
from relayrl.placement.sections import colocation
from relayrl.placement.time_sharing import TimeSharing
from relayrl.planner.checkpointing import choose_checkpointing
from relayrl.planner.estimate import workload_from_config
from relayrl.rewards import load_reward
from relayrl.rewards.service import build_reward_service
from relayrl.rollout.choice import choose_engine
from relayrl.rollout.memory import check_shares, colocated, judge_share, resolve_engine_share
from relayrl.rollout.sleep import resolve_sleep
from relayrl.rollout.vllm_tp import check_tensor_parallel
from relayrl.run.checkpoint import checkpoint_root, latest_checkpoint
from relayrl.run.directory import claim
from relayrl.run.preemption import Interrupted, StopSignals
from relayrl.schedules.modes import SCHEDULES, ScheduleSettings
from relayrl.sources.base import SourceSettings
from relayrl.sources.context import context_budget
from relayrl.sources.multi_turn import MultiTurnSource, check_env
from relayrl.sources.single_turn import SingleTurnSource
from relayrl.sync.buckets import resolve_wire_dtype
from relayrl.sync.guard import PushGuard, probe_sequence
from relayrl.sync.lora import resolve_lora_auto
from relayrl.types import Prompt

if TYPE_CHECKING:
    from collections.abc import Callable

    from relayrl.sources.base import RolloutSource

Prompts = list[Prompt] | PromptTable  # a file's prompts: read now (small), or each row when drawn (large)


def resolve(config: Config, stacklevel: int = 1) -> Config:
    """Make the config's `auto` choices in place (once) and return it; a choice that cannot hold is a ConfigError.

    Each is decided by the package that owns it, in this order:
    1. `rollout.engine: auto` -> vllm or hf (relayrl/rollout/choice.py), with the reason the dump prints;
    2. `rollout.tensor_parallel` > 1: vLLM ranks, their heads and devices (relayrl/rollout/vllm_tp.py), after the
       engine is known;
    3. `sync.lora: auto` -> adapter or merged (relayrl/sync/lora.py), after the engine is known;
    4. `rollout.sleep: auto` and `learner.offload: auto` -> colocated time-sharing on or off, and an offload as set
       checked against this machine (relayrl/rollout/sleep.py);
    5. `sync.wire_dtype: auto` -> bf16 or fp32, the engine's dtype (relayrl/sync/buckets.py); `rollout.
       gpu_memory_utilization: auto` -> the engine's share of its GPU (relayrl/rollout/memory.py);
    6. `learner.activation_checkpointing: auto` -> on where a colocated GPU run's update would not fit beside the
       engine's share without it (relayrl/planner/checkpointing.py);
       `teacher.engine: auto` -> local or actor (relayrl/learner/teacher.py), when there is a teacher;
    7. `sync.parity_probe: auto` -> on under train.schedule=sync (relayrl/config/sync.py).
    Then the settings a choice left without effect are warned about (at the line `stacklevel` frames up: 1 = this
    caller's). Resolving twice changes nothing; a dump writes `auto` back (so a reload chooses again, on its own
    machine).
    """
    if config._resolved:
        return config
    with gathered(stacklevel):
        try:
            _choose(config)
        except ValueError as err:  # a rule's own message, as validation would have given it
            raise ConfigError(f"invalid config:\n  {err}") from None
        warn_chosen(config)
    config._resolved = True
    return config


def _choose(config: Config) -> None:
    if config.rollout.engine == "auto":
        config._engine_choice = choice = choose_engine(config.model.path, config.placement.mode)  # for the dump
        config.rollout.engine = choice.engine
        config.rollout.model_fields_set.discard("engine")  # chosen, not set by the user: the no-effect warnings agree
    if config.rollout.tensor_parallel > 1:
        chosen = check_tensor_parallel(config.rollout, config.model.path, config.placement)
        if chosen is not None:
            config._engine_choice = chosen
    if config.model.lora is not None and config.sync.lora == "auto":
        config.sync.lora = resolve_lora_auto(config.rollout.engine)
    choose_time_sharing(config)  # after sync.lora: an adapter push keeps level 1
    if config.sync.wire_dtype == "auto":
        config.choose("sync.wire_dtype", *resolve_wire_dtype(config.rollout.dtype))
    if config.rollout.gpu_memory_utilization == "auto":
        judge = judge_share(config.placement, config.reward)
        config.choose("rollout.gpu_memory_utilization", *resolve_engine_share(colocated(config.placement), judge))
    if config.rollout.engine == "vllm":  # an HF engine takes no share up front
        check_shares(config.rollout.gpu_memory_utilization, judge_share(config.placement, config.reward))
    if config.learner.activation_checkpointing == "auto":  # after the engine's share: the room it leaves
        work = functools.partial(workload_from_config, config, checkpointing=False)
        chosen = choose_checkpointing(config.model.path, work, colocated(config.placement))
        config.choose("learner.activation_checkpointing", *chosen)
    if config.teacher.present and config.teacher.engine == "auto":  # on-policy distillation (learner/teacher.py)
        placement = config.placement
        config.choose("teacher.engine", *choose_teacher_engine("auto", placement.mode, None, placement.learner_ranks))
    if config.sync.parity_probe == "auto":
        config.choose("sync.parity_probe", *resolve_parity_probe(config))


def choose_time_sharing(config: Config, cuda: Callable[[], bool] | None = None) -> None:
    """`rollout.sleep: auto` and `learner.offload: auto` chosen (relayrl/rollout/sleep.py), an offload as set
    checked; `cuda`: whether a GPU is usable (default torch's answer)."""
    for key, (value, why) in resolve_sleep(colocation(config), cuda).items():
        config.choose(key, value, why)


def build_trainer(config: Config, resume_step: int | None = None, overwrite: bool = False) -> Trainer:
    """Construct every role once: in this process (`placement.mode=local`) or as Ray actors (`ray`), after the
    config's `auto` choices are made (`resolve`; a no-op for a config already resolved)."""
    resolve(config)
    check_model_dir(config.model.path)
    for teacher, key in zip(config.teacher.models(), teacher_keys(config.teacher)):  # each teacher that does not
        check_teacher_dir(teacher.path, config.model.path, key)  # load, or speaks another vocabulary, stops here
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    tokenizer = load_tokenizer(config.model.path)
    prompts, eval_prompts, data_metrics = load_data(config.data, config.eval.max_prompts, tokenizer)
    longest = longest_prompt_tokens(prompts, eval_prompts)  # a large file: its limit
    teacher_routes = TeacherRoutes.of(config.teacher)
    if teacher_routes is not None and isinstance(prompts, list):  # a route no teacher answers: refused here
        teacher_routes.check_prompts(prompts)
    teacher_prompt = TeacherPrompt(config.teacher.prompt, tokenizer) if config.teacher.prompt else None
    if teacher_prompt is not None and isinstance(prompts, list):  # a placeholder no column answers: refused here
        teacher_prompt.check_prompts(prompts)
    check_env(source_settings(config), config.train.partial_rollouts)  # env.fn or env.agent: multi-turn rollouts
    max_len = context_budget(longest, config.rollout, config.env, config.model.path, config.data.max_prompt_tokens)
    for component in config.reward.resolved_components():  # a bad reward spec fails here, not after the roles
        load_reward(component.fn, component.kwargs, component.style)
    run_dir = claim(config.log.dir, dump_config(config), resume_step, overwrite)
    probe_ids = probe_sequence(prompts[0], prompts[-1], max_len) if config.sync.parity_probe else None
    roles = build_roles(config, max_len)
    rewards = build_reward_service(config.reward, on_ray=config.placement.mode == "ray")  # after Ray is up
    sampler = PromptSampler(prompts, config.train.seed, config.data.shuffle)
    source = (
        MultiTurnSource(source_settings(config), roles.engines, rewards, sampler, roles.sync, max_len)
        if config.env.multi_turn
        else SingleTurnSource(source_settings(config), roles.engines, rewards, sampler, roles.sync)
    )
    return Trainer(
        loop=loop_settings(config),
        engines=roles.engines,
        learner=roles.learner,
        sync=roles.sync,
        source=source,
        sampler=sampler,
        make_schedule=functools.partial(SCHEDULES[config.train.schedule], source, schedule_settings(config)),
        advantages=advantage_stage(config.algorithm, teacher=config.teacher.present),
        eval_prompts=eval_prompts,
        tokenizer=tokenizer,
        run_dir=run_dir,
        data_metrics=data_metrics,
        pad_id=pad_token_id(tokenizer),
        close=functools.partial(_close, rewards, roles, source),
        time_sharing=TimeSharing.from_settings(
            config.rollout.sleep, config.learner.offload, roles.engines, roles.learner
        ),
        learner_restarts=roles.learner_restarts,
        timeline=Timeline(run_dir / "timeline.jsonl"),
        teacher_routes=teacher_routes,
        teacher_prompt=teacher_prompt,
        teacher=roles.teacher,  # teacher.engine=actor or vllm: its own role; else the learner scores
        guard=PushGuard(config.sync.max_mismatch, probe_ids),
    )


def loop_settings(config: Config) -> LoopSettings:
    """The sections the training loop reads (relayrl/controller.py)."""
    return LoopSettings(
        train=config.train,
        updates_per_step=config.updates_per_step,
        log=config.log,
        eval_every=config.eval.every,
        checkpoint=config.checkpoint,
        model_path=config.model.path,
        dumped=config.model_dump(),
    )


def source_settings(config: Config) -> SourceSettings:
    """The sections a rollout source reads (relayrl/sources/)."""
    return SourceSettings(
        rollout=config.rollout,
        eval=config.eval,
        env=config.env,
        seed=config.train.seed,
        advantage=config.algorithm.advantage,
        model_path=config.model.path,
        chat_template=config.data.chat_template,
        with_reward_fn=bool(config.reward.model_fields_set & {"fn", "components"}),
    )


def schedule_settings(config: Config) -> ScheduleSettings:
    """The sections a schedule reads (relayrl/schedules/modes.py)."""
    return ScheduleSettings(config.rollout, config.train, config.algorithm.dapo, config.placement.call_timeout_s)


def _close(*parts) -> None:
    """The reward service, the roles, the rollout source: each releases its workers, actors or threads."""
    for part in parts:
        part.close()


def load_data(data: DataConfig, max_eval_prompts: int, tokenizer) -> tuple[Prompts, list[Prompt], dict[str, float]]:
    """(training prompts, held-out prompts (`eval.max_prompts` of them, 0 = all), data/* metrics), the first
    prompt shown as the model sees it."""
    prompts, long_stats = load_prompts(
        data.train, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template, data.prompt_key
    )
    show_first_prompt(prompts, long_stats, tokenizer)  # what the model is shown, before any time is spent
    data_metrics = {
        "data/prompts_dropped": float(long_stats.dropped),
        "data/prompts_truncated": float(long_stats.truncated),
        "data/prompts_unknown_chars": float(long_stats.unknown),
    }
    eval_prompts: list[Prompt] = []
    if data.eval:
        held_out, eval_stats = load_prompts(
            data.eval, tokenizer, data.max_prompt_tokens, data.on_long_prompt, data.chat_template, data.prompt_key
        )
        eval_prompts = held_out[: max_eval_prompts or None]  # a list (a large file's table, sliced)
        data_metrics.update(
            {
                "data/eval_prompts_dropped": float(eval_stats.dropped),
                "data/eval_prompts_truncated": float(eval_stats.truncated),
            }
        )
    return prompts, eval_prompts, data_metrics


def train(config: Config, resume: str | None = None, overwrite: bool = False) -> dict[str, dict[str, float]]:
    """Run training into `log.dir`; with `resume`, continue the run in that directory from its newest intact
    checkpoint; with `overwrite`, replace a run already in `log.dir`. SIGTERM/SIGINT raise `Interrupted`
    once the current step is saved (relayrl/run/preemption.py), after every role is closed."""
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
            hinted = with_resume_hint(str(failure), config.log.dir)
            raise RoleFailure(hinted, failure.role, failure.died, failure.hung) from failure


def with_resume_hint(message: str, run_dir: str) -> str:
    """`message`, plus the command that continues the run in `run_dir` when it holds an intact checkpoint."""
    found = latest_checkpoint(run_dir, log=lambda *_: None) if Path(run_dir, "config.yaml").exists() else None
    if found is None:
        return message
    command = shlex.join(["relayrl", "train", str(Path(run_dir) / "config.yaml"), "--resume", str(run_dir)])
    return f"{message}\nresume with: {command}"


def build_evaluation(config: Config, prompts: list[Prompt]) -> tuple[RolloutSource, Callable[[], None]]:
    """What `relayrl eval` runs on `prompts`: one local engine holding model.path, the reward service, and the rollout
    source training builds on them (single- or multi-turn), with the function that closes them; no learner, no run
    directory, no weights pushed (the engine's policy version stays 0). The config is resolved first."""
    from relayrl.placement.sections import engine_settings
    from relayrl.rollout.build import engine_from_settings
    from relayrl.rollout.local_group import LocalEngineGroup

    resolve(config)
    check_env(source_settings(config), config.train.partial_rollouts)
    r, data = config.rollout, config.data
    max_len = context_budget(longest_prompt_tokens(prompts), r, config.env, config.model.path, data.max_prompt_tokens)
    rewards = build_reward_service(config.reward)  # before the engine: a spec that cannot load fails first
    try:
        engines, sampler = (
            LocalEngineGroup(engine_from_settings(engine_settings(config), max_len)),
            PromptSampler(prompts, 0, False),
        )
        source: RolloutSource = (
            MultiTurnSource(source_settings(config), engines, rewards, sampler, _AsLoaded(), max_len)
            if config.env.multi_turn
            else SingleTurnSource(source_settings(config), engines, rewards, sampler, _AsLoaded())
        )
    except BaseException:
        rewards.close()
        raise
    return source, functools.partial(_close, source, rewards)


@dataclasses.dataclass
class _AsLoaded:
    """An evaluation's weight sync: the engine keeps the weights it loaded (version 0); nothing is pushed."""

    version: int = 0
    last: dict[str, float] = dataclasses.field(default_factory=dict)
    transport: str = "none"
    tensors: list[str] = dataclasses.field(default_factory=list)

    def push(self, learner: Any, engines: Any, version: int | None = None) -> int:
        raise RuntimeError("an evaluation pushes no weights")
