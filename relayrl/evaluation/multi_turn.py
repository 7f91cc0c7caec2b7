"""`relayrl eval --env SPEC`: a model's multi-turn trajectories on a prompt file, scored by the environment.

Prints reward_mean (each trajectory's turn rewards combined per `reward`: sum, final, discounted), success
(the environment's info["success"] at the end), first_turn_success, turns_mean, and the trajectories the
environment failed on (errors, timeouts) or that ran over max_total_tokens (truncated). Greedy by default.
"""

from __future__ import annotations

from typing import Any, Literal


def evaluate_env_model(
    model: str,
    data: str,
    env: str,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int = 4,
    max_total_tokens: int = 512,
    max_tokens: int = 64,
    n: int = 1,
    temperature: float = 0.0,
    engine: str = "vllm",
    max_prompts: int = 0,
    reward: Literal["sum", "final", "discounted"] = "sum",
    seed: int = 0,
    workers: int = 16,
    timeout_s: float = 30.0,
    prompt_key: str = "prompt",
) -> dict[str, float]:
    from relayrl.config.env import EnvConfig
    from relayrl.data.chat import ChatCodec
    from relayrl.data.source import load_prompts
    from relayrl.envs.pool import EnvPool
    from relayrl.models.loading import load_tokenizer
    from relayrl.rollout import build_engine
    from relayrl.rollout.local_group import LocalEngineGroup
    from relayrl.sources.trajectories import MultiTurnDriver
    from relayrl.sources.turn_requests import turn_requests
    from relayrl.types import Sampling

    settings = EnvConfig(
        fn=env,
        kwargs=env_kwargs or {},
        max_turns=max_turns,
        max_total_tokens=max_total_tokens,
        max_tokens_per_turn=max_tokens,
        on_error="zero",
        reward=reward,
        max_inflight=workers,
        timeout_s=timeout_s,
    )
    tokenizer = load_tokenizer(model, key="--model")
    prompts, _ = load_prompts(data, tokenizer, max_prompt_tokens=10**9, prompt_key=prompt_key)
    prompts = prompts[:max_prompts] if max_prompts else list(prompts)  # a large file's lazy table, read whole
    max_len = max(len(p.token_ids) for p in prompts) + 16 + max_total_tokens  # room for the chat template's turns
    sampling = Sampling(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)
    pool = EnvPool(env, settings.kwargs, workers, timeout_s)  # before the engine: a spec that cannot load fails first
    try:
        engine_ = build_engine(engine, model, max_len, seed)
        driver = MultiTurnDriver(
            turn_requests(LocalEngineGroup(engine_)), pool, ChatCodec(tokenizer), settings, sampling
        )
        batch = driver.run(prompts, n)
    finally:
        pool.close()
    m = batch.metrics
    return {
        "reward_mean": sum(batch.rewards) / max(1, len(batch.rewards)),
        "success": m["env/success"],
        "first_turn_success": m["env/first_turn_success"],
        "turns_mean": m["env/turns_mean"],
        "n": len(prompts) * n,
        "errors": int(m["env/errors"]),
        "timeouts": int(m["env/timeouts"]),
        "truncated": m["env/truncated_frac"],
    }
