"""`relayrl report RUN_DIR`: one self-contained HTML page (plus its PNGs) describing a finished or running run.

Reads from RUN_DIR:
  - `metrics.jsonl` (required): one JSON object per step with at least `step`; every other key is optional and
    a plot whose metric is absent is replaced by a note. `null` values (non-finite at log time) are skipped.
    An empty file (no step finished yet) gives a page that says so; a last line cut short by a kill is left
    out with a note (relayrl/run/jsonl.py), as in the other JSONL files.
  - `eval.json` (optional): `{"before": {"greedy": .., "sampled": ..}, "after": {...}}`.
  - `config.yaml` (optional): shown verbatim, collapsed.
  - `timeline.jsonl` (optional): one JSON object per phase run, `{"step": int, "role": str, "phase": str,
    "start": float, "end": float}` with `start`/`end` in seconds on one clock shared by all roles (only
    differences are drawn). The timeline plot is drawn only when this file exists, over the last
    TIMELINE_STEPS steps.
  - multi-turn runs (`env.*`) add a turns-per-trajectory plot from `env/turns_mean`, `env/turns_max`,
    `env/success` and `env/truncated_frac`; runs without them get no turns note.
  - `samples.jsonl` (optional, `log.samples`): a table of the best and worst samples of the first, middle and
    last logged steps (relayrl/metrics/samples.py), then the trajectory view of the last logged step's best and
    worst samples, turn by turn, each sampled token coloured by its learner-vs-engine log-prob gap
    (relayrl/metrics/trajectories.py); all text HTML-escaped.

Writes RUN_DIR/report/index.html (PNGs embedded as base64 data URIs, inline CSS, no external resources) and
the PNGs next to it. Leaves out: live refresh, comparison of several runs, interactive plots.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from relayrl.errors import DataError
from relayrl.metrics.sample_images import CSS as SAMPLE_IMAGE_CSS
from relayrl.metrics.samples import samples_section
from relayrl.run.jsonl import read_jsonl

PHASES = (
    "generate",
    "reward",
    "logprobs",
    "advantage",
    "update",
    "swap",
    "sync",
    "wait",
)  # swap: colocated time-sharing; wait: async learner idle
PHASE_COLORS: dict[str, str] = dict(
    zip(PHASES, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#2ca02c", "#937860", "#bbbbbb"), strict=True)
)
EXTRA_COLORS = ("#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
TIMELINE_STEPS = 8
TIMELINE_KEYS = {"step": int, "role": str, "phase": str, "start": (int, float), "end": (int, float)}


def load_metrics(run_dir: Path, notes: list[str]) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: not found (is {run_dir} a run directory?)")
    return sorted(read_jsonl(path, {"step": int}, notes), key=lambda row: row["step"])


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows where `key` is a finite number."""
    points = [
        (row["step"], float(row[key]))
        for row in rows
        if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
    ]
    return [s for s, _ in points], [v for _, v in points]


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(8, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)  # explicit Agg canvas: no pyplot, no global backend state
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_reward(rows: list[dict], evals: dict) -> Figure | str:
    steps, mean = series(rows, "reward/mean")
    if not steps:
        return "no `reward/mean` in metrics.jsonl"
    fig, ax = _figure("Reward (mean ± std) and held-out accuracy", "step", "reward / accuracy")
    ax.plot(steps, mean, color="#4c72b0", label="reward/mean")
    std_steps, std = series(rows, "reward/std")
    if std_steps == steps:
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, std)],
            [m + s for m, s in zip(mean, std)],
            color="#4c72b0",
            alpha=0.2,
            label="± reward/std",
        )
    last = rows[-1]["step"]
    for mode, marker in (("greedy", "o"), ("sampled", "s")):
        eval_steps, accuracy = series(rows, f"eval/{mode}")
        for when, at in (("before", -1), ("after", last)):
            if isinstance(evals.get(when, {}).get(mode), (int, float)):
                eval_steps, accuracy = eval_steps + [at], accuracy + [evals[when][mode]]
        if eval_steps:
            order = sorted(range(len(eval_steps)), key=eval_steps.__getitem__)
            ax.plot(
                [eval_steps[i] for i in order],
                [accuracy[i] for i in order],
                marker=marker,
                linestyle=":",
                label=f"eval/{mode}",
            )
    ax.legend(loc="best", fontsize="small")
    return fig


def plot_phase_times(rows: list[dict]) -> Figure | str:
    present = [p for p in PHASES if series(rows, f"time/{p}")[0]]
    if not present:
        return "no `time/<phase>` metrics in metrics.jsonl"
    fig, ax = _figure("Time per step by phase (bars) vs whole step (line)", "step", "seconds")
    steps = [row["step"] for row in rows]
    bottom = [0.0] * len(rows)
    for phase in present:
        seconds = [_number(row.get(f"time/{phase}")) for row in rows]
        ax.bar(steps, seconds, bottom=bottom, width=0.8, color=PHASE_COLORS[phase], label=phase)
        bottom = [b + s for b, s in zip(bottom, seconds)]
    step_steps, step_time = series(rows, "time/step")
    if step_steps:
        ax.plot(step_steps, step_time, color="black", marker=".", label="time/step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return fig


def plot_timeline(timeline: list[dict]) -> Figure | str:
    """The last TIMELINE_STEPS steps, one bar row per role: a whole run's phases are too thin to read, and the
    steady state is where a role waiting on another (a bubble) matters."""
    if not timeline:
        return "timeline.jsonl has no rows yet"
    steps = sorted({row["step"] for row in timeline})[-TIMELINE_STEPS:]
    shown = [row for row in timeline if row["step"] >= steps[0]]
    roles = sorted({row["role"] for row in shown})
    origin = min(row["start"] for row in shown)
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    fig, ax = _figure(f"Phase timeline by role, {span}", "seconds since the first phase shown", "")
    ax.set_yticks(range(len(roles)), roles)
    ax.invert_yaxis()
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}  # one broken_barh per (role, phase)
    for row in shown:
        bars.setdefault((row["role"], row["phase"]), []).append((row["start"] - origin, row["end"] - row["start"]))
    colors = dict(PHASE_COLORS)
    for phase in dict.fromkeys(row["phase"] for row in shown):
        if phase not in colors:  # phases we do not know (a user's) cycle through the extra colours
            colors[phase] = EXTRA_COLORS[(len(colors) - len(PHASE_COLORS)) % len(EXTRA_COLORS)]
    for (role, phase), spans in bars.items():
        ax.broken_barh(
            spans, (roles.index(role) - 0.3, 0.6), facecolors=colors[phase], edgecolor="white", linewidth=0.5
        )
    used = dict.fromkeys(row["phase"] for row in shown)
    ax.legend(
        handles=[Patch(color=colors[phase], label=phase) for phase in used],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize="x-small",
        ncols=1 + (len(used) - 1) // 14,
    )
    return fig


def plot_staleness(rows: list[dict]) -> Figure | str:
    hists = [(key, series(rows, key)[1]) for key in ("stale/mean", "stale/max")]
    hists = [(key, values) for key, values in hists if values]
    if not hists:
        return "no `stale/mean` or `stale/max` in metrics.jsonl"
    fig, ax = _figure("Staleness of rollouts (policy versions behind), over steps", "versions behind", "steps")
    # bins of width 0.5 centred on 0, 0.5, 1, ...: whole versions line up and a synchronous run is one bar at 0
    top = math.ceil(max(max(values) for _, values in hists))
    edges = [i / 2 - 0.25 for i in range(2 * top + 2)]
    ax.hist([values for _, values in hists], bins=edges, label=[key for key, _ in hists])
    ax.legend(loc="best", fontsize="small")
    return fig


def plot_mismatch(rows: list[dict]) -> Figure | str:
    """Numerical mismatch (samples with no version lag) beside policy drift (lagged samples, off-policy runs)."""
    return _lines(
        rows,
        ("mismatch/logprob_abs_mean", "mismatch/logprob_abs_max", "drift/logprob_abs_mean", "drift/logprob_abs_max"),
        "Engine vs learner log-probs: mismatch (no lag) and drift (lagged)",
        "|Δ log-prob|",
        log=True,
    )


def plot_length(rows: list[dict]) -> Figure | str:
    return _lines(rows, ("response/length_mean", "response/length_max"), "Response length", "tokens", log=False)


def plot_turns(rows: list[dict]) -> Figure | str:
    """Multi-turn runs: turns per trajectory (mean and longest) and, on a second axis, the share that ended
    in success or was truncated."""
    fig = _lines(rows, ("env/turns_mean", "env/turns_max"), "Turns per trajectory", "turns", log=False)
    if isinstance(fig, str):
        return fig
    ax = fig.axes[0]
    ax.set_ylim(bottom=0)
    shares = [(key, *series(rows, key)) for key in ("env/success", "env/truncated_frac")]
    if any(steps for _, steps, _ in shares):
        right = ax.twinx()
        right.set(ylabel="fraction of trajectories", ylim=(-0.02, 1.02))
        for (key, steps, values), color in zip(shares, EXTRA_COLORS):
            right.plot(steps, values, linestyle="--", color=color, label=key)
        right.legend(loc="lower right", fontsize="small")
    return fig


def _lines(rows: list[dict], keys: tuple[str, ...], title: str, ylabel: str, log: bool) -> Figure | str:
    curves = [(key, *series(rows, key)) for key in keys]
    if not any(steps for _, steps, _ in curves):
        return f"no {' or '.join(f'`{k}`' for k in keys)} in metrics.jsonl"
    # a log axis cannot show zeros (an exactly-synced engine); fall back to linear when nothing is positive
    log = log and any(v > 0 for _, _, values in curves for v in values)
    fig, ax = _figure(title + (" (log scale)" if log else ""), "step", ylabel)
    for key, steps, values in curves:
        if log:
            steps, values = [s for s, v in zip(steps, values) if v > 0], [v for v in values if v > 0]
        ax.plot(steps, values, marker=".", label=key)
    if log:
        ax.set_yscale("log")
    ax.legend(loc="best", fontsize="small")
    return fig


def summary(rows: list[dict], evals: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the table at the top of the page."""
    table = [("steps", f"{len(rows)} (last step {rows[-1]['step']})")]
    step_time = series(rows, "time/step")[1]
    if step_time:
        table.append(("median step time", f"{statistics.median(step_time):.3f} s"))
        timed = [row for row in rows if _number(row.get("time/step")) > 0]
        fractions = [
            f"{phase} {_median_fraction(timed, phase):.0%}"
            for phase in PHASES
            if timed and any(f"time/{phase}" in row for row in rows)
        ]
        if fractions:  # what the phases do not account for: controller overhead
            other = statistics.median(
                1 - sum(_number(row.get(f"time/{p}")) for p in PHASES) / row["time/step"] for row in timed
            )
            fractions.append(f"other {other:.0%}")
        table.append(("phase fractions (median)", ", ".join(fractions) or "—"))
    reward = series(rows, "reward/mean")[1]
    table.append(("final reward/mean", f"{reward[-1]:.4f}" if reward else "—"))
    for when in ("before", "after"):
        values = evals.get(when) or {}
        shown = ", ".join(f"{mode} {value:.4f}" for mode, value in values.items() if isinstance(value, (int, float)))
        table.append((f"eval {when}", shown or "—"))
    return table


def _median_fraction(rows: list[dict], phase: str) -> float:
    """Median over steps of this phase's share of the step's wall time."""
    return statistics.median(_number(row.get(f"time/{phase}")) / row["time/step"] for row in rows)


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _save(fig: Figure, path: Path) -> str:
    fig.savefig(path, format="png")
    return base64.b64encode(path.read_bytes()).decode("ascii")


CSS = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
img{max-width:100%;display:block;margin:1em 0}.note{color:#a55;font-style:italic}
pre{background:#f6f6f6;padding:1em;overflow-x:auto}
table.samples{font-size:small;margin-bottom:1em}td.text{white-space:pre-wrap;font-family:monospace;max-width:22em}
.trajectory{margin-bottom:1.5em}.seg{white-space:pre-wrap;font-family:monospace;font-size:small;padding:4px 8px;
margin:2px 0;border-left:4px solid #4c72b0}.seg.env{background:#eee;border-color:#999}.seg.prompt{border-color:#222}
.seg .label{display:block;font-family:system-ui,sans-serif;color:#666;font-size:x-small}
.tok{border-radius:2px}"""
CSS += SAMPLE_IMAGE_CSS


def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report/index.html and its PNGs; return the path of index.html."""
    run_dir = Path(run_dir)
    notes: list[str] = []  # lines left out of the run's files, shown at the top of the page
    rows = load_metrics(run_dir, notes)
    eval_path, config_path = run_dir / "eval.json", run_dir / "config.yaml"
    evals = _read_eval(eval_path) if eval_path.is_file() else {}
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    body = [f"<h1>relayrl run report: {html.escape(str(run_dir))}</h1>"]
    if rows:
        body += [
            "<table>",
            *(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary(rows, evals)),
            "</table>",
        ]
    else:
        body.append('<p class="note">no steps logged yet: metrics.jsonl is empty</p>')
    if not eval_path.is_file():
        body.append('<p class="note">no eval.json: before/after accuracy unknown</p>')
    config = config_path.read_text() if config_path.is_file() else "(no config.yaml)"
    body.append(f"<details><summary>resolved config</summary><pre>{html.escape(config)}</pre></details>")
    for name, plot in (_plots(run_dir, rows, evals, notes) if rows else {}).items():
        if isinstance(plot, str):
            body.append(f'<p class="note">{html.escape(name)} plot skipped: {html.escape(plot)}</p>')
        else:
            png = _save(plot, out / f"{name}.png")
            body.append(f'<img alt="{name}" src="data:image/png;base64,{png}">')
    body.append(samples_section(run_dir, notes))
    body[1:1] = [f'<p class="note">{html.escape(note)}</p>' for note in notes]
    page = out / "index.html"
    page.write_text(
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>relayrl report</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    return page


def _plots(run_dir: Path, rows: list[dict], evals: dict, notes: list[str]) -> dict[str, Figure | str]:
    """Each plot in page order, or the reason it is skipped; the timeline only when timeline.jsonl exists."""
    plots = {"reward": plot_reward(rows, evals), "phase_times": plot_phase_times(rows)}
    timeline_path = run_dir / "timeline.jsonl"
    if timeline_path.is_file():
        plots["timeline"] = plot_timeline(read_jsonl(timeline_path, TIMELINE_KEYS, notes))
    return (
        plots
        | {"staleness": plot_staleness(rows), "mismatch": plot_mismatch(rows), "response_length": plot_length(rows)}
        | ({"turns": plot_turns(rows)} if any("env/turns_mean" in row for row in rows) else {})
    )


def _read_eval(path: Path) -> dict:
    try:
        evals = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(evals, dict):
        raise DataError(f"{path}: expected an object with 'before'/'after'")
    return evals
