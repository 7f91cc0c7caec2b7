"""The prompts a run reads: `data` (the training and held-out files, how a prompt is read and capped) and `eval`
(how the held-out prompts are evaluated)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.section import INPUT_PATH_RULE, Section


class DataConfig(Section):
    train: str = Field(
        default="",
        description="Training prompts: a .jsonl or .parquet file, or a `datasets` save_to_disk directory, with "
        "`prompt` or `messages`; or `reasoning_gym:TASK?size=N&seed=S&option=value`, or a verifiers taskset's "
        "tasks, `verifiers:TASKSET?option=value` (docs/ecosystem.md). " + INPUT_PATH_RULE,
    )
    eval: str | None = Field(
        default=None,
        description="Held-out prompts, same format; evaluated before and after training. Relative: as data.train.",
    )
    max_prompt_tokens: int = Field(default=256, ge=1, description="Longest prompt, in tokens, after the chat template.")
    on_long_prompt: Literal["error", "drop", "truncate"] = Field(
        default="error",
        description="What to do with a longer prompt: fail naming it, drop it, or keep its last tokens.",
    )
    chat_template: bool = Field(
        default=True,
        description="Render `messages` rows with the tokenizer's chat template (`prompt` rows are used as-is).",
    )
    shuffle: bool = Field(default=True, description="Shuffle the training prompts each epoch (seeded by train.seed).")
    prompt_key: str = Field(
        default="prompt",
        min_length=1,
        description="The column that holds each row's prompt in data.train and data.eval (and train_data): text, "
        "or a chat list (then read as `messages`), e.g. `question` for a dataset that names it so. The column stays "
        "a column too (reward functions get it by name); a row that also has `prompt` or `messages` is refused.",
    )


class EvalConfig(Section):
    every: int = Field(
        default=0, ge=0, description="Evaluate held-out accuracy every N steps (0 = only before and after)."
    )
    max_prompts: int = Field(default=0, ge=0, description="Evaluate on at most this many held-out prompts (0 = all).")
    temperature: float = Field(
        default=1.0, gt=0, description="Temperature of the sampled evaluation (greedy is also run)."
    )
