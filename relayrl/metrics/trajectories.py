"""Trajectories, turn by turn: the `segments` of a logged sample, and the report's trajectory view.

At log time (`segments`, called by relayrl/metrics/samples.py for each logged sample) a rollout's response tokens
are cut into runs of one author: `policy` (tokens the engine sampled and the learner trains) and `env` (what the
environment, the tools or the agent's next call appended between turns: trained on never). A policy run also ends
where a turn ends (its last token carries the turn's reward). Each segment holds its text; a policy segment also
holds its tokens (each decoded on its own), the policy versions that sampled them, the turn's reward when one is
placed there, and per token the learner-minus-engine log-prob gap (the pre-update learner's log-prob of the token
minus the engine's behaviour log-prob: what `mismatch/*` and `drift/*` summarise), `null` for a token that is not
trained (DAPO's overlong filter). A single-turn sample is one policy segment.

`trajectories_section` renders, for the last logged step, the best and worst trajectories by reward: the prompt,
then each segment in order, policy tokens coloured by |gap| on a log scale (`gap_colour`) with the gap and version
in each token's tooltip and the versions on each turn. Left out: the prompt's own tokens (the engine did not sample them), per-token entropy.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the report renders segments without importing torch
    from relayrl.types import Rollout

SHOWN = 2  # best and worst trajectories shown
GAP_LOW, GAP_HIGH = -6.0, -1.0  # log10 |gap|: white at 1e-6 and below, full red at 0.1 and above
RED = (214, 39, 40)


def segments(
    rollout: Rollout, learner_logprobs: Sequence[float] | None, trained: Sequence[float], decode: Callable
) -> list[dict]:
    """The sample's segments (see the module docstring). `learner_logprobs` and `trained` are per response token
    (the learner's log-probs before the update, `None` when this run computed none; the loss mask), `decode` a
    tokenizer's `decode`."""
    ids = rollout.response_ids
    by_policy = rollout.loss_mask if rollout.loss_mask is not None else [1] * len(ids)
    turn_ends = dict(rollout.turn_rewards or [])  # index of a turn's last generated token -> its reward
    out, start = [], 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and by_policy[end] == by_policy[start] and (end - 1) not in turn_ends:
            continue
        if by_policy[start]:
            out.append(_policy(rollout, start, end, learner_logprobs, trained, turn_ends.get(end - 1), decode))
        else:
            out.append({"by": "env", "text": decode(ids[start:end])})
        start = end
    return out


def _policy(rollout: Rollout, start: int, end: int, learner, trained, reward, decode) -> dict:
    ids = rollout.response_ids[start:end]
    gaps = [
        _round(learner[k] - rollout.behaviour_logprobs[k]) if learner is not None and trained[k] else None
        for k in range(start, end)
    ]
    segment = {
        "by": "policy",
        "text": decode(ids),
        "tokens": [decode([token]) for token in ids],
        "gap": gaps,
        "versions": sorted(set(rollout.versions[start:end])),
    }
    return segment | ({"reward": float(reward)} if reward is not None else {})


def _round(value: float) -> float:
    return float(f"{value:.3g}")


# ---------------------------------------------------------------- the report's view
def gap_colour(gap: float | None) -> str:
    """A token's background: white for |gap| <= 1e-6, red for >= 0.1, log-linear between; none untrained."""
    if gap is None:
        return "transparent"
    level = (math.log10(abs(gap)) - GAP_LOW) / (GAP_HIGH - GAP_LOW) if gap else 0.0
    level = min(max(level, 0.0), 1.0)
    r, g, b = (round(255 + (c - 255) * level) for c in RED)
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
    legend = "".join(
        f'<span class="tok" style="background:{gap_colour(gap)}">{label}</span> '
        for gap, label in ((1e-7, "≤1e-6"), (1e-4, "1e-4"), (1e-2, "1e-2"), (1.0, "≥0.1"))
    )
    parts = [
        f"<h2>Trajectories</h2><p>Step {step}: the best and worst by reward, turn by turn. Policy tokens (sampled "
        "by the engine, trained) are coloured by |learner − engine| log-prob gap: "
        f"{legend}; hover a token for its gap. Grey blocks are what the environment or tools appended "
        "(not trained).</p>"
    ]
    parts += [_trajectory(row, "best") for row in best] + [_trajectory(row, "worst") for row in worst]
    return "\n".join(parts)


def _trajectory(row: dict, rank: str) -> str:
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
        tokens = "".join(
            f'<span class="tok" style="background:{gap_colour(gap)}" title="gap {_gap_text(gap)}">'
            f"{html.escape(token)}</span>"
            for token, gap in zip(segment["tokens"], segment["gap"], strict=True)
        )
        blocks.append(f'<div class="seg policy"><span class="label">{html.escape(label)}</span>{tokens}</div>')
    return f'<div class="trajectory"><h3>{html.escape(head)}</h3>' + "".join(blocks) + "</div>"


def _gap_text(gap: float | None) -> str:
    return "not trained" if gap is None else f"{gap:+.3g}"


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"
