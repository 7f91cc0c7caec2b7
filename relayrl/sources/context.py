"""How long a sequence the engines hold (their `max_model_len`): settled once, before anything is built or written.

`context_budget` takes the longest prompt the data holds and returns the engines' context: that prompt plus what a
rollout may add after it (`rollout.max_tokens`; for a multi-turn trajectory, `env.max_total_tokens` when larger),
checked against the model's own context, so a run too long for it fails at start rather than on its last turn.
An agent (env.agent, a TRL or verifiers environment) or env.tools renders its own prompts (a tools block, a system
turn), so its engines get the model's whole context when the model states one; the driver keeps each call in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config.env import EnvConfig
    from relayrl.config.rollout import RolloutConfig


def context_budget(
    longest_prompt: int, rollout: RolloutConfig, env: EnvConfig, model_path: str, max_prompt_tokens: int
) -> int:
    """The engines' context for prompts of at most `longest_prompt` tokens; a ConfigError (naming the keys to
    lower) when a rollout cannot fit the model at `model_path` (`max_prompt_tokens`: data.max_prompt_tokens, named
    in the messages)."""
    from relayrl.models.loading import context_length
    from relayrl.sources.multi_turn import agent_of

    limit = context_length(model_path)
    if env.multi_turn and limit is not None and longest_prompt + env.max_total_tokens > limit:
        total = longest_prompt + env.max_total_tokens
        raise ConfigError(
            f"the longest prompt ({longest_prompt} tokens; data.max_prompt_tokens={max_prompt_tokens}) "
            f"plus env.max_total_tokens={env.max_total_tokens} is {total} tokens, over the model's context "
            f"of {limit} (max_position_embeddings of model.path={model_path}): lower env.max_total_tokens "
            "or data.max_prompt_tokens"
        )
    after = max(rollout.max_tokens, env.max_total_tokens) if env.multi_turn else rollout.max_tokens
    max_len = longest_prompt + after
    if limit is not None and max_len > limit:
        raise ConfigError(
            f"the longest prompt plus rollout.max_tokens={rollout.max_tokens} is {max_len} "
            f"tokens, over the model's context of {limit}: lower data.max_prompt_tokens="
            f"{max_prompt_tokens} or rollout.max_tokens"
        )
    if agent_of(env) is None and not env.tools:  # env.tools: the tools block is in every prompt
        return max_len
    return max(max_len, limit or max_len)
