"""`relayrl eval --reward`: a saved model's mean reward on a prompt file, through an engine and the reward service.
(In training, held-out evaluation is the rollout source's: relayrl/sources/.)"""

from __future__ import annotations

import json
from typing import Any, Literal

from relayrl.config import RewardConfig
from relayrl.types import Sampling


def evaluate_model(
    model: str,
    data: str,
    reward: str | RewardConfig,
    n: int = 1,
    temperature: float = 0.0,
    max_tokens: int | None = None,
    engine: str = "vllm",
    seed: int = 0,
    min_tokens: int = 0,
    max_prompts: int = 0,
    reward_kwargs: dict[str, Any] | None = None,
    on_error: Literal["error", "zero", "skip"] = "zero",
    reward_workers: int = 0,
    reward_timeout_s: float | None = None,
    prompt_key: str = "prompt",
) -> dict[str, float]:
    """`relayrl eval`: load a model into an engine and score it on a prompt file through the reward service.
    `reward` is a `RewardConfig` (what `relayrl eval`'s reward flags give), or a spec scored with `reward_kwargs`,
    `on_error`, `reward_workers` and `reward_timeout_s`. `reward_mean` is over the samples scored (a skipped one
    is left out); failures are counted, not hidden. `max_tokens=None` fits the model (`fit_max_tokens`)."""
    from relayrl.data.source import load_prompts
    from relayrl.errors import ConfigError
    from relayrl.models.loading import load_tokenizer, merged_model_dir
    from relayrl.rewards.service import build_reward_service
    from relayrl.rollout import build_engine

    if (
        n < 1
        or (max_tokens or 1) < 1
        or temperature < 0
        or not 0 <= min_tokens <= (max_tokens or min_tokens)
        or max_prompts < 0
    ):
        raise ConfigError(
            f"relayrl eval: need --n >= 1, --max-tokens >= 1, --temperature >= 0, 0 <= --min-tokens "
            f"<= --max-tokens, --max-prompts >= 0 (got {n}, {max_tokens}, {temperature}, {min_tokens}, "
            f"{max_prompts})"
        )
    model = merged_model_dir(model)  # a peft adapter directory (relayrl export) is merged into its base first
    tokenizer = load_tokenizer(model, key="--model")
    prompts, _ = load_prompts(data, tokenizer, max_prompt_tokens=10**9, prompt_key=prompt_key)  # context: below
    prompts = prompts[:max_prompts] if max_prompts else list(prompts)  # a large file's lazy table, read whole
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i].token_ids))
    max_tokens = fit_max_tokens(model, max_tokens, len(prompts[longest].token_ids), data, longest, prompt_key)
    if min_tokens > max_tokens:
        raise ConfigError(
            f"relayrl eval: --min-tokens {min_tokens} is over --max-tokens, which defaults to "
            f"{max_tokens} for this model and data; lower --min-tokens"
        )
    if isinstance(reward, str):
        deadline: dict[str, Any] = {} if reward_timeout_s is None else {"timeout_s": reward_timeout_s}
        reward = RewardConfig(
            fn=reward, kwargs=reward_kwargs or {}, on_error=on_error, workers=reward_workers, **deadline
        )
    max_len = max(len(p.token_ids) for p in prompts) + max_tokens
    sampling = Sampling(n=n, temperature=temperature, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed)
    with build_reward_service(reward) as rewards:  # before the engine: a spec that cannot load fails first
        rollouts = build_engine(engine, model, max_len, seed).generate(prompts, sampling, 0)
        scores, metrics = rewards.score(rollouts)
    scored = [s.reward for s in scores if s is not None]
    return {
        "reward_mean": sum(scored) / max(1, len(scored)),
        "n": len(rollouts),
        **{key: int(metrics[f"reward/{key}"]) for key in ("errors", "timeouts", "skipped")},
    }


DEFAULT_MAX_TOKENS = 64  # `relayrl eval`'s response budget when the model's generation config sets none


def fit_max_tokens(
    model: str, max_tokens: int | None, longest: int, data: str = "", row: int = 0, prompt_key: str = "prompt"
) -> int:
    """`--max-tokens`, or its default for this model: the generation config's `max_new_tokens` if set, else 64,
    capped so that the longest prompt (`longest` tokens, row index `row` of `data`) plus the response fits the
    model's context. Flags that cannot fit fail in `relayrl eval`'s terms."""
    from relayrl.errors import ConfigError
    from relayrl.models.loading import context_length

    context = context_length(model)
    if context is None or longest + (max_tokens or 1) <= context:  # fits: no row to name
        where = ""
    else:  # the file is read again only to name the row
        where = f"{data}:{_row_location(data, row, prompt_key)}" if data else f"row {row + 1}"
    if context is not None and longest >= context:
        raise ConfigError(
            f"relayrl eval: the longest prompt ({where}, {longest} tokens) fills the model's context "
            f"of {context} tokens, leaving no room for a response; shorten it or use --max-prompts"
        )
    if max_tokens is None:
        fitted = _generation_max_new_tokens(model) or DEFAULT_MAX_TOKENS
        return fitted if context is None else min(fitted, context - longest)
    if context is not None and longest + max_tokens > context:
        raise ConfigError(
            f"relayrl eval: --max-tokens {max_tokens} + the longest prompt ({where}, {longest} tokens) "
            f"exceed the model's context of {context} tokens: pass --max-tokens "
            f"{context - longest} or less (or leave it out to fit the model)"
        )
    return max_tokens


def _generation_max_new_tokens(model: str) -> int | None:
    """`max_new_tokens` from the model directory's generation_config.json, if the file sets it."""
    from pathlib import Path

    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_new_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _row_location(data: str, row: int, prompt_key: str) -> str:
    """The `line` (or `row N`) of the `row`-th prompt of a data file, as relayrl's data messages name it."""
    from relayrl.data.source import read_rows

    where = read_rows(data, prompt_key)[row][0]
    return where.rpartition(":")[2]
