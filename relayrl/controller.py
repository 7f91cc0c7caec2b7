"""The training loop: generate -> reward -> log-probs -> advantages -> update -> sync, step after step.

The controller owns the order of the phases and nothing else: the engines, learner and sync (relayrl/placement/),
the schedule with its rollout source (relayrl/schedules/, relayrl/sources/) and the advantage stage
(relayrl/algorithms/stage.py) are built once by relayrl/build.py, and the step reads the same whatever they are.
Held-out evaluation and closing are the source's (single- or multi-turn alike). Its metrics are assembled in
relayrl/metrics/step_metrics.py. A learner that dies or hangs under Ray is healed here (`heal`): a new group
restored from the newest checkpoint, the steps after it redone (placement.on_learner_failure). A whole run (build, resume, run, close) is `relayrl.build.train`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.errors import RoleFailure
from relayrl.learner.batching import make_experience
from relayrl.learner.teacher import teacher_experience
from relayrl.metrics.samples import log_samples, logged_rows
from relayrl.metrics.step_metrics import step_metrics
from relayrl.metrics.timer import StepTimer
from relayrl.metrics.trackers import build_trackers
from relayrl.placement.learner_restarts import LearnerRestarts
from relayrl.placement.teacher_actor import TeacherActor
from relayrl.placement.time_sharing import TimeSharing
from relayrl.run.checkpoint import latest_checkpoint
from relayrl.run.jsonl import truncate_after
from relayrl.run.preemption import Interrupted, StopSignals
from relayrl.sync.guard import PushGuard

if TYPE_CHECKING:  # annotations only: the step calls these through their protocols
    from transformers import PreTrainedTokenizerBase

    from relayrl.algorithms.teacher_prompt import TeacherPrompt
    from relayrl.algorithms.teacher_routes import TeacherRoutes
    from relayrl.config import CheckpointConfig, LogConfig, TrainConfig
    from relayrl.data.source import PromptSampler
    from relayrl.learner.role import Learner
    from relayrl.metrics.timeline import Timeline
    from relayrl.rollout.protocols import EngineGroup
    from relayrl.schedules.modes import Schedule
    from relayrl.sources.base import Batch, RolloutSource
    from relayrl.sync.base import WeightSync
    from relayrl.types import Experience, Prompt, Rollout


@dataclass
class LoopSettings:
    """The sections the loop itself reads (relayrl/build.py `loop_settings` cuts them from the config): how many
    steps, when to evaluate and checkpoint, what to log."""

    train: TrainConfig  # steps, epochs
    updates_per_step: int  # optimizer steps per training step
    log: LogConfig
    eval_every: int
    checkpoint: CheckpointConfig
    model_path: str  # where a restarted learner begins when no checkpoint is written yet
    dumped: dict  # the whole config, as the trackers record it


@dataclass
class Trainer:
    loop: LoopSettings
    engines: EngineGroup  # one local engine, or Ray actors (relayrl/placement/)
    learner: Learner  # a LearnerRole, or a handle on one in an actor
    sync: WeightSync  # in-process, or a transport between actors
    source: RolloutSource  # single- or multi-turn: what the schedule draws on, and held-out evaluation
    sampler: PromptSampler
    make_schedule: Callable[[], Schedule]  # the train.schedule's, drawing on a RolloutSource
    advantages: Callable[[Experience, list[Rollout]], Experience]  # the estimator and DAPO's overlong filter
    eval_prompts: list[Prompt]
    tokenizer: PreTrainedTokenizerBase | None  # None in tests that build a Trainer without one
    run_dir: Path
    data_metrics: dict
    pad_id: int
    close: Callable[[], None] = lambda: None  # release actors and shared memory
    timeline: Timeline | None = None
    time_sharing: TimeSharing = field(default_factory=TimeSharing.off)  # colocated: engine and learner take turns
    schedule: Schedule | None = None  # made when the run starts (async producers begin generating then)
    signals: StopSignals = field(default_factory=StopSignals)  # SIGTERM/SIGINT: stop after the current step
    learner_restarts: LearnerRestarts = field(default_factory=LearnerRestarts.off)  # ray: the learner heals
    # teacher.path / teacher.teachers: a teacher phase after the log-probs (relayrl/learner/teacher.py), each row
    # scored by the teacher its route names (relayrl/algorithms/teacher_routes.py); None = no teacher
    teacher_routes: TeacherRoutes | None = None
    teacher_prompt: TeacherPrompt | None = None  # teacher.prompt: the teacher scores after its own prompt
    teacher: Any = None  # what scores (its `score_teacher`): teacher.engine=actor or vllm's role; None = the learner
    guard: PushGuard = field(default_factory=PushGuard.off)  # a push that did not land stops the run

    def step(self, step: int) -> dict[str, float]:
        """One training step as named phases (docs/architecture.md); every variant was chosen by relayrl/build.py."""
        timer, schedule = StepTimer(self.timeline, step), self.schedule
        assert schedule is not None, "run() makes the schedule before the first step"
        batch = schedule.batch(step, timer)  # generate and reward, overlapped as the schedule says
        routes = self.teacher_routes
        teacher_rows = None if routes is None else routes.rows(batch.rollouts)  # an unknown route stops here
        teacher_input = self.teacher_input(batch.rollouts)  # teacher.prompt: so does a placeholder no column answers
        self.time_sharing.before_update(timer)  # colocated: the engine sleeps, the learner's states come back
        with timer("logprobs"):  # old and reference log-probs, values, a KL penalty in the reward
            exp = self.learner.prepare(make_experience(batch.rollouts, batch.scores, self.pad_id))
        if routes is not None:  # on-policy distillation: the teacher scores the sampled tokens, once per sample
            exp.teacher_routes = teacher_rows
            with timer("teacher"):
                exp = (self.teacher or self.learner).score_teacher(exp, teacher_input)
        with timer("advantage"):
            exp = self.advantages(exp, batch.rollouts)
        with timer("update"):  # with the pre-update log-probs of the rows this step logs to samples.jsonl
            update = self.learner.update(step, exp, self.sample_rows(step))
        trained = self.sync.version  # the version this update started from
        self.guard.check_samples(step, update.mismatch, trained, self.sync)  # did the engine serve `trained`?
        with timer("probe"):  # the parity probe's learner side, on the weights about to be pushed
            self.guard.before_push(self.learner)
        self.time_sharing.before_push(timer)  # colocated: the engine's weights wake
        with timer("sync"):
            self.sync.push(self.learner, self.engines)
        self.time_sharing.after_push(timer)  # colocated: the learner's states leave, the engine's KV cache wakes
        with timer("probe"):  # its engine side: did the push land?
            self.guard.after_push(self.engines, self.sync)
        schedule.published(self.sync.version)
        roles = {**self.engines.metrics(), **self.learner_restarts.metrics(), **self.teacher_metrics()}
        metrics = step_metrics(
            self.loop.updates_per_step,
            self.loop.train.epochs,
            trained,
            batch,
            exp,
            update,
            timer,
            {**self.sync.last, **self.guard.last},
            roles,
        )
        if routes is not None:
            metrics.update(routes.metrics(exp))  # distill/reverse_kl/<route>, several teachers
        self.record(step, batch, exp, update.sample_logprobs)
        return metrics

    def teacher_metrics(self) -> dict[str, float]:
        """The teacher's own actor's restarts (relayrl/placement/teacher_actor.py); none for a teacher that cannot
        fail apart from the run (in the learner, or in the driver)."""
        return self.teacher.metrics() if isinstance(self.teacher, TeacherActor) else {}

    def teacher_input(self, rollouts: list[Rollout]) -> Experience | None:
        """With teacher.prompt: the step's responses after the teacher's prompt (None: the teacher sees the
        student's rows)."""
        if self.teacher_prompt is None:
            return None
        return teacher_experience(self.teacher_prompt, rollouts, self.pad_id)

    def sample_rows(self, step: int) -> int:
        """How many first rows of the step's batch samples.jsonl logs (log.samples; 0 on a step it skips)."""
        samples = self.loop.log.samples
        return logged_rows(samples.every, samples.max_per_step, step, self.loop.train.steps - 1)

    def record(
        self, step: int, batch: Batch, exp: Experience, learner_logprobs: list[list[float]] | None = None
    ) -> None:
        """The engines' generate spans on the timeline, and the step's samples (log.samples) with the learner's
        log-probs of their rows."""
        if self.timeline is not None:
            for replica, start, end in self.engines.take_spans():
                self.timeline.add(step, f"engine {replica}", "generate", start, end)
            self.timeline.flush()
        samples, last = self.loop.log.samples, self.loop.train.steps - 1
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        log_samples(
            self.run_dir,
            samples.every,
            samples.max_per_step,
            step,
            last,
            batch.rollouts,
            batch.scores,
            exp,
            decode,
            learner_logprobs,
        )

    def evaluate(self) -> dict[str, float]:
        return self.source.evaluate(self.eval_prompts) if self.eval_prompts else {}

    def run(self, start_step: int = 0, before: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
        before = self.evaluate() if before is None else before
        first = self.sampler.state()  # where a learner restarted before any checkpoint begins again
        with self.signals.during_steps():  # a signal from here on ends the current step first
            while True:
                try:
                    self.steps(start_step, before)
                    break
                except RoleFailure as failure:
                    if not self.learner_restarts.heals(failure):
                        raise
                    start_step = self.heal(failure, first)
            after = self.evaluate()
            if self.loop.log.save_model:
                self.learner.save(str(self.run_dir), self.tokenizer)
        result = {"before": before, "after": after}
        (self.run_dir / "eval.json").write_text(json.dumps(_eval_json(result), indent=2) + "\n")
        return result

    def steps(self, start_step: int, before: dict[str, float]) -> None:
        """Steps `start_step`.. to the end, each logged, checkpointed as configured, stopped early by a signal."""
        loop = self.loop
        trackers = build_trackers(loop.log, loop.train.steps, loop.dumped, self.run_dir)
        self.guard.start(self.learner, self.engines)  # both sides hold the same weights: the probe's start
        self.schedule = self.make_schedule()  # async producers start generating here
        self.time_sharing.start()  # colocated: the engine has the device for the first generate
        try:
            for step in range(start_step, loop.train.steps):
                metrics = self.step(step)
                if step == 0:
                    metrics.update(self.data_metrics)
                last = step == loop.train.steps - 1
                if not last and loop.eval_every and (step + 1) % loop.eval_every == 0:
                    metrics.update(self.evaluate())
                trackers.log(step, metrics)
                saved = None
                if loop.checkpoint.every and (step + 1) % loop.checkpoint.every == 0:
                    saved = self.checkpoint(step, before)
                if self.signals.requested:  # preempted: this step is done and logged; save it and stop
                    raise Interrupted(
                        self.signals.requested, self.run_dir, step, saved or self.checkpoint(step, before)
                    )
        finally:
            self.schedule.close()  # the rollouts in flight or buffered go with it: none outlives a learner restart
            trackers.close()

    def heal(self, failure: RoleFailure, first: dict) -> int:
        """After the learner died or hung: a new learner group restored from the newest intact checkpoint (or
        model.path and the first prompt when there is none), that version pushed to every engine, the logs cut
        back to it; the step to go on from. Nothing generated before is kept: the schedule that held it is closed,
        and its prompts are the restored sampler's to draw again. Raises when restarts are off or used up."""
        found = latest_checkpoint(self.run_dir)
        self.learner_restarts.restart(failure, str(found[0]) if found else f"{self.loop.model_path} at step 0")
        self.time_sharing.wake()  # colocated: the engine may have been put to sleep for the failed update
        if found is not None:
            start = self.load_state(*found)
        else:
            self.sampler.load_state(first)
            self.sync.push(self.learner, self.engines, version=0)
            start = 0
        for name in ("metrics.jsonl", "timeline.jsonl", "samples.jsonl"):  # the steps after it are logged again
            truncate_after(self.run_dir / name, start - 1)
        return start

    def checkpoint(self, step: int, before: dict[str, float]) -> str:
        return self.learner.checkpoint(
            str(self.run_dir), step, self.loop_state(step, before), self.loop.checkpoint.keep
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
