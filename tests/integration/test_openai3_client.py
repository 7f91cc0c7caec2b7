"""relayrl's agents run on openai 3.x as on the lock's 2.x: the lock pins openai 2 (verifiers 0.4.0 caps it, <3), and the
newest Agents SDK and pydantic-ai require 3 (docs/agents.md, "Agent libraries"). openai 3 is installed from the
package index into a directory of its own, put first on a child process's path, and the agent tests of chat
completions, streaming, `/v1/responses` and the plain (sync) client run there against relayrl's endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OPENAI_3 = "openai==3.63.0"
ROOT = Path(__file__).resolve().parents[2]
AGENT_TESTS = [
    "tests/unit/test_agents.py::test_each_call_is_served_from_the_trajectorys_own_tokens_and_every_trained_token_was_sampled",
    "tests/unit/test_agents.py::test_a_plain_function_gets_a_sync_client",
    "tests/unit/test_agents.py::test_tool_calls_come_back_parsed_by_vllms_parser_and_malformed_ones_are_counted",
    "tests/unit/test_agents_streaming.py",
    "tests/unit/test_agents_responses.py",
]


@pytest.mark.slow
def test_the_agent_endpoint_serves_openai_3_clients(tmp_path):
    target = tmp_path / "openai3"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), OPENAI_3]
    run = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"pip could not install {OPENAI_3}:\n{run.stderr[-3000:]}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    check = [sys.executable, "-c", "import openai; print(openai.__version__)"]
    assert subprocess.run(check, capture_output=True, text=True, env=env, cwd=ROOT).stdout.strip() == "3.63.0"
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *AGENT_TESTS]
    run = subprocess.run(tests, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
