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
SAMPLES = {  # name: (prompt, sampling settings); a prompt each, so each sample is its own sequence
    "plain": (PROMPT, {"temperature": 1.0}),
    "tempered": ([8, 9, 10], {"temperature": 0.4, "top_k": 5}),
    "greedy": ([11, 12, 13], {"temperature": 0.0}),
}


class GapWarnings(logging.Handler):
    """The service's mismatch warnings, kept while a module-scoped session runs (caplog is per test)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "log-prob gap" in record.getMessage():
            self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def session(random_model_dir, tmp_path_factory):
    """A short RL session (sample, then importance_sampling on it, optim_step) against a service logging to a run
    directory, from one sampler serving the trainer's weights: a sample at temperature 1, one at temperature 0.4
    with top_k 5 (its log-probs are of that distribution, the trainer's `forward` of the model's own: 0.40 apart
    on the tiny model, past the warning's 0.1; at 0.7 it is 0.06) and a greedy one. Two forward_backwards on each of
    the first two, the second's sampler log-probs off by 0.5 (as if other weights sampled them), then one on the
    greedy sample. Answers the run directory, the first sample and the mismatch warnings."""
    from relayrl.config import load_config
    from relayrl.service import server
    from relayrl.service.settings import service_settings

    run_dir = tmp_path_factory.mktemp("service_run")
    settings = service_settings(load_config(None, [f"log.dir={run_dir}", "log.backends=[tensorboard]"]))
    running = server.start({"tiny": str(random_model_dir)}, tmp_path_factory.mktemp("state"), settings=settings)
    warned = GapWarnings()
    logging.getLogger("relayrl.service").addHandler(warned)
    client = sdk_client(running)
    trainer = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    sampled = {
        name: sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=5, seed=1, **at))
        .result()
        .sequences[0]
        for name, (prompt, at) in SAMPLES.items()
    }
    for name in ("plain", "tempered"):  # the gradients add up; one step after all five
        for offset in (0.0, 0.5):
            trainer.forward_backward([rl_datum(SAMPLES[name][0], sampled[name], offset)], "importance_sampling")
    trainer.forward_backward([rl_datum(SAMPLES["greedy"][0], sampled["greedy"], 0.0)], "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    client.close("success").result()
    running.stop()
    logging.getLogger("relayrl.service").removeHandler(warned)
    return run_dir, sampled["plain"], warned.messages


def rl_datum(prompt: list[int], sequence, offset: float) -> types.Datum:
    tokens = list(sequence.tokens)
    whole, prompt_positions = prompt + tokens, len(prompt) - 1
    inputs = {
        "target_tokens": whole[1:],
        "logprobs": [0.0] * prompt_positions + [lp - offset for lp in sequence.logprobs],
        "advantages": [0.0] * prompt_positions + [1.0] * len(tokens),
    }
    return types.Datum(model_input=types.ModelInput.from_ints(whole[:-1]), loss_fn_inputs=inputs)


def rows_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_each_request_is_a_row_with_its_tokens_time_loss_and_mismatch(session):
    run_dir, sequence, _ = session
    rows = rows_of(run_dir)
    routes = [next(key.split("/")[0] for key in row if key.endswith("/time")) for row in rows]
    assert routes == ["sample"] * 3 + ["forward_backward"] * 5 + ["optim_step"]
    assert [row["step"] for row in rows] == list(range(1, 10))
    assert rows[0]["sample/tokens"] == len(sequence.tokens) and rows[0]["sample/prompt_tokens"] == len(PROMPT)
    assert rows[3]["forward_backward/tokens"] == len(PROMPT) + len(sequence.tokens) - 1
    assert rows[3]["mismatch/logprob_abs_mean"] < 1e-4  # the sampler served the trainer's weights
    assert rows[4]["mismatch/logprob_abs_mean"] == pytest.approx(0.5, abs=1e-4)
    assert rows[8]["optim_step/grad_norm"] > 0 and all(row["time/step"] > 0 for row in rows)
    timeline = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert [row["phase"] for row in timeline] == routes
    assert timeline[3]["role"].endswith(":train:0") and timeline[0]["role"].split(":")[1] == "sample"


def test_a_sample_below_temperature_1_is_compared_at_its_settings_and_only_a_real_gap_warns(session):
    """The temperature-0.4, top-k-5 sample's log-probs are of that distribution: the trainer's are taken at it too,
    so the same weights read as no gap and no warning (the model's own would be 0.40 apart), and its 0.5 offset
    still reads as 0.5 and warns, as the one at temperature 1 does. The greedy sample has no distribution to
    compare: left out, counted."""
    run_dir, _, warnings_logged = session
    rows = rows_of(run_dir)
    same, offset, greedy = rows[5], rows[6], rows[7]
    assert same["mismatch/logprob_abs_mean"] < 1e-4 and same["mismatch/logprob_abs_max"] < 1e-4
    assert offset["mismatch/logprob_abs_mean"] == pytest.approx(0.5, abs=1e-4)
    assert greedy["mismatch/left_out_data"] == 1 and "mismatch/logprob_abs_mean" not in greedy
    assert len(warnings_logged) == 2 and all("sampler vs trainer log-prob gap 0.500" in w for w in warnings_logged)


def test_the_report_renders_the_service_run(session):
    from relayrl.cli import main

    run_dir, _, _ = session
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report" / "index.html").read_text()
    assert "<th>steps</th><td>9 (last step 9)</td>" in page
    for plot in ("phase_times", "timeline", "mismatch"):
        assert f'alt="{plot}"' in page, plot
    assert str(run_dir) in page  # config.yaml, shown verbatim, holds log.dir


def test_the_rows_go_to_log_backends_too(session):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = session
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("forward_backward/loss_sum")]
    assert losses == [(r["step"], pytest.approx(r["forward_backward/loss_sum"])) for r in rows[3:8]]


def test_a_large_mismatch_is_logged_naming_the_model(random_model_dir, caplog):
    from relayrl.service.mismatch import Samples
    from relayrl.service.run_log import forward_backward_figures
    from relayrl.service.wire import Example, ForwardBackwardCall

    sampled = np.array([0.0, -1.0, -2.0], dtype=np.float32)
    example = Example([1, 2, 3], {"target_tokens": np.array([2, 3, 4]), "logprobs": sampled})
    call = ForwardBackwardCall("s-1:train:0", "importance_sampling", {}, False, [example])
    with caplog.at_level(logging.WARNING, logger="relayrl.service"):
        figures = forward_backward_figures(call, [{"logprobs": sampled - 0.25}], {"loss:sum": 1.0}, Samples())
    assert figures["mismatch/logprob_abs_mean"] == pytest.approx(0.25)  # the prompt's 0 left out; not sampled here
    assert "s-1:train:0: sampler vs trainer log-prob gap 0.250" in caplog.text


def test_samples_remember_each_sequences_settings_and_say_which_the_trainer_scores_again():
    """A datum's sequence (input and last target) sampled here names its settings; the trainer scores it again at
    them unless they are the model's own (temperature 1, no top-k/top-p) or greedy; the newest sample of a sequence
    decides, and only `keep` are remembered. At temperature 0.5 the scoring is log_softmax(logits / 0.5)."""
    import torch
    from tinker import types

    from relayrl.service.mismatch import SampledAt, Samples
    from relayrl.service.wire import Example, Sequence

    def example(whole: list[int]) -> Example:
        return Example(whole[:-1], {"target_tokens": np.array(whole[1:]), "logprobs": np.zeros(len(whole) - 1)})

    own, tempered = SampledAt.of(types.SamplingParams()), SampledAt.of(types.SamplingParams(temperature=0.5))
    assert own == (1.0, -1, 1.0) and own.own and not tempered.own
    assert (
        not SampledAt.of(types.SamplingParams(top_p=0.9)).own and not SampledAt.of(types.SamplingParams(top_k=20)).own
    )
    samples = Samples(keep=2)
    samples.add([1, 2], [Sequence([3, 4], None, True), Sequence([5], None, True)], tempered)
    samples.add([7], [Sequence([6], None, True)], SampledAt(0.0, -1, 1.0))  # greedy; [1, 2, 3, 4] is forgotten
    assert samples.to_score(example([1, 2, 5])) == tempered
    assert samples.to_score(example([7, 6])) is None and samples.sampled_at(example([7, 6])).temperature == 0
    assert samples.sampled_at(example([1, 2, 3, 4])) is None and samples.to_score(example([1, 2, 3, 4])) is None
    samples.add([1, 2], [Sequence([5], None, True)], own)
    assert samples.to_score(example([1, 2, 5])) is None
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    expected = torch.log_softmax(logits / 0.5, -1)[0, 1].item()
    assert tempered.logprobs(logits, torch.tensor([1]))[0] == pytest.approx(expected)


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
