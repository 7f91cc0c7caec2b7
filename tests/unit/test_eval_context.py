"""`relayrl eval` on a model whose context is 64 tokens: a rollout.max_tokens left out fits the model, and keys that
cannot fit are refused in the command's own terms (the key, the longest prompt's file:row, the context)."""

from __future__ import annotations

import json

import pytest

from relayrl.cli import main


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    """A random tiny Llama whose context (max_position_embeddings) is 64 tokens."""
    from relayrl.models.tiny import build_tiny

    texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]
    out = tmp_path_factory.mktemp("ctx64")
    build_tiny(texts, out, seed=0, hidden=64, layers=2, heads=2, intermediate=128, max_positions=64)
    return out


def write_prompts(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path


def run_eval(capsys, model, data, *extra):
    code = main(["eval", str(model), str(data), "reward.fn=exact_match", "rollout.engine=hf", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_max_tokens_fits_a_64_token_context(tmp_path, capsys, short_context_model):
    data = write_prompts(tmp_path / "d.jsonl", ["1+2=", "33+44="])
    code, out, err = run_eval(capsys, short_context_model, data)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["n"] == 2


def test_generation_config_max_new_tokens_is_the_default(tmp_path, capsys, short_context_model):
    from transformers import GenerationConfig

    from relayrl.commands.eval import default_max_tokens

    assert default_max_tokens(str(short_context_model), longest=6) == 58  # min(64, 64 - 6)
    GenerationConfig(max_new_tokens=5).save_pretrained(tmp_path / "gen")
    copy = tmp_path / "withgen"
    copy.mkdir()
    for item in short_context_model.iterdir():
        (copy / item.name).symlink_to(item)
    (copy / "generation_config.json").write_text((tmp_path / "gen" / "generation_config.json").read_text())
    assert default_max_tokens(str(copy), longest=6) == 5


def test_max_tokens_over_the_context_names_the_key_the_prompt_and_the_context(tmp_path, capsys, short_context_model):
    data = write_prompts(tmp_path / "d.jsonl", ["1+2=", "33+44="])
    code, _, err = run_eval(capsys, short_context_model, data, "rollout.max_tokens=64")
    assert code == 2
    assert "rollout.max_tokens=64" in err and f"{data}:2" in err and "6 tokens" in err
    assert "context of 64" in err and "data.max_prompt_tokens" not in err
