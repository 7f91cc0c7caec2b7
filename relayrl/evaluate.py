"""Held-out evaluation: mean reward of an engine's responses to a prompt set."""

from __future__ import annotations

import functools
from typing import Callable

from relayrl.rewards import score_rollouts
from relayrl.rollout.base import Sampling
from relayrl.types import Prompt, Rollout, Score


def evaluate(engine, prompts: list[Prompt], score: Callable[[list[Rollout]], list[Score | None]],
             sampling: Sampling, version: int = 0) -> float:
    """Mean reward over all prompts x sampling.n responses; `score` is the run's reward service (a skipped
    sample counts as 0)."""
    rollouts = engine.generate(prompts, sampling, version)
    scores = score(rollouts)
    return sum(s.reward for s in scores if s is not None) / len(scores)


def evaluate_model(model: str, data: str, reward: str, n: int = 1, temperature: float = 0.0,
                   max_tokens: int = 64, engine: str = "vllm", seed: int = 0, min_tokens: int = 0,
                   max_prompts: int = 0) -> dict[str, float]:
    """`relayrl eval`: load a model into an engine and score it on a prompt file."""
    from relayrl.data.source import load_prompts
    from relayrl.errors import ConfigError
    from relayrl.models.loading import context_length, load_tokenizer
    from relayrl.rewards import load_reward
    from relayrl.rollout import build_engine

    if n < 1 or max_tokens < 1 or temperature < 0 or not 0 <= min_tokens <= max_tokens or max_prompts < 0:
        raise ConfigError(f"relayrl eval: need --n >= 1, --max-tokens >= 1, --temperature >= 0, 0 <= --min-tokens "
                          f"<= --max-tokens, --max-prompts >= 0 (got {n}, {max_tokens}, {temperature}, {min_tokens}, "
                          f"{max_prompts})")
    tokenizer = load_tokenizer(model, key="--model")
    limit = context_length(model) or 10**9
    prompts, _ = load_prompts(data, tokenizer, max_prompt_tokens=max(1, limit - max_tokens))
    prompts = prompts[:max_prompts] if max_prompts else prompts
    fn = load_reward(reward)
    max_len = max(len(p.token_ids) for p in prompts) + max_tokens
    rollout_engine = build_engine(engine, model, max_len, seed)
    sampling = Sampling(n=n, temperature=temperature, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed)
    score = functools.partial(lambda fn, rollouts: score_rollouts(fn, rollouts, on_error="zero")[0], fn)
    return {"reward_mean": evaluate(rollout_engine, prompts, score, sampling), "n": len(prompts) * n}
