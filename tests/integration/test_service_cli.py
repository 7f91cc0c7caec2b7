"""`relayrl serve` as a user runs it: it prints the base URL and a generated `tml-` key, the SDK reaches it with
those two environment variables, SIGTERM stops it; a --model that is not a local HF directory is one error line.

The served process takes relayrl's config (`rollout.engine=vllm log.dir=RUN`): after an SFT step,
`save_weights_and_get_sampling_client` pushes the trained weights into vLLM, whose sampled log-probs equal the
trainer's `forward` on the sequence (and differ from the base's), and the run directory holds a row per request
(tests/unit/test_service_run_log.py renders its report)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
def test_serve_takes_the_config_samples_the_trained_weights_on_vllm_and_logs_each_request(random_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "relayrl.cli", "serve", "rollout.engine=vllm", f"log.dir={run_dir}"]
    proc = subprocess.Popen(
        [*command, "--model", f"tiny={random_model_dir}", "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        printed = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        assert printed["TINKER_BASE_URL"].startswith("http://127.0.0.1:")
        assert printed["TINKER_API_KEY"].startswith("tml-")
        script = "import tinker; print([m.model_name for m in tinker.RestClient().get_server_capabilities().result().supported_models])"
        out = subprocess.run([sys.executable, "-c", script], env={**env, **printed}, capture_output=True, text=True)
        assert out.stdout.strip() == "['tiny']", out.stderr[-2000:]
        trained, base = sample_after_sft(printed["TINKER_BASE_URL"], printed["TINKER_API_KEY"])
    finally:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert proc.returncode == 0
    sampled, forward = trained
    np.testing.assert_allclose(sampled, forward, atol=2e-3)  # vLLM serves exactly the trained weights
    assert np.abs(base - forward).max() > 0.05  # and they are not the base's: the push landed
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    sampled_tokens = [row["sample/tokens"] for row in rows if "sample/tokens" in row]  # sample, compute_logprobs
    assert len(sampled_tokens) == 2 and sampled_tokens[0] == len(sampled)
    assert sum("forward_backward/loss_sum" in row for row in rows) == 3


def sample_after_sft(url: str, api_key: str) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """((vLLM's sampled log-probs, the trainer's forward on them) after SFT steps, the base's on the sequence)."""
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=api_key)
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    tokens = trainer.get_tokenizer().encode("3+4=7")
    sft = datum(tokens)
    for _ in range(3):
        trainer.forward_backward([sft], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = tokens[:3]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    sequence = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    whole = prompt + list(sequence.tokens)
    out = trainer.forward([datum(whole)], "cross_entropy").result()
    forward = out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :]
    base_sampler = service.create_sampling_client(base_model="tiny").result()
    base = np.array(base_sampler.compute_logprobs(types.ModelInput.from_ints(whole)).result()[len(prompt) :])
    service.close("success").result()
    return (np.array(sequence.logprobs), forward), base


def datum(tokens: list[int]):
    from tinker import types

    n = len(tokens) - 1
    inputs = {"target_tokens": tokens[1:], "weights": [1.0] * n}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def test_a_model_that_is_not_a_local_directory_is_one_error_line(tmp_path, capsys):
    from relayrl.cli import main

    assert main(["serve", "--model", f"x={tmp_path / 'missing'}"]) == 2
    assert "is not a local HF model directory (no config.json)" in capsys.readouterr().err
