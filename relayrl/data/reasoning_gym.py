"""reasoning-gym's procedural tasks as prompt rows, and the task's own scorer as a reward.

`data.train: reasoning_gym:TASK` (and `data.eval`, `relayrl data check`, `relayrl eval --data`: anywhere a prompt
file goes) opens the task's dataset through `reasoning_gym.create_dataset(TASK, **options)`. The options follow a
`?` as `key=value` pairs joined by `&`, each value read as YAML (`3`, `0.5`, `true`, `[+, -]`):

    reasoning_gym:chain_sum?size=1000&seed=0&min_terms=2&max_terms=3&max_digits=1

`size` and `seed` are every task's own config fields; `size` defaults to the task's default (usually 500) and `seed`
to 0 (reasoning-gym's own default, None, draws a different dataset each run). An option the task's config does not
have is an error naming it and listing the task's options. Entries are generated when a row is read, so a size over
relayrl's eager limit is read lazily as any large file is. Row i is `{prompt: question, answer, metadata}`, located
as `reasoning_gym:TASK?...:row i`; every column reaches the reward.

`reward.fn: reasoning_gym` (`score`) scores each completion with `score_answer` of the task named by the row's
`metadata.source_dataset` (reasoning-gym's `get_score_answer_fn`), so a jsonl exported from reasoning-gym scores
the same. `reward.kwargs.answer_tag: answer` scores only the last `<answer>...</answer>` of the completion (as
reasoning-gym's system prompts ask); '' (the default) scores the whole completion, stripped.

Left out: reasoning-gym's curricula (a dataset here is fixed for the run) and its `composite` weighting syntax
beyond what the `composite` task's own options take.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable
from typing import Any

from relayrl.errors import DataError, RewardError

PREFIX = "reasoning_gym:"
DEFAULT_SEED = 0
INSTALL = "pip install --no-deps -r requirements/cpu.lock (or the `ecosystem` extra: pip install 'relayrl[ecosystem]')"


def is_spec(path: object) -> bool:
    """Whether a data path is a reasoning-gym spec rather than a file."""
    return isinstance(path, str) and path.startswith(PREFIX)


def _reasoning_gym(what: str, error: type[Exception] = DataError):
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError:
        raise error(f"{what} needs the reasoning-gym package, which is not installed: {INSTALL}") from None
    return reasoning_gym


def parse_spec(spec: str, prefix: str = PREFIX) -> tuple[str, dict[str, Any]]:
    """`reasoning_gym:TASK?k=v&k2=v2` -> (TASK, {k: v, k2: v2}), the values read as YAML scalars or lists (also
    `verifiers:TASKSET?...`'s, with its `prefix`)."""
    import yaml

    task, _, query = spec.removeprefix(prefix).partition("?")
    if not task:
        example = "reasoning_gym:chain_sum?size=1000&seed=0" if prefix == PREFIX else f"{prefix}NAME?option=value"
        raise DataError(f"{spec!r}: name a task after '{prefix}' (e.g. {example})")
    options: dict[str, Any] = {}
    for pair in filter(None, query.split("&")):
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise DataError(f"{spec!r}: option {pair!r} is not key=value")
        if key in options:
            raise DataError(f"{spec!r}: option {key!r} is given twice")
        try:
            options[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as err:
            raise DataError(f"{spec!r}: option {key}={value!r} is not a YAML value: {err}") from None
    return task, options


class ReasoningGymRows:
    """The rows of one reasoning-gym dataset, in the shape relayrl/data/rows.py's readers have (`len`, `read`,
    `path`); an entry is generated when its row is read."""

    def __init__(self, spec: str):
        self.path = spec
        self.dataset = open_dataset(spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def read(self, i: int) -> tuple[str, dict[str, Any]]:
        entry = self.dataset[int(i)]
        return f"{self.path}:row {i}", {
            "prompt": entry["question"],
            "answer": entry["answer"],
            "metadata": entry["metadata"],
        }


def open_dataset(spec: str):
    """The `ProceduralDataset` a spec names, every option checked against the task's config."""
    task, options = parse_spec(spec)
    reasoning_gym = _reasoning_gym(repr(spec))
    tasks = reasoning_gym.factory.DATASETS
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise DataError(f"{spec!r}: reasoning-gym has no task {task!r} ({hint}{len(tasks)} tasks: {', '.join(tasks)})")
    fields = [field.name for field in dataclasses.fields(tasks[task][1])]
    unknown = [key for key in options if key not in fields]
    if unknown:
        raise DataError(
            f"{spec!r}: {', '.join(map(repr, unknown))} {'is not an option' if len(unknown) == 1 else 'are not options'}"
            f" of reasoning-gym's {task} (its options: {', '.join(fields)})"
        )
    options.setdefault("seed", DEFAULT_SEED)
    try:
        return reasoning_gym.create_dataset(task, **options)
    except (AssertionError, ValueError, TypeError) as err:  # a config's validate() asserts its ranges
        raise DataError(f"{spec!r}: reasoning-gym refuses the options {options}: {err or type(err).__name__}") from None


@functools.cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    reasoning_gym = _reasoning_gym(f"reward 'reasoning_gym' (task {task!r})", RewardError)
    if task not in reasoning_gym.factory.DATASETS:
        raise RewardError(f"reward 'reasoning_gym': metadata.source_dataset={task!r} is not a reasoning-gym task")
    scorer: Any = reasoning_gym.get_score_answer_fn(
        task
    )  # typed Callable[[], float] upstream; it takes (answer, entry)
    return scorer


def score(prompts: list[str], completions: list[str], answer_tag: str = "", **columns: Any) -> list[float]:
    """Each completion scored by its task's `score_answer` (0..1; some tasks give partial credit)."""
    for name in ("answer", "metadata"):
        if name not in columns:
            raise RewardError(
                f"reward 'reasoning_gym' needs an '{name}' column (data.train: reasoning_gym:TASK gives one); "
                f"found {sorted(columns)}"
            )
    from reasoning_gym.utils import extract_answer

    scores = []
    for prompt, completion, gold, metadata in zip(prompts, completions, columns["answer"], columns["metadata"]):
        if not isinstance(metadata, dict) or not isinstance(metadata.get("source_dataset"), str):
            raise RewardError(
                f"reward 'reasoning_gym': a row's metadata needs a 'source_dataset' (the task's name), got {metadata!r}"
            )
        given = extract_answer(completion, tag_name=answer_tag) if answer_tag else completion.strip()
        entry = {"question": prompt, "answer": gold, "metadata": metadata}
        scores.append(float(_scorer(metadata["source_dataset"])(given, entry)))
    return scores
