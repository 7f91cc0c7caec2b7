"""`samples.jsonl`: what the policy actually wrote, for a few samples of every K-th step (`log.samples`).

One row per logged sample: `step`, `sample` (`<prompt id>#<index in its group>`), `prompt` and `completion`
text, `reward` and its `components`, `advantage`, `versions` (the policy versions that produced its tokens,
ascending; more than one when a partial rollout spans pushes), `finish_reason` and `tokens` (response length), `segments` (the trajectory turn by turn, with the
learner-vs-engine log-prob gap per sampled token and, in a run with a teacher, the student-minus-teacher one:
relayrl/metrics/trajectories.py),
`images` for a prompt with pictures (PNG thumbnails: relayrl/metrics/sample_images.py), and `reward_error` for a sample whose reward failed and was scored 0 (`reward.on_error=zero`: which sample, what
was raised or returned). `advantage` is the mean of the sample's per-token advantages over its trained response tokens (outcome
estimators such as GRPO give every token the same value; GAE does not), `null` when none of its tokens is
trained (the DAPO overlong filter). A logged step keeps its first `max_per_step` samples in batch order,
which is prompt-major: whole groups, so a sample can be read against the others of its prompt.

The file is appended once per logged step. Before each step it is checked: rows at or after the current step
(left by an earlier run in the same directory, or by a resumed run's steps after its checkpoint) and a row cut
short by a kill are dropped first, so a resumed run never duplicates rows. `samples_section` renders the best
and worst samples of the first, middle and last logged steps for `relayrl report`, then the trajectory view. Left out: logging every
sample (a run's text is large), the prompt's other dataset columns.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.metrics.sample_images import images_html, thumbnails
from relayrl.metrics.trajectories import segments, trajectories_section
from relayrl.run.jsonl import read_jsonl, truncate_after

if TYPE_CHECKING:  # the report reads samples.jsonl without importing torch
    from relayrl.types import Experience, Rollout, Score

FILE = "samples.jsonl"
SHOWN = 3  # best and worst samples shown per chosen step in the report
TEXT_CHARS = 600  # longer prompts/completions are cut in the report (the file keeps them whole)

__all__ = ["FILE", "log_samples", "logged_rows", "sample_rows", "samples_section", "truncate_after"]


def logged_step(every: int, step: int, last_step: int) -> bool:
    """Whether `step` writes samples (log.samples.every): a multiple of `every`, or the last step (0: never)."""
    return bool(every) and (step % every == 0 or step == last_step)


def logged_rows(every: int, max_per_step: int, step: int, last_step: int) -> int:
    """How many first rows of `step`'s batch `log_samples` writes (0 on a step it skips): the rows whose
    pre-update log-probs the step asks the learner for (`UpdateResult.sample_logprobs`)."""
    return max_per_step if logged_step(every, step, last_step) else 0


def sample_rows(
    step: int,
    rollouts: list[Rollout],
    scores: list[Score],
    exp: Experience,
    max_per_step: int,
    decode: Callable | None = None,
    learner_logprobs: list[list[float]] | None = None,
) -> list[dict]:
    """The rows of one step: its first `max_per_step` samples; `exp` must hold the step's advantages. With a
    tokenizer's `decode`, each row also has its `segments` (relayrl/metrics/trajectories.py), their gaps from
    `learner_logprobs` (the learner's pre-update log-probs of the first rows, [row][target column]) and, when the
    teacher scored the step, `exp.teacher_logprobs`."""
    from relayrl.types import filled  # here, not at the top: the report reads samples.jsonl without torch

    count = min(max_per_step, len(rollouts))
    mask = exp.loss_mask[:count]  # [n, T-1]
    trained = mask.sum(dim=1)
    advantages = filled(exp.advantages, "advantages")[:count]
    advantage = (advantages * mask).sum(dim=1) / trained.clamp(min=1)  # [n] sequence means
    rows = []
    for index in range(count):
        rollout, score = rollouts[index], scores[index]
        rows.append(
            {
                "step": step,
                "sample": rollout.sample_id,
                "prompt": rollout.prompt.text,
                "completion": rollout.response_text,
                "reward": float(score.reward),
                "components": {name: float(value) for name, value in score.components.items()},
                "advantage": float(advantage[index]) if trained[index] > 0 else None,
                "versions": sorted(set(rollout.versions)),
                "finish_reason": rollout.finish_reason,
                "tokens": len(rollout.response_ids),
                **({"reward_error": score.error} if score.error else {}),
                **({"images": thumbnails(rollout.prompt.images)} if rollout.prompt.images else {}),
                **({"segments": _segments(rollout, exp, index, decode, learner_logprobs)} if decode else {}),
            }
        )
    return rows


def _segments(rollout: Rollout, exp: Experience, index: int, decode: Callable, learner_rows) -> list[dict]:
    """Row `index`'s segments: its learner and teacher log-probs and loss mask cut to its response tokens (the
    target column of response token k is prompt length - 1 + k, relayrl/learner/batching.py)."""
    first = len(rollout.prompt.token_ids) - 1
    columns = slice(first, first + len(rollout.response_ids))
    learner = learner_rows[index][columns] if learner_rows is not None and index < len(learner_rows) else None
    teacher = exp.teacher_logprobs[index, columns].tolist() if exp.teacher_logprobs is not None else None
    return segments(rollout, learner, exp.loss_mask[index, columns].tolist(), decode, teacher)


def log_samples(
    run_dir: Path,
    every: int,
    max_per_step: int,
    step: int,
    last_step: int,
    rollouts: list[Rollout],
    scores: list[Score],
    exp: Experience,
    decode: Callable | None = None,
    learner_logprobs: list[list[float]] | None = None,
) -> None:
    """Append this step's rows to `<run_dir>/samples.jsonl` when `step` is a multiple of `every` or the last
    step (`every=0`: never). Rows left from steps at or after this one are dropped first (see the docstring)."""
    path = Path(run_dir) / FILE
    if step == 0:  # a fresh run: whatever an earlier run left here is not this run's
        path.unlink(missing_ok=True)
    elif _needs_cut(path, step):
        truncate_after(path, step - 1)
    if not logged_step(every, step, last_step):
        return
    rows = sample_rows(step, rollouts, scores, exp, max_per_step, decode, learner_logprobs)
    with path.open("a") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))


def _needs_cut(path: Path, step: int) -> bool:
    """Whether the file ends with a row at or after `step`, or with a row cut short. Rows are appended in step
    order, so the last line is enough; only the file's tail is read."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        tail = f.read()
    lines = [line for line in tail.splitlines() if line.strip()]
    try:  # a last row without its newline was cut short too: the next append would join it
        return not tail.endswith(b"\n") or not lines or json.loads(lines[-1])["step"] >= step
    except (json.JSONDecodeError, KeyError, TypeError):
        return True


# ---------------------------------------------------------------- the report's table
def samples_section(run_dir: Path, notes: list[str]) -> str:
    """HTML: for the first, middle and last logged steps, the SHOWN best and worst samples by reward.
    Empty when the run has no samples.jsonl (sample logging off)."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return ""
    rows = read_jsonl(path, {"step": int, "reward": (int, float)}, notes)
    if not rows:
        return f'<h2>Samples</h2><p class="note">{html.escape(str(path))} has no rows yet</p>'
    steps = sorted({row["step"] for row in rows})
    chosen = dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]])
    parts = [
        "<h2>Samples</h2>",
        f"<p>From {html.escape(FILE)} ({len(rows)} rows over {len(steps)} logged steps): the best and worst "
        f"{SHOWN} by reward of the first, middle and last logged steps. Advantage: the mean of the sample's "
        "per-token advantages over its trained tokens.</p>",
    ]
    for step in chosen:
        ranked = sorted((row for row in rows if row["step"] == step), key=lambda row: -row["reward"])
        shown = ranked if len(ranked) <= 2 * SHOWN else ranked[:SHOWN] + [None] + ranked[-SHOWN:]
        parts.append(f"<h3>step {step} ({len(ranked)} samples logged)</h3>")
        parts.append(_table(shown))
    parts.append(trajectories_section(rows))
    return "\n".join(parts)


COLUMNS = ("sample", "reward", "components", "advantage", "versions", "finish", "prompt", "completion")


def _table(rows: Sequence[dict | None]) -> str:
    head = "".join(f"<th>{name}</th>" for name in COLUMNS)
    body = []
    for row in rows:
        if row is None:  # between the best and the worst
            body.append(f'<tr><td colspan="{len(COLUMNS)}">…</td></tr>')
            continue
        cells = (
            f'<td class="{"text" if name in ("prompt", "completion") else "value"}">'
            f"{images_html(row) if name == 'prompt' else ''}{html.escape(_cell(row, name))}</td>"
            for name in COLUMNS
        )
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="samples"><tr>{head}</tr>' + "".join(body) + "</table>"


def _cell(row: dict, name: str) -> str:
    """One cell's plain text (the caller escapes it)."""
    if name == "finish":
        return str(row.get("finish_reason", ""))
    value = row.get(name)
    if name in ("prompt", "completion"):
        text = str(value if value is not None else "")
        return text if len(text) <= TEXT_CHARS else f"{text[:TEXT_CHARS]}… (+{len(text) - TEXT_CHARS} chars)"
    if name == "components":
        return ", ".join(f"{k} {_number(v)}" for k, v in (value or {}).items())
    if name == "versions":
        return ", ".join(str(v) for v in value or [])
    return _number(value) if name in ("reward", "advantage") else str(value if value is not None else "")


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"
