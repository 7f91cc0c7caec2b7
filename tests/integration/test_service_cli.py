"""`relayrl serve` as a user runs it: it prints the base URL and a generated `tml-` key, the SDK reaches it with
those two environment variables, SIGTERM stops it; a --model that is not a local HF directory is one error line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serve_prints_its_url_and_key_the_sdk_uses_them_and_sigterm_stops_it(random_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "relayrl.cli", "serve", "--model", f"tiny={random_model_dir}"]
    proc = subprocess.Popen(
        [*command, "--state-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        printed = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        assert printed["TINKER_BASE_URL"].startswith("http://127.0.0.1:")
        assert printed["TINKER_API_KEY"].startswith("tml-")
        script = "import tinker; print([m.model_name for m in tinker.RestClient().get_server_capabilities().result().supported_models])"
        out = subprocess.run([sys.executable, "-c", script], env={**env, **printed}, capture_output=True, text=True)
        assert out.stdout.strip() == "['tiny']", out.stderr[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert proc.returncode == 0


def test_a_model_that_is_not_a_local_directory_is_one_error_line(tmp_path, capsys):
    from relayrl.cli import main

    assert main(["serve", "--model", f"x={tmp_path / 'missing'}"]) == 2
    assert "is not a local HF model directory (no config.json)" in capsys.readouterr().err
