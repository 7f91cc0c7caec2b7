"""relayrl.models.loading: a model directory with two chat templates says which one is used."""

from __future__ import annotations

import json
import string
import warnings

import pytest

from relayrl.models.loading import load_tokenizer
from relayrl.models.tiny import CHAT_TEMPLATE, train_char_tokenizer

USER_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


@pytest.fixture
def model_dir(tmp_path):
    """A tokenizer saved as `relayrl sft` saves it: transformers 5 writes the template to chat_template.jinja."""
    train_char_tokenizer([string.printable]).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert (tmp_path / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    return tmp_path


def set_config_template(model_dir, template) -> None:
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = template
    config_file.write_text(json.dumps(config))


def load_quietly(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        return load_tokenizer(path)


def test_two_different_chat_templates_warn_naming_both_files_and_the_winner(model_dir):
    set_config_template(model_dir, USER_TEMPLATE)  # the user adds their own, as the HF docs show
    with pytest.warns(UserWarning, match="two chat templates") as caught:
        tokenizer = load_tokenizer(model_dir)
    (warning,) = caught
    message = str(warning.message)
    assert str(model_dir / "chat_template.jinja") in message and str(model_dir / "tokenizer_config.json") in message
    assert tokenizer.chat_template == CHAT_TEMPLATE  # what transformers does, and what the warning must say
    assert "chat_template.jinja is used" in message


def test_the_winner_named_is_the_template_loaded(model_dir, monkeypatch):
    set_config_template(model_dir, USER_TEMPLATE)
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained

    def config_wins(path, **kwargs):  # a transformers version that prefers tokenizer_config.json
        tokenizer = real(path, **kwargs)
        tokenizer.chat_template = USER_TEMPLATE
        return tokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", config_wins)
    with pytest.warns(UserWarning, match="tokenizer_config.json's 'chat_template' is used"):
        load_tokenizer(model_dir)


def test_one_chat_template_is_quiet(model_dir):
    assert load_quietly(model_dir).chat_template == CHAT_TEMPLATE
    (model_dir / "chat_template.jinja").unlink()
    set_config_template(model_dir, USER_TEMPLATE)
    assert load_quietly(model_dir).chat_template == USER_TEMPLATE


def test_the_same_template_twice_is_quiet(model_dir):
    set_config_template(model_dir, CHAT_TEMPLATE)
    assert load_quietly(model_dir).chat_template == CHAT_TEMPLATE


def test_a_character_tokenizer_keeps_every_character_past_the_trainers_default_cap():
    """The 0.5B-shaped model of the GPU check asks for 32000 ids; the word-level trainer's default cap of 30000 had
    dropped 2000 of its characters without a word (the first run on an H200 failed on it)."""
    characters = [chr(0x3400 + i) for i in range(31996)]
    tokenizer = train_char_tokenizer(characters)
    assert len(tokenizer) == 32000
    assert tokenizer.decode(tokenizer.encode(characters[-1], add_special_tokens=False)) == characters[-1]
