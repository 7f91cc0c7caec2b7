"""The synchronous training loop: generate -> reward -> log-probs -> advantages -> update -> sync.

The controller owns the order of the phases and nothing else: algorithms are pure functions, the engine,
learner and sync are built once in `build_trainer` and the step reads the same whatever they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from relayrl.algorithms.advantages import ADVANTAGES, degenerate_group_fraction
from relayrl.config import Config, dump_config
from relayrl.data.source import PromptSampler, load_prompts
from relayrl.errors import ModelError
from relayrl.evaluate import evaluate
from relayrl.learner.batching import make_experience
from relayrl.learner.policy import PolicyLearner
from relayrl.metrics.timer import StepTimer
from relayrl.metrics.trackers import ConsoleTracker, JsonlTracker, Trackers
from relayrl.rewards import load_reward, score_rollouts
from relayrl.rollout import Sampling, build_engine
from relayrl.sync.inprocess import InProcessSync


@dataclass
class Trainer:
    config: Config
    engine: object
    learner: PolicyLearner
    sync: InProcessSync
    reward_fn: object
    sampler: PromptSampler
    eval_prompts: list
    tokenizer: object
    run_dir: Path
    data_metrics: dict

    def step(self, step: int) -> dict[str, float]:
        cfg, timer = self.config, StepTimer()
        prompts = self.sampler.next(cfg.rollout.prompts_per_step)
        policy_version = self.sync.version  # the version the update below starts from
        with timer("generate"):
            rollouts = self.engine.generate(prompts, self.sampling(step), policy_version)
        with timer("reward"):
            scores, reward_errors = score_rollouts(self.reward_fn, rollouts, cfg.reward.on_error)
        with timer("logprobs"):
            exp = make_experience(rollouts, scores, self.tokenizer.pad_token_id)
            self.learner.fill_logprobs(exp)
        with timer("advantage"):
            advantages = ADVANTAGES[cfg.algorithm.advantage](exp.rewards, exp.group_ids,
                                                             std_normalize=cfg.algorithm.std_normalize)
            exp.advantages = advantages[:, None] * exp.loss_mask
        with timer("update"):
            stats = self.learner.update(exp)
        with timer("sync"):
            self.sync.push(self.learner, self.engine)
        metrics = {**stats, **rollout_metrics(exp, rollouts, reward_errors), **self.sync.last, **timer.metrics()}
        tokens = float(exp.loss_mask.sum())
        metrics["throughput/rollout_tokens_per_s"] = tokens / metrics["time/generate"]
        metrics["throughput/update_tokens_per_s"] = tokens * cfg.train.epochs / metrics["time/update"]
        metrics["stale/mean"] = float(policy_version - exp.versions[exp.loss_mask.bool()].float().mean())
        return metrics

    def sampling(self, step: int) -> Sampling:
        r = self.config.rollout
        return Sampling(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                        stop=tuple(r.stop), seed=self.config.train.seed * 100_003 + step)

    def evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        r = self.config.rollout
        greedy = evaluate(self.engine, self.eval_prompts, self.reward_fn, Sampling.greedy(r.max_tokens, r.stop))
        sampled = evaluate(self.engine, self.eval_prompts, self.reward_fn,
                           Sampling(n=1, temperature=self.config.eval.temperature, max_tokens=r.max_tokens,
                                    stop=tuple(r.stop), seed=self.config.train.seed))
        return {"eval/greedy": greedy, "eval/sampled": sampled}

    def run(self) -> dict[str, dict[str, float]]:
        cfg = self.config
        trackers = Trackers([JsonlTracker(self.run_dir), ConsoleTracker(cfg.train.steps, cfg.log.progress)])
        before = self.evaluate()
        try:
            for step in range(cfg.train.steps):
                metrics = self.step(step)
                if step == 0:
                    metrics.update(self.data_metrics)
                last = step == cfg.train.steps - 1
                if not last and cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                    metrics.update(self.evaluate())
                trackers.log(step, metrics)
        finally:
            trackers.close()
        after = self.evaluate()
        if cfg.log.save_model:
            self.learner.save(self.run_dir / "model", self.tokenizer)
        result = {"before": before, "after": after}
        (self.run_dir / "eval.json").write_text(json.dumps(_eval_json(result), indent=2) + "\n")
        return result


def rollout_metrics(exp, rollouts, reward_errors: int) -> dict[str, float]:
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float32)
    return {
        "reward/mean": float(exp.rewards.mean()),
        "reward/std": float(exp.rewards.std()) if len(rollouts) > 1 else 0.0,
        "reward/errors": float(reward_errors),
        "reward/degenerate_group_frac": degenerate_group_fraction(exp.rewards, exp.group_ids),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }


def _eval_json(result: dict) -> dict:
    return {when: {k.split("/")[-1]: v for k, v in values.items()} for when, values in result.items()}


def build_trainer(config: Config) -> Trainer:
    """Construct every role once, in the driver process (the `local` placement)."""
    from transformers import AutoTokenizer

    if not config.model.path or not Path(config.model.path, "config.json").is_file():
        raise ModelError(f"model.path={config.model.path!r} is not a model directory (no config.json there)")
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    run_dir = Path(config.log.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    data = config.data
    prompts, long_stats = load_prompts(data.train, tokenizer, data.max_prompt_tokens, data.on_long_prompt,
                                       data.chat_template)
    eval_prompts = []
    if data.eval:
        eval_prompts, _ = load_prompts(data.eval, tokenizer, data.max_prompt_tokens, data.on_long_prompt,
                                       data.chat_template)
        if config.eval.max_prompts:
            eval_prompts = eval_prompts[: config.eval.max_prompts]
    reward_fn = load_reward(config.reward.fn, config.reward.kwargs)
    max_prompt = max(len(p.token_ids) for p in prompts + eval_prompts)
    engine = build_engine(config.rollout.engine, config.model.path, max_prompt + config.rollout.max_tokens,
                          config.train.seed, config.rollout.kv_cache_gib, config.rollout.gpu_memory_utilization)
    learner = PolicyLearner(config)
    return Trainer(
        config=config, engine=engine, learner=learner, sync=InProcessSync(), reward_fn=reward_fn,
        sampler=PromptSampler(prompts, config.train.seed, data.shuffle), eval_prompts=eval_prompts,
        tokenizer=tokenizer, run_dir=run_dir,
        data_metrics={"data/prompts_dropped": long_stats.dropped, "data/prompts_truncated": long_stats.truncated},
    )


def train(config: Config) -> dict[str, dict[str, float]]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return build_trainer(config).run()
