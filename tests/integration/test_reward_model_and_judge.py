"""A learned reward and an LLM judge on tiny local models (nothing downloaded).

The reward model is a randomly initialised LlamaForSequenceClassification (num_labels=1) built here; the
test that matters is that padding a batch does not change a row's score. The judge test runs one real
vLLM call: a random model does not answer sensibly, so it checks the plumbing (template -> engine ->
parser) and the clear error for an answer that does not parse.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.errors import RewardError
from relayrl.rewards import load_reward, score_rollouts
from relayrl.rewards.reward_model import RewardModel
from relayrl.types import Prompt, Rollout

TEXTS = ["1+2=", "3", "45+6=", "51", "7+8=", "15", "99+1=", "100"]


def build_reward_model(out, num_labels: int = 1):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from relayrl.models.tiny import train_char_tokenizer

    tokenizer = train_char_tokenizer(TEXTS + [" "])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


def test_batched_scores_equal_one_at_a_time(reward_model_dir):
    model = RewardModel(reward_model_dir, batch_size=4)
    prompts, completions = ["1+2=", "45+6=", "7+8=", "99+1=", "1+2="], ["3", "51", "15", "100", "4"]
    batched = model.score(prompts, completions)
    alone = [RewardModel(reward_model_dir, batch_size=1).score([p], [c])[0] for p, c in zip(prompts, completions)]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) > 1  # the model does read the text


def test_reward_model_as_a_reward_spec(reward_model_dir):
    fn = load_reward("reward_model", {"path": str(reward_model_dir), "batch_size": 2})
    rollouts = [Rollout(Prompt("p", "1+2=", [1]), i, [1], c, [0.0], "stop", [0]) for i, c in enumerate(["3", "4"])]
    scores, errors = score_rollouts(fn, rollouts)
    assert errors == [] and [s.reward for s in scores] == pytest.approx(
        RewardModel(reward_model_dir).score(["1+2=", "1+2="], ["3", "4"])
    )


def test_reward_model_bad_inputs_are_named(tmp_path):
    with pytest.raises(RewardError, match="no model at"):
        RewardModel(tmp_path / "missing")
    with pytest.raises(RewardError, match="num_labels=2"):
        RewardModel(build_reward_model(tmp_path / "two", num_labels=2))
    with pytest.raises(RewardError, match="set reward.kwargs.path"):
        load_reward("reward_model")(["a"], ["b"])


@pytest.mark.vllm
def test_judge_on_a_real_vllm_engine(random_model_dir):
    from relayrl.rewards.judge import Judge
    from relayrl.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(random_model_dir), max_model_len=64, seed=0)
    answers = engine.complete(["1+2=", "3+4="], max_tokens=4)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)

    lenient = Judge(engine, template="{prompt}{completion}=", pattern=r"\d", default=-1.0, max_tokens=4)
    scores = lenient.score(["1+2=", "3+4="], ["3", "7"])
    assert all(s == -1.0 or 0 <= s <= 9 for s in scores)

    strict = Judge(engine, template="{prompt}{completion}=", pattern=r"NEVER(\d)", max_tokens=4)
    with pytest.raises(RewardError, match=r"judge answer for sample 0 of the batch .* does not parse"):
        strict.score(["1+2="], ["3"])
