"""Trajectories, turn by turn: the `segments` of a logged sample, and the report's trajectory view.

At log time (`segments`, called by relayrl/metrics/samples.py for each logged sample) a rollout's response tokens
are cut into runs of one author: `policy` (tokens the engine sampled and the learner trains) and `env` (what the
environment, the tools or the agent's next call appended between turns: trained on never). A policy run also ends
where a turn ends (its last token carries the turn's reward). Each segment holds its text; a policy segment also
holds its tokens (each decoded on its own), the policy versions that sampled them, the turn's reward when one is
placed there, and per token the learner-minus-engine log-prob gap (the pre-update learner's log-prob of the token
minus the engine's behaviour log-prob: what `mismatch/*` and `drift/*` summarise), `null` for a token that is not
trained (DAPO's overlong filter). In a run with a teacher (on-policy distillation, docs/distillation.md) a policy
segment also holds `teacher_gap` per token: the same pre-update learner log-prob minus the teacher's (the student's
log-prob minus the teacher's, the reverse-KL term whose mean is `distill/reverse_kl`), `null` where the token is not
trained; a run without a teacher has no such key. A single-turn sample is one policy segment.

`trajectories_section` renders, for the last logged step, the best and worst trajectories by reward: the prompt,
then each segment in order, policy tokens coloured by |gap| on a log scale (`gap_colour`, white to red) with the gap
in each token's tooltip and the versions on each turn. When the shown rows carry `teacher_gap`, tokens are coloured
by it instead (`teacher_colour`: orange where the student is more confident than the teacher, blue where less,
deeper as |teacher_gap| grows on a log scale), with both gaps in each tooltip. Left out: the prompt's own tokens
(the engine did not sample them), per-token entropy.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the report renders segments without importing torch
    from relayrl.types import Rollout

SHOWN = 2  # best and worst trajectories shown
GAP_LOW, GAP_HIGH = -6.0, -1.0  # log10 |gap|: white at 1e-6 and below, full red at 0.1 and above
RED = (214, 39, 40)
# log10 |teacher_gap| in nats: white at 0.01 and below, full colour at about 3 (the teacher e^3 times less or more sure)
TEACHER_LOW, TEACHER_HIGH = -2.0, 0.5
ORANGE = (255, 127, 14)  # log pi_student > log pi_teacher: the student more confident; distillation lowers the token
BLUE = (31, 119, 180)  # log pi_student < log pi_teacher: the student less confident; distillation raises the token


class TokenScores(NamedTuple):
    """Per response token: the learner's pre-update log-probs (None: none computed), the teacher's (None: no teacher),
    the loss mask."""

    learner: Sequence[float] | None
    teacher: Sequence[float] | None
    trained: Sequence[float]


def segments(
    rollout: Rollout,
    learner_logprobs: Sequence[float] | None,
    trained: Sequence[float],
    decode: Callable,
    teacher_logprobs: Sequence[float] | None = None,
) -> list[dict]:
    """The sample's segments (see the module docstring). `learner_logprobs`, `trained` and `teacher_logprobs` are
    per response token (the learner's log-probs before the update, `None` when this run computed none; the loss
    mask; the teacher's log-probs, `None` in a run without a teacher), `decode` a tokenizer's `decode`."""
    ids = rollout.response_ids
    by_policy = rollout.loss_mask if rollout.loss_mask is not None else [1] * len(ids)
    turn_ends = dict(rollout.turn_rewards or [])  # index of a turn's last generated token -> its reward
    scores, out, start = TokenScores(learner_logprobs, teacher_logprobs, trained), [], 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and by_policy[end] == by_policy[start] and (end - 1) not in turn_ends:
            continue
        if by_policy[start]:
            out.append(_policy(rollout, start, end, scores, turn_ends.get(end - 1), decode))
        else:
            out.append({"by": "env", "text": decode(ids[start:end])})
        start = end
    return out


def _policy(rollout: Rollout, start: int, end: int, scores: TokenScores, reward, decode) -> dict:
    """One policy segment: response tokens `start:end`."""
    learner, teacher, trained = scores
    ids, span = rollout.response_ids[start:end], range(start, end)
    segment = {
        "by": "policy",
        "text": decode(ids),
        "tokens": [decode([token]) for token in ids],
        "gap": _gaps(learner, rollout.behaviour_logprobs, trained, span),
        "versions": sorted(set(rollout.versions[start:end])),
    }
    if teacher is not None:  # on-policy distillation: log pi_student - log pi_teacher
        segment["teacher_gap"] = _gaps(learner, teacher, trained, span)
    return segment | ({"reward": float(reward)} if reward is not None else {})


def _gaps(minuend: Sequence[float] | None, subtrahend: Sequence[float], trained, span: range) -> list[float | None]:
    """minuend - subtrahend per token of `span`, rounded; None for an untrained token or without a minuend."""
    return [_round(minuend[k] - subtrahend[k]) if minuend is not None and trained[k] else None for k in span]


def _round(value: float) -> float:
    return float(f"{value:.3g}")


# ---------------------------------------------------------------- the report's view
def gap_colour(gap: float | None) -> str:
    """A token's background: white for |gap| <= 1e-6, red for >= 0.1, log-linear between; none untrained."""
    return "transparent" if gap is None else _shade(gap, GAP_LOW, GAP_HIGH, RED)


def teacher_colour(gap: float | None) -> str:
    """A token's background by its teacher-student gap: orange where the student is more confident than the teacher
    (gap > 0), blue where less; white for |gap| <= 0.01 nats, full colour from about 3, log-linear between; none
    untrained."""
    return "transparent" if gap is None else _shade(gap, TEACHER_LOW, TEACHER_HIGH, ORANGE if gap > 0 else BLUE)


def _shade(value: float, low: float, high: float, rgb: tuple[int, int, int]) -> str:
    """White blended towards `rgb` as log10 |value| runs from `low` to `high` (0 is white)."""
    level = (math.log10(abs(value)) - low) / (high - low) if value else 0.0
    level = min(max(level, 0.0), 1.0)
    r, g, b = (round(255 + (c - 255) * level) for c in rgb)
    return f"rgb({r},{g},{b})"


def trajectories_section(rows: list[dict]) -> str:
    """HTML: the SHOWN best and worst trajectories of the last logged step that has segments; empty when no row
    has any (a run from before segments were logged)."""
    logged = [row for row in rows if row.get("segments")]
    if not logged:
        return ""
    step = max(row["step"] for row in logged)
    ranked = sorted((row for row in logged if row["step"] == step), key=lambda row: -row["reward"])
    best = ranked[:SHOWN]
    worst = ranked[max(SHOWN, len(ranked) - SHOWN) :]
    teacher = any("teacher_gap" in segment for row in best + worst for segment in row["segments"])
    parts = [
        f"<h2>Trajectories</h2><p>Step {step}: the best and worst by reward, turn by turn. Policy tokens (sampled "
        f"by the engine, trained) are coloured by {_teacher_legend() if teacher else _gap_legend()}. Grey blocks "
        "are what the environment or tools appended (not trained).</p>"
    ]
    parts += [_trajectory(row, "best", teacher) for row in best] + [_trajectory(row, "worst", teacher) for row in worst]
    return "\n".join(parts)


def _gap_legend() -> str:
    swatches = "".join(
        f'<span class="tok" style="background:{gap_colour(gap)}">{label}</span> '
        for gap, label in ((1e-7, "≤1e-6"), (1e-4, "1e-4"), (1e-2, "1e-2"), (1.0, "≥0.1"))
    )
    return f"|learner − engine| log-prob gap: {swatches}; hover a token for its gap"


def _teacher_legend() -> str:
    swatches = "".join(
        f'<span class="tok" style="background:{teacher_colour(gap)}">{label}</span> '
        for gap, label in ((-5.0, "≤−3"), (-0.3, "−0.3"), (1e-3, "|gap|≤0.01"), (0.3, "+0.3"), (5.0, "≥+3"))
    )
    return (
        "the teacher-student gap, log π<sub>student</sub> − log π<sub>teacher</sub> in nats (the pre-update "
        "learner's log-prob minus the teacher's: the reverse-KL term whose mean is distill/reverse_kl): orange where "
        "the student is more confident than the teacher (distillation lowers the token), blue where it is less "
        f"(distillation raises it), deeper as |gap| grows on a log scale: {swatches}; hover a token for both gaps "
        "(teacher gap: student − teacher; gap: learner − engine)"
    )


def _trajectory(row: dict, rank: str, teacher: bool) -> str:
    """One trajectory's block; `teacher`: tokens coloured by their teacher-student gap, else by learner − engine."""
    head = (
        f"{rank}: sample {row.get('sample', '?')}, reward {_number(row.get('reward'))}, "
        f"finish {row.get('finish_reason', '?')}, {sum(s['by'] == 'policy' for s in row['segments'])} policy turns"
    )
    prompt = html.escape(str(row.get("prompt", "")))
    blocks = [f'<div class="seg prompt"><span class="label">prompt</span>{prompt}</div>']
    turn = 0
    for segment in row["segments"]:
        if segment["by"] != "policy":
            blocks.append(f'<div class="seg env"><span class="label">env</span>{html.escape(segment["text"])}</div>')
            continue
        turn += 1
        label = f"turn {turn} · version {', '.join(map(str, segment.get('versions', [])))}"
        if "reward" in segment:
            label += f" · turn reward {_number(segment['reward'])}"
        tokens = _teacher_tokens(segment) if teacher else _gap_tokens(segment)
        blocks.append(f'<div class="seg policy"><span class="label">{html.escape(label)}</span>{tokens}</div>')
    return f'<div class="trajectory"><h3>{html.escape(head)}</h3>' + "".join(blocks) + "</div>"


def _gap_tokens(segment: dict) -> str:
    """A policy segment's tokens, coloured by learner − engine gap, the gap in each tooltip."""
    return "".join(
        f'<span class="tok" style="background:{gap_colour(gap)}" title="gap {_gap_text(gap)}">'
        f"{html.escape(token)}</span>"
        for token, gap in zip(segment["tokens"], segment["gap"], strict=True)
    )


def _teacher_tokens(segment: dict) -> str:
    """A policy segment's tokens, coloured by teacher-student gap, both gaps in each tooltip (a segment without
    teacher gaps shows its tokens uncoloured)."""
    teacher_gaps = segment.get("teacher_gap") or [None] * len(segment["gap"])
    return "".join(
        f'<span class="tok" style="background:{teacher_colour(teacher_gap)}" '
        f'title="teacher gap {_gap_text(teacher_gap)} · gap {_gap_text(gap)}">{html.escape(token)}</span>'
        for token, gap, teacher_gap in zip(segment["tokens"], segment["gap"], teacher_gaps, strict=True)
    )


def _gap_text(gap: float | None) -> str:
    return "not trained" if gap is None else f"{gap:+.3g}"


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"
