"""`relayrl report`: one self-contained HTML page with a PNG per plot, from a synthetic run directory."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from relayrl.cli import main
from relayrl.errors import DataError
from relayrl.metrics.report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PHASE_SECONDS = {"generate": 1.0, "reward": 0.1, "logprobs": 0.3, "advantage": 0.02, "update": 0.6, "sync": 0.2}
BASE_PLOTS = ["reward", "phase_times", "staleness", "mismatch", "response_length"]


def _metrics_row(step: int) -> dict:
    row = {
        "step": step,
        "reward/mean": 0.2 + 0.05 * step,
        "reward/std": 0.1,
        **{f"time/{phase}": seconds for phase, seconds in PHASE_SECONDS.items()},
        "time/step": sum(PHASE_SECONDS.values()) + 0.15,  # controller overhead on top of the phases
        "mismatch/logprob_abs_mean": 1e-3 * (step + 1),
        "mismatch/logprob_abs_max": 1e-2 * (step + 1),
        "response/length_mean": 20.0 - step,
        "response/length_max": 32,
        "stale/mean": 0.0,
        "stale/max": 0,
        "actor/entropy": 1.5,
        "actor/clip_frac": 0.01,
    }
    if step in (3, 7):  # the controller evaluates every `eval.every` steps but not on the last (eval.json has it)
        row |= {"eval/greedy": 0.3 + 0.02 * step, "eval/sampled": 0.25 + 0.02 * step}
    return row


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(_metrics_row(step)) + "\n" for step in range(10)))
    (run / "eval.json").write_text(
        json.dumps({"before": {"greedy": 0.1234, "sampled": 0.0987}, "after": {"greedy": 0.5678, "sampled": 0.4321}})
    )
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 10, "lr": 1e-5}, "rollout": {"n": 4}}))
    return run


def _add_timeline(run: Path) -> None:
    rows, clock = [], 100.0
    for step in range(3):
        for phase, seconds in PHASE_SECONDS.items():
            role = {"generate": "rollout", "sync": "rollout"}.get(phase, "learner")
            rows.append({"step": step, "role": role, "phase": phase, "start": clock, "end": clock + seconds})
            clock += seconds
    (run / "timeline.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _check_page(run: Path, plots: list[str]) -> str:
    page = (run / "report" / "index.html").read_text()
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    images = re.findall(r"<img[^>]*>", page)
    assert len(images) == len(plots)
    assert all('src="data:image/png;base64,' in image for image in images)
    for name in plots:
        png = (run / "report" / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5_000, name
    return page


def test_report_embeds_every_plot_and_the_summary(run_dir):
    assert write_report(run_dir) == run_dir / "report" / "index.html"
    page = _check_page(run_dir, BASE_PLOTS)
    assert not (run_dir / "report" / "timeline.png").exists()
    for accuracy in ("0.1234", "0.0987", "0.5678", "0.4321"):
        assert accuracy in page
    assert "<details>" in page and "lr: 1.0e-05" in page
    assert "generate 42%" in page and "other 6%" in page  # 1.0 s and 0.15 s of a 2.37 s step
    assert ">10 (last step 9)<" in page and "0.6500" in page  # steps and final reward/mean 0.2 + 0.05 * 9


def test_timeline_drawn_only_when_timeline_jsonl_exists(run_dir):
    _add_timeline(run_dir)
    write_report(run_dir)
    _check_page(run_dir, BASE_PLOTS + ["timeline"])


def test_missing_optional_metric_skips_its_plot_with_a_note(run_dir):
    rows = [{k: v for k, v in _metrics_row(step).items() if not k.startswith("mismatch/")} for step in range(4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = _check_page(Path(write_report(run_dir)).parents[1], [p for p in BASE_PLOTS if p != "mismatch"])
    assert "mismatch plot skipped" in page


def test_zero_mismatch_still_plots_on_a_linear_axis(run_dir):
    rows = [
        _metrics_row(step) | {"mismatch/logprob_abs_mean": 0.0, "mismatch/logprob_abs_max": 0.0} for step in range(3)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_report(run_dir)
    _check_page(run_dir, BASE_PLOTS)


@pytest.mark.parametrize("bad_line", ["{not json", "[1, 2]", '{"reward/mean": 0.5}'])
def test_malformed_metrics_line_names_file_and_line(run_dir, bad_line):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[2] = bad_line
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"metrics\.jsonl:3"):
        write_report(run_dir)


def test_missing_metrics_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="metrics.jsonl"):
        write_report(tmp_path)


def test_cli_report_returns_0(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert "index.html" in capsys.readouterr().out
    assert main(["report", str(run_dir.parent / "nope")]) == 2


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="headless chromium not installed")
def test_page_renders_in_headless_chromium(run_dir, tmp_path):
    from PIL import Image

    page = write_report(run_dir)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            page.as_uri(),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    assert shot.read_bytes().startswith(PNG_MAGIC)
    lo, hi = Image.open(shot).convert("L").getextrema()
    assert hi - lo > 100  # not a blank page: dark plot lines on a white background
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
