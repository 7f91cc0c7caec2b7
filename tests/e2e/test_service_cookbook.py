"""tinker-cookbook's supervised recipe (`tinker_cookbook.supervised.train`, what `recipes/sl_basic.py` runs), unchanged,
against `relayrl serve` on the tiny random model and a local conversation file (the cookbook's
`FromConversationFileBuilder`, `role_colon` renderer): it trains 3 epochs, lowers its own train NLL, and saves its
final state and sampler checkpoints through the service. Its math RL recipe (`recipes/math_rl/train.py
env=arithmetic`, as a user runs it, a subprocess; `loss_fn=importance_sampling`, since its default,
`stable_reinforce`, is not served) runs its 14 steps through a service the test starts and stops, from the tests'
warm start read through role_colon's text and SFT'd on the environment's format, and raises held-out greedy
accuracy (200 problems no batch draws, graded by the recipe's ArithmeticEnv) by at least MATH_RL_GAIN: half the
smallest gain benchmarks/service_math_rl.py measured in this setting over 10 seeds (figures in docs/tinker.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The math RL setting, as benchmarks/service_math_rl.py's flags (`--seeds 5` added reproduces the figures): the
# tests' warm start, 300 env-format SFT steps, the recipe at 16 groups x 8, 14 steps, lr 2e-4, 200 held-out problems.
MATH_RL = ["--warm-start", "tests", "--groups", "16", "--steps", "14", "--held-out", "200"]
MATH_RL_GAIN = 0.06  # half the smallest measured gain, rounded down (+0.13 over 10 seeds, docs/tinker.md)


def write_conversations(path, n: int = 64) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(10), rng.randrange(10)
            messages = [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
            f.write(json.dumps({"messages": messages}) + "\n")


def test_the_cookbooks_supervised_loop_lowers_its_loss_through_the_service(random_model_dir, tmp_path, monkeypatch):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from relayrl.service import server

    model = str(random_model_dir)  # the base's name is its path: the cookbook loads its tokenizer from it
    running = server.start({model: model}, tmp_path / "state")
    monkeypatch.setenv("TINKER_API_KEY", running.api_key)
    write_conversations(tmp_path / "conversations.jsonl")
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model,
        renderer_name="role_colon",
        max_length=64,
        batch_size=16,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    config = train.Config(
        log_path=str(tmp_path / "run"),
        model_name=model,
        recipe_name="relayrl_service_test",
        renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(
            common_config=common, file_path=str(tmp_path / "conversations.jsonl")
        ),
        learning_rate=3e-3,
        num_epochs=3,
        lora_rank=8,
        base_url=running.url,
        eval_every=0,
        save_every=0,
    )
    try:
        asyncio.run(train.main(config))
    finally:
        running.stop()
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    assert len(nll) == 12 and nll[-1] < 0.9 * nll[0], nll
    saved = [json.loads(line) for line in (tmp_path / "run/checkpoints.jsonl").read_text().splitlines()]
    assert saved[-1]["state_path"].endswith("/weights/final")
    assert saved[-1]["sampler_path"].endswith("/sampler_weights/final")


@pytest.fixture(scope="module")
def math_rl_warm_dir(tmp_path_factory, warm_model_dir):
    """The tests' warm start read through role_colon's text and SFT'd on the environment's format
    (benchmarks/service_math_rl.py `build_warm_start` at MATH_RL's settings, ~40 s; kept across suites)."""
    import benchmarks.service_math_rl
    from benchmarks.service_math_rl import build_warm_start, parser
    from tests.artifact_cache import cached

    args = parser().parse_args(MATH_RL)

    def build(out):
        build_warm_start(warm_model_dir, out, args.teacher, args.sft_steps, args.sft_lr, args.sft_batch)
        for scratch in ("init", "toy"):  # the mapped copy and the SFT's data: only the model is read
            shutil.rmtree(out / scratch)

    recipe = {
        "warm": str(warm_model_dir),
        "teacher": args.teacher,
        "sft": [args.sft_steps, args.sft_lr, args.sft_batch],
        # the build's code is the benchmark's, outside relayrl/ (which the cache's key covers)
        "benchmark": hashlib.sha256(Path(benchmarks.service_math_rl.__file__).read_bytes()).hexdigest(),
    }
    return cached("math_rl_warm", recipe, build, tmp_path_factory.mktemp("math_rl_warm")) / "model"


def test_the_cookbooks_math_rl_recipe_raises_held_out_accuracy_through_the_service(math_rl_warm_dir, tmp_path):
    from benchmarks.service_math_rl import one_seed, parser

    args = parser().parse_args(MATH_RL)
    result = one_seed(math_rl_warm_dir, 0, tmp_path, args)
    rows = [json.loads(line) for line in (tmp_path / "run-0/metrics.jsonl").read_text().splitlines()]
    assert sum("time/train_step" in r for r in rows) == args.steps
    assert all(r["tokens/sampled"] > 0 for r in rows if "tokens/sampled" in r)
    assert result["gain"] >= MATH_RL_GAIN, result
