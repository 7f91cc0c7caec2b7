"""The reward service inside a training run: a reward that hangs costs its timeout, never the run."""

import json
import time

import pytest

from benchmarks.learning_cases import run_cli, write_config

pytestmark = pytest.mark.slow

HANGING_REWARD = """
import pathlib, time
from relayrl.rewards.verifiers import exact_match

HANG_ON = pathlib.Path(__file__).with_name("hang_on.txt").read_text()

def reward(prompts, completions, **columns):
    if HANG_ON in prompts:  # a wedged verifier, on one prompt's samples
        time.sleep(3600)
    return exact_match(prompts, completions, **columns)
"""


def first_training_prompt(model_dir, train_file) -> str:
    from relayrl.data.source import PromptSampler, load_prompts
    from relayrl.models.loading import load_tokenizer

    prompts, _ = load_prompts(train_file, load_tokenizer(str(model_dir)), 16)
    return PromptSampler(prompts, seed=0, shuffle=True).next(1)[0].text


@pytest.mark.parametrize("placement", ["local", "ray"])  # worker processes, or Ray actors as workers
def test_a_hanging_reward_costs_its_timeout_not_the_run(tmp_path, warm_model_dir, toy_task, placement, request):
    (tmp_path / "hang.py").write_text(HANGING_REWARD)
    (tmp_path / "hang_on.txt").write_text(first_training_prompt(warm_model_dir, toy_task["train"]))
    on_ray = [f"placement.address={request.getfixturevalue('ray_address')}"] if placement == "ray" else []
    run_dir = tmp_path / "run"
    engine = "hf" if placement == "local" else "vllm"  # the engine is not what this tests: the faster one here
    config = write_config(tmp_path / "cfg.yaml", warm_model_dir, toy_task, run_dir, engine)
    start = time.time()
    result = run_cli(
        "train",
        str(config),
        f"reward.fn={tmp_path / 'hang.py'}:reward",
        "reward.workers=2",
        "reward.timeout_s=1.5",  # the hung group costs 4 x 1.5 s as a batch, then 4 x 1.5 s alone
        "rollout.n=4",
        "reward.batch_size=4",
        "reward.on_error=zero",
        "train.steps=3",
        "eval.max_prompts=16",
        "log.save_model=false",
        "log.progress=false",
        "rollout.prompts_per_step=8",
        f"placement.mode={placement}",
        *on_ray,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.time() - start < 240  # start-up, evals, and 4 x 1.5 s + 4 x 1.5 s for the hung group
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    # its batch (one group of 4, deadline 4 x 1.5 s) timed out, then each sample alone: only those 4 paid
    assert rows[0]["reward/timeouts"] == 4 and sum(r["reward/timeouts"] for r in rows) == 4
    assert all(r["reward/mean"] > 0 for r in rows)  # the others were scored for real
