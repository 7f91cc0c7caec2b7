"""Loading HF model directories with errors that name the config key, and the padding id decided once."""

from __future__ import annotations

from pathlib import Path

import torch

from relayrl.errors import ModelError


def check_model_dir(path: str | Path, key: str = "model.path") -> Path:
    if not path or not (Path(path) / "config.json").is_file():
        raise ModelError(f"{key}={str(path)!r} is not a model directory (no config.json there)")
    return Path(path)


def load_tokenizer(path: str | Path, key: str = "model.path"):
    from transformers import AutoTokenizer

    check_model_dir(path, key)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelError(f"{key}={str(path)!r}: cannot load its tokenizer: {err}") from None


def load_causal_lm(path: str | Path, device: str = "cpu", key: str = "model.path"):
    from transformers import AutoModelForCausalLM

    check_model_dir(path, key)
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    except (OSError, ValueError) as err:
        raise ModelError(f"{key}={str(path)!r}: cannot load the model: {err}") from None


def pad_token_id(tokenizer) -> int:
    """The id used to fill padded positions (always masked out): pad, else eos, else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


def context_length(path: str | Path) -> int | None:
    """The model's maximum sequence length from its config, if it states one."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return getattr(config, "max_position_embeddings", None)
