"""What a user watches for a service (issue 48 item 6): with `log.dir` in its config, `relayrl serve` writes a row
per request (tokens, time, loss, the sampler-vs-trainer mismatch) and the timeline into the run directory, and
`relayrl report` renders it; `log.backends` (TensorBoard here) get the same rows. And what `relayrl serve` reads of relayrl's config (relayrl/service/settings.py)."""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest
from tinker import types

from tests.unit.service_fixtures import sdk_client

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def session(random_model_dir, tmp_path_factory):
    """A short RL session (sample, then importance_sampling on it, optim_step) against a service logging to a run
    directory; the second forward_backward's sampler log-probs are off by 0.5 (other weights sampled them)."""
    from relayrl.config import load_config
    from relayrl.service import server
    from relayrl.service.settings import service_settings

    run_dir = tmp_path_factory.mktemp("service_run")
    settings = service_settings(load_config(None, [f"log.dir={run_dir}", "log.backends=[tensorboard]"]))
    running = server.start({"tiny": str(random_model_dir)}, tmp_path_factory.mktemp("state"), settings=settings)
    client = sdk_client(running)
    trainer = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)
    sequence = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, params).result().sequences[0]
    for offset in (0.0, 0.5):  # the gradients add up; one step after both
        trainer.forward_backward([rl_datum(list(sequence.tokens), sequence.logprobs, offset)], "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    client.close("success").result()
    running.stop()
    return run_dir, sequence


def rl_datum(tokens: list[int], logprobs, offset: float) -> types.Datum:
    whole, prompt_positions = PROMPT + tokens, len(PROMPT) - 1
    inputs = {
        "target_tokens": whole[1:],
        "logprobs": [0.0] * prompt_positions + [lp - offset for lp in logprobs],
        "advantages": [0.0] * prompt_positions + [1.0] * len(tokens),
    }
    return types.Datum(model_input=types.ModelInput.from_ints(whole[:-1]), loss_fn_inputs=inputs)


def test_each_request_is_a_row_with_its_tokens_time_loss_and_mismatch(session):
    run_dir, sequence = session
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    routes = [next(key.split("/")[0] for key in row if key.endswith("/time")) for row in rows]
    assert routes == ["sample", "forward_backward", "forward_backward", "optim_step"]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert rows[0]["sample/tokens"] == len(sequence.tokens) and rows[0]["sample/prompt_tokens"] == len(PROMPT)
    assert rows[1]["forward_backward/tokens"] == len(PROMPT) + len(sequence.tokens) - 1
    assert rows[1]["mismatch/logprob_abs_mean"] < 1e-4  # the sampler served the trainer's weights
    assert rows[2]["mismatch/logprob_abs_mean"] == pytest.approx(0.5, abs=1e-4)
    assert rows[3]["optim_step/grad_norm"] > 0 and all(row["time/step"] > 0 for row in rows)
    timeline = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert [row["phase"] for row in timeline] == routes
    assert timeline[1]["role"].endswith(":train:0") and timeline[0]["role"].split(":")[1] == "sample"


def test_the_report_renders_the_service_run(session):
    from relayrl.cli import main

    run_dir, _ = session
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report" / "index.html").read_text()
    assert "<th>steps</th><td>4 (last step 4)</td>" in page
    for plot in ("phase_times", "timeline", "mismatch"):
        assert f'alt="{plot}"' in page, plot
    assert str(run_dir) in page  # config.yaml, shown verbatim, holds log.dir


def test_the_rows_go_to_log_backends_too(session):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = session
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("forward_backward/loss_sum")]
    assert losses == [(r["step"], pytest.approx(r["forward_backward/loss_sum"])) for r in rows[1:3]]


def test_a_large_mismatch_is_logged_naming_the_model(random_model_dir, caplog):
    from relayrl.service.run_log import forward_backward_figures
    from relayrl.service.wire import Example, ForwardBackwardCall

    sampled = np.array([0.0, -1.0, -2.0], dtype=np.float32)
    example = Example([1, 2, 3], {"target_tokens": np.array([2, 3, 4]), "logprobs": sampled})
    call = ForwardBackwardCall("s-1:train:0", "importance_sampling", {}, False, [example])
    with caplog.at_level(logging.WARNING, logger="relayrl.service"):
        figures = forward_backward_figures(call, [{"logprobs": sampled - 0.25}], {"loss:sum": 1.0})
    assert figures["mismatch/logprob_abs_mean"] == pytest.approx(0.25)  # the prompt's 0 left out
    assert "s-1:train:0: sampler vs trainer log-prob gap 0.250" in caplog.text


@pytest.mark.parametrize(("engine", "chosen"), [("auto", "hf"), ("vllm", "vllm"), ("hf", "hf")])
def test_rollout_engine_picks_each_bases_engine_as_training_does(random_model_dir, engine, chosen):
    from relayrl.config import load_config
    from relayrl.service.settings import service_settings

    memory = ["rollout.kv_cache_gib=2"] if engine == "vllm" else []  # read by vLLM only (a warning otherwise)
    settings = service_settings(load_config(None, [f"rollout.engine={engine}", *memory]))
    engine_settings = settings.engine_settings(str(random_model_dir))
    assert engine_settings.rollout.engine == chosen
    assert engine_settings.rollout.kv_cache_gib == (2 if memory else 1)
    assert engine_settings.model.path == str(random_model_dir) and engine_settings.adapter() is None
    assert settings.run_dir is None  # no log.dir in the config: no run directory


def test_serve_reads_model_path_and_refuses_ray_placement(random_model_dir, tmp_path, capsys):
    from relayrl.cli import main
    from relayrl.config import load_config
    from relayrl.service.settings import served_bases

    config = load_config(None, [f"model.path={random_model_dir}"])
    assert served_bases([f"t={random_model_dir}"], config) == [f"t={random_model_dir}", str(random_model_dir)]
    assert main(["serve", "placement.mode=ray", "--model", str(random_model_dir)]) == 2
    assert "placement.mode=ray: relayrl serve runs in one process" in capsys.readouterr().err


def test_keys_a_service_does_not_read_are_named_in_one_warning():
    from relayrl.errors import ConfigWarning
    from relayrl.service.settings import load_service_config

    read = ["rollout.max_tokens=64", "model.dtype=float32", "train.seed=3", "log.backends=[tensorboard]"]
    with pytest.warns(ConfigWarning) as caught:
        load_service_config(None, [*read, "algorithm.kl.coef=0.1", "train.steps=5"])
    (warning,) = [w for w in caught if "does not read" in str(w.message)]
    assert str(warning.message).startswith("relayrl serve does not read algorithm.kl.coef, train.steps: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_service_config(None, read)  # only keys it reads: nothing to say
