"""`relayrl report` in a real browser: headless Chromium renders RUN_DIR/report/index.html of a synthetic run and
every chart is drawn on the screenshot (ink and colour inside each chart's box, the PNG's own pixels there).

The chart boxes come from the browser itself: a copy of the page with one script appended reports each image's
bounding box (`--dump-dom`); the screenshot is of the page as written, at the same width and the page's full
height. `make test` installs Chromium from the Debian packages when it is missing and the user is root;
without it this test skips, naming what to install.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from relayrl.cli import main
from tests.unit.test_report import _add_timeline, _metrics_row

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH = 1024  # the page is at most 960 px wide: every chart at its natural size (800 x 360), no scaling
CHARTS = ["reward", "phase_times", "timeline", "staleness", "mismatch", "response_length"]
BOXES = """<script>addEventListener("load", () => {
  const pre = Object.assign(document.createElement("pre"), {id: "boxes"});
  const boxes = [...document.images].map(i => { const r = i.getBoundingClientRect();
    return {alt: i.alt, x: r.left, y: r.top, w: r.width, h: r.height, natural: [i.naturalWidth, i.naturalHeight]}; });
  pre.textContent = JSON.stringify({boxes, height: document.documentElement.scrollHeight});
  document.body.append(pre);
});</script>"""


def chromium() -> str:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    pytest.skip(
        f"no Chromium on PATH ({', '.join(BROWSERS)}): `make test` installs it as root (apt-get install chromium); "
        "without root, install chromium to run the report's browser test"
    )


def headless(browser: str, tmp_path, *args: str) -> str:
    """One headless Chromium run; its stdout. As root Chromium needs --no-sandbox."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio"]
    command += ["--force-device-scale-factor=1", f"--user-data-dir={tmp_path / 'profile'}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def chart_boxes(browser: str, page, tmp_path) -> dict:
    probe = page.with_name("probe.html")  # the same page plus the script: nothing above the charts moves
    probe.write_text(page.read_text().replace("</body>", BOXES + "</body>"))
    dom = headless(browser, tmp_path, f"--window-size={WIDTH},800", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="boxes">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"'))


def read_rgb(path):
    from PIL import Image  # matplotlib's own dependency: always in the venv

    image = Image.open(path).convert("RGB")
    return image, image.load()


def test_every_chart_of_the_report_is_drawn_in_chromium(tmp_path):
    browser = chromium()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(_metrics_row(step)) + "\n" for step in range(10)))
    (run / "eval.json").write_text(json.dumps({"before": {"greedy": 0.1}, "after": {"greedy": 0.5}}))
    _add_timeline(run)
    assert main(["report", str(run)]) == 0
    page = run / "report" / "index.html"

    layout = chart_boxes(browser, page, tmp_path)
    assert [box["alt"] for box in layout["boxes"]] == CHARTS
    shot = tmp_path / "shot.png"
    headless(browser, tmp_path, f"--window-size={WIDTH},{layout['height']}", f"--screenshot={shot}", page.as_uri())
    image, pixels = read_rgb(shot)
    assert image.size == (WIDTH, layout["height"])
    for box in layout["boxes"]:
        x0, y0, w, h = round(box["x"]), round(box["y"]), round(box["w"]), round(box["h"])
        assert [w, h] == box["natural"] == [800, 360], box  # loaded, decoded and shown at its natural size
        assert y0 + h <= image.size[1], box
        area = [pixels[x0 + x, y0 + y] for y in range(0, h, 2) for x in range(0, w, 2)]
        ink = sum(max(rgb) < 235 for rgb in area) / len(area)  # axes, ticks, labels, lines: not the white page
        colour = sum(max(rgb) - min(rgb) > 60 for rgb in area) / len(area)  # the plotted series are in colour
        assert ink > 0.01 and colour > 0.002, (box["alt"], ink, colour)
        _, own = read_rgb(run / "report" / f"{box['alt']}.png")
        same = sum(
            max(abs(a - b) for a, b in zip(pixels[x0 + x, y0 + y], own[x, y])) <= 8
            for y in range(0, h, 4)
            for x in range(0, w, 4)
        )
        assert same / ((h // 4) * (w // 4)) > 0.99, (box["alt"], "the screenshot is not the chart's PNG")


TOKENS = """<script>addEventListener("load", () => {
  const pre = Object.assign(document.createElement("pre"), {id: "boxes"});
  const boxes = [...document.querySelectorAll(".trajectory .tok")].map(t => { const r = t.getBoundingClientRect();
    return {text: t.textContent, title: t.title, x: r.left, y: r.top, w: r.width, h: r.height}; });
  pre.textContent = JSON.stringify({boxes, height: document.documentElement.scrollHeight});
  document.body.append(pre);
});</script>"""


def test_the_trajectory_view_colours_each_sampled_token_by_its_gap_in_chromium(tmp_path):
    browser = chromium()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(_metrics_row(0)) + "\n")
    policy = {"by": "policy", "versions": [0], "reward": 1.0}
    segments = [
        {**policy, "text": "RED", "tokens": ["RED"], "gap": [0.5]},
        {"by": "env", "text": "<tool_response>4</tool_response>"},
        {**policy, "text": "PALE", "tokens": ["PALE"], "gap": [1e-7]},
    ]
    row = {"step": 0, "sample": "p#0", "prompt": "2+2=", "reward": 1.0, "segments": segments}
    (run / "samples.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["report", str(run)]) == 0
    page = run / "report" / "index.html"

    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", TOKENS + "</body>"))
    dom = headless(browser, tmp_path, f"--window-size={WIDTH},800", "--dump-dom", probe.as_uri())
    layout = json.loads(re.search(r'<pre id="boxes">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    boxes = {box["text"]: box for box in layout["boxes"] if box["text"] in ("RED", "PALE")}
    assert boxes["RED"]["title"] == "gap +0.5" and boxes["PALE"]["title"] == "gap +1e-07"
    shot = tmp_path / "shot.png"
    headless(browser, tmp_path, f"--window-size={WIDTH},{layout['height']}", f"--screenshot={shot}", page.as_uri())
    _, pixels = read_rgb(shot)
    for text, box in boxes.items():
        assert box["w"] > 10 and box["h"] > 5, box  # laid out and visible
        area = [
            pixels[round(box["x"]) + x, round(box["y"]) + y]
            for y in range(1, round(box["h"]) - 1)
            for x in range(1, round(box["w"]) - 1)
        ]
        red = sum(r > 180 and g < 110 and b < 110 for r, g, b in area) / len(area)
        ink = sum(max(rgb) < 120 for rgb in area) / len(area)  # the token's own letters
        assert (red > 0.5) == (text == "RED") and ink > 0.02, (text, red, ink)


PICTURES = BOXES.replace("[...document.images]", '[...document.querySelectorAll("img.sample-image")]')


def test_a_samples_prompt_pictures_are_drawn_beside_it_in_chromium(tmp_path):
    from PIL import Image

    from relayrl.metrics.sample_images import SHOWN_PX, thumbnails

    browser = chromium()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(_metrics_row(0)) + "\n")
    colours = {"red": (220, 30, 30), "blue": (30, 70, 220)}
    pictures = [Image.new("RGB", (32, 32), colour) for colour in colours.values()]
    pictures[0].paste((240, 240, 240), (0, 0, 16, 32))  # the left half pale: drawn as it is, not smoothed
    row = {"step": 0, "sample": "p#0", "prompt": "<image><image>Which?", "reward": 1.0, "images": thumbnails(pictures)}
    (run / "samples.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["report", str(run)]) == 0
    page = run / "report" / "index.html"

    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PICTURES + "</body>"))
    dom = headless(browser, tmp_path, f"--window-size={WIDTH},800", "--dump-dom", probe.as_uri())
    layout = json.loads(re.search(r'<pre id="boxes">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    boxes = layout["boxes"]
    assert [box["natural"] for box in boxes] == [[32, 32], [32, 32]]
    assert all(round(box["w"]) == round(box["h"]) == SHOWN_PX + 2 for box in boxes), boxes  # + a 1-px border
    shot = tmp_path / "shot.png"
    headless(browser, tmp_path, f"--window-size={WIDTH},{layout['height']}", f"--screenshot={shot}", page.as_uri())
    _, pixels = read_rgb(shot)
    (red, blue) = boxes
    middle = round(red["y"] + red["h"] / 2)
    assert pixels[round(red["x"] + red["w"] * 0.75), middle] == colours["red"]
    assert pixels[round(red["x"] + red["w"] * 0.25), middle] == (240, 240, 240)
    edge = round(red["x"]) + 1 + SHOWN_PX // 2  # where the pale half meets the red: no blended pixel either side
    assert pixels[edge - 1, middle] == (240, 240, 240) and pixels[edge, middle] == colours["red"]
    assert pixels[round(blue["x"] + blue["w"] / 2), round(blue["y"] + blue["h"] / 2)] == colours["blue"]
