"""`relayrl reward FILE --reward SPEC`: a reward dry-run, scoring written completions without a model.

Each row of a jsonl/parquet file holds a `completion` (string) beside `prompt` or `messages` and any other
columns; the rows are scored through the same reward service as training (`reward.workers`, `timeout_s`,
`on_error`, `max_error_frac`, conventions.py's TRL/verl styles), and one JSON object per row is printed (`row` =
file:line, `reward`, `components`, and `error` for a row scored 0 because its reward failed; `reward` is null for
a sample dropped under `--on-error skip`), then a summary line (`reward_mean` over the scored rows, `n`,
`skipped`, `errors`, `timeouts`). As in training, failures on `--max-error-frac` of the rows or more stop with
the count and the first failure (default 1: only when every row fails). The reward flags are
relayrl/commands/reward_flags.py's.

No tokenizer is loaded: a `messages` row's prompt text (what relayrl-style functions get) is its contents
joined, and `completion_ids` (TRL's) come from a `completion_ids` column when the file has one, else are empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayrl.commands.reward_flags import add_reward_flags, reward_config

if TYPE_CHECKING:
    from relayrl.config import RewardConfig
    from relayrl.types import Rollout

NOT_COLUMNS = ("prompt", "messages", "completion", "completion_ids")  # what the row is, not what travels with it


def read_completions(path: str, prompt_key: str = "prompt") -> list[Rollout]:
    """One rollout per row; a row without a string `completion` (or with bad `completion_ids`) names file:row.
    `prompt_key`: the column holding the prompt (data.prompt_key); it stays a column, as in training."""
    from relayrl.data.source import chat_messages, is_plain_prompt, read_rows, render
    from relayrl.errors import DataError
    from relayrl.types import Prompt, Rollout

    rollouts = []
    for where, row in read_rows(path, prompt_key):  # checks prompt/messages, naming file:row
        completion = row.get("completion")
        if not isinstance(completion, str):
            raise DataError(
                f"{where}: 'completion' must be a string (the response to score), got "
                f"{completion!r}" + ("" if "completion" in row else f"; found columns {sorted(row)}")
            )
        ids = row.get("completion_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise DataError(f"{where}: 'completion_ids' must be a list of token ids, got {ids!r}")
        prompt = Prompt(
            id=where,
            text=render(row, None, chat_template=False, where=where),
            token_ids=[],
            columns={k: v for k, v in row.items() if k not in NOT_COLUMNS},
            messages=None if is_plain_prompt(row) else list(chat_messages(row)),
        )
        rollouts.append(
            Rollout(
                prompt=prompt,
                group_index=0,
                response_ids=list(ids or []),
                response_text=completion,
                behaviour_logprobs=[],
                finish_reason="stop",
                versions=[],
            )
        )
    return rollouts


def register(commands) -> None:
    rw = commands.add_parser(
        "reward",
        help="a reward dry-run: score the `completion` of each row of a jsonl/parquet "
        "file through the reward service; one JSON line per row, then reward_mean, n, skipped, "
        "errors, timeouts",
    )
    rw.add_argument("file", metavar="FILE", help="rows with `completion` plus `prompt` or `messages` and any columns")
    rw.add_argument("--prompt-key", default="prompt", help="the column holding the prompt (data.prompt_key)")
    add_reward_flags(rw, required=True, old_names=True)
    rw.set_defaults(fn=run)


def run(args) -> None:
    """One JSON line per row, then the summary."""
    for line in score_file(args.file, reward_config(args, "relayrl reward"), args.prompt_key):
        print(json.dumps(line), flush=True)


def score_file(path: str, config: RewardConfig, prompt_key: str = "prompt") -> Iterator[dict[str, Any]]:
    """The per-row results, then the summary (the last item)."""
    from relayrl.rewards.base import load_reward
    from relayrl.rewards.service import build_reward_service

    rollouts = read_completions(path, prompt_key)
    load_reward(config.fn, config.kwargs, config.style)  # first: a bad spec fails before a worker starts, announced
    with build_reward_service(config) as service:
        scores, metrics = service.score(rollouts)
    for rollout, score in zip(rollouts, scores):
        yield {
            "row": rollout.prompt.id,
            "reward": None if score is None else score.reward,
            "components": {} if score is None else score.components,
            **({"error": score.error} if score is not None and score.error else {}),
        }
    scored = [s.reward for s in scores if s is not None]
    yield {
        "reward_mean": sum(scored) / max(1, len(scored)),
        "n": len(rollouts),
        **{key: int(metrics[f"reward/{key}"]) for key in ("skipped", "errors", "timeouts")},
    }
