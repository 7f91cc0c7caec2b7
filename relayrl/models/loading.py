"""Loading HF model directories with errors that name the config key, and the padding id decided once.

A directory holding two different chat templates (a `chat_template.jinja`, as `save_pretrained` and
`relayrl sft` write it, and a `chat_template` key in tokenizer_config.json) loads with a warning naming both
and the one transformers used: otherwise an edit to the other one silently changes nothing.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from relayrl.errors import ConfigError, ModelError, RelayWarning

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def check_model_dir(path: str | Path, key: str = "model.path") -> Path:
    if not path or not (Path(path) / "config.json").is_file():
        raise ModelError(f"{key}={str(path)!r} is not a model directory (no config.json there)")
    return Path(path)


def load_tokenizer(path: str | Path, key: str = "model.path"):
    from transformers import AutoTokenizer

    check_model_dir(path, key)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelError(f"{key}={str(path)!r}: cannot load its tokenizer: {err}") from None
    warn_two_chat_templates(path, tokenizer)
    return tokenizer


def warn_two_chat_templates(path: str | Path, tokenizer) -> None:
    """Warn when chat_template.jinja and tokenizer_config.json's `chat_template` differ, naming the one used."""
    jinja, config_file = Path(path) / "chat_template.jinja", Path(path) / "tokenizer_config.json"
    if not (jinja.is_file() and config_file.is_file()):
        return
    try:
        in_config = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return  # the tokenizer loaded from this file, so it is readable JSON; nothing to compare otherwise
    in_file = jinja.read_text(encoding="utf-8")
    if not in_config or in_config == in_file:
        return
    # ask the loaded tokenizer rather than assume: the precedence is transformers' choice, not ours
    used = "tokenizer_config.json's 'chat_template'" if tokenizer.chat_template == in_config else "chat_template.jinja"
    warnings.warn(
        f"{path}: two chat templates, {jinja} and the 'chat_template' key of {config_file}; {used} is "
        "used (by relayrl and by vLLM alike). Delete the other one, or edit this one, so that what you "
        "edit is what the model is shown",
        RelayWarning,
        stacklevel=2,
    )


def is_vision_language(config: PretrainedConfig) -> bool:
    """A config with a vision tower (Idefics3, Qwen2-VL, LLaVA ...): loaded as an image-text-to-text model."""
    return getattr(config, "vision_config", None) is not None


def model_class(config: PretrainedConfig) -> type:
    """The transformers auto class that builds this config's generating model, with its LM head."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def load_causal_lm(path: str | Path, device: str = "cpu", key: str = "model.path", dtype=torch.float32):
    """The model of a directory (a causal LM, or a vision-language model with its vision tower), fp32 by default."""
    from transformers import AutoConfig

    check_model_dir(path, key)
    try:
        model = model_class(AutoConfig.from_pretrained(path)).from_pretrained(path, dtype=dtype)
        # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), which pyright reads unbound
        return model.to(device)  # pyright: ignore[reportArgumentType]
    except (OSError, ValueError) as err:
        raise ModelError(f"{key}={str(path)!r}: cannot load the model: {err}") from None


def set_attention(model, attention: str, device: str) -> None:
    """`model.attention`: auto keeps the kernel transformers chose at load; another name switches the model and its
    sub-models to it (transformers' set_attn_implementation). FlexAttention is refused on CPU, where torch has no
    backward for it: the update would fail at its first backward pass, after the first rollout."""
    if attention == "auto":
        return
    if attention == "flex_attention" and device != "cuda":
        raise ConfigError(
            f"model.attention=flex_attention: torch {torch.__version__} has no FlexAttention backward on {device}; "
            "use model.attention=auto (sdpa) here"
        )
    model.set_attn_implementation(attention)


def pad_token_id(tokenizer) -> int:
    """The id used to fill padded positions (always masked out): pad, else eos, else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


def context_length(path: str | Path) -> int | None:
    """The model's maximum sequence length from its config, if it states one (a vision-language model's language
    model states it, in text_config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path).get_text_config()
    return getattr(config, "max_position_embeddings", None)


def merged_model_dir(model: str | Path) -> str:
    """`model` itself, or for a peft adapter directory (adapter_config.json, no config.json) the adapter merged
    into the base its `base_model_name_or_path` names, written once to a temporary directory."""
    import tempfile

    from relayrl.models import lora

    path = Path(model)
    if (path / "config.json").is_file() or not lora.is_adapter_dir(path):
        return str(model)
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise ModelError(
            f"model.path={model}: a LoRA adapter whose base_model_name_or_path ({base!r}) is no model directory"
        )
    from peft import PeftModel

    out = tempfile.mkdtemp(prefix="relayrl-merged-")
    PeftModel.from_pretrained(load_causal_lm(base), str(path)).merge_and_unload().save_pretrained(out)
    load_tokenizer(base).save_pretrained(out)
    return out
