"""A prompt with images, as the learner and the engines see it: the model's processor expands each image
placeholder and makes the image tensors.

Three forms of one prompt travel in its `Prompt`:
- `token_ids`: the ids the processor (transformers) makes, each `<image>` expanded into the model's image tokens.
  The learner trains on exactly these, and HF `generate` samples from them.
- `engine_token_ids`: the ids with one placeholder per image, unexpanded: vLLM expands them itself (given
  already-expanded ids it expands them again: 32 ids became 50 for the tiny Idefics3). The vLLM engine checks that
  its expansion equals `token_ids` (relayrl/rollout/vllm_engine.py), so learner and engine see the same tokens.
- `images` (decoded RGB images, for the engines) and `image_inputs` (the processor's tensors: pixel values and the
  model's other image inputs, batch dim 1, for the learner's forward and HF generate).

The processor is the model directory's own (`AutoProcessor`), found from the tokenizer's directory.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from relayrl.errors import DataError, ModelError

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what the processor returns beside image tensors


@functools.cache
def load_processor(model_dir: str):
    """The model directory's processor (tokenizer + image processor); a text-only model's is refused by name."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_dir)
    except (OSError, ValueError) as err:
        raise ModelError(f"{model_dir}: cannot load its processor for image rows: {err}") from None
    if getattr(processor, "image_processor", None) is None:
        raise ModelError(
            f"{model_dir} has no image processor (processor_config.json / preprocessor_config.json): it is not a "
            "vision-language model, so it cannot take rows with 'images'"
        )
    return processor


@functools.cache
def vision_token_ids(model_dir: str) -> tuple[int, ...]:
    """The ids the engines never sample and the learner's distribution leaves out: a vision-language model's image
    placeholder tokens (its config's image/video/vision token ids, and its processor's image tokens). A sampled
    `<image>` in a response would make the learner's forward look for an image that is not there. Empty for a
    text-only model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "vision_config", None) is None:
        return ()
    ids = {
        value
        for name, value in vars(config).items()
        if isinstance(value, int)
        and name.endswith(("_token_id", "_token_index"))
        and any(word in name for word in ("image", "video", "vision"))
    }
    processor = load_processor(model_dir)
    for name in dir(processor):
        value = getattr(processor, name, None) if "image" in name and not name.startswith("_") else None
        if name.endswith("_token_id") and isinstance(value, int):
            ids.add(value)
        elif name.endswith("_token") and isinstance(value, str):
            ids.add(processor.tokenizer.convert_tokens_to_ids(value))
    return tuple(sorted(i for i in ids if isinstance(i, int) and i >= 0))


def processor_for(tokenizer) -> Any:
    return load_processor(str(tokenizer.name_or_path))


def image_prompt(tokenizer, text: str, images: list, plain: bool, where: str) -> tuple[list[int], list[int], dict]:
    """(expanded ids, engine ids, image tensors) of a rendered prompt holding one placeholder per image."""
    processor = processor_for(tokenizer)
    engine_ids = tokenizer(text, add_special_tokens=plain)["input_ids"]
    try:
        encoded = processor(text=[text], images=[images], add_special_tokens=plain, return_tensors="pt")
    except (ValueError, TypeError) as err:  # the processor's own checks: placeholder count, image sizes
        raise DataError(f"{where}: the model's processor refuses the row's images: {err}") from None
    ids = encoded["input_ids"][0].tolist()
    inputs = {name: value for name, value in encoded.items() if name not in TEXT_INPUTS}
    return ids, engine_ids, inputs


def image_token_count(token_ids: list[int], tokenizer) -> int:
    """How many of a prompt's ids are image tokens (the planner's and the report's count)."""
    image_id = getattr(processor_for(tokenizer), "image_token_id", None)
    return sum(1 for token in token_ids if token == image_id) if image_id is not None else 0


def base_dir(where: str) -> Path:
    """The directory a row's relative image paths are resolved against: its data file's (`file:line`), or a
    `datasets` directory itself (`dir:row N`)."""
    source = Path(where.rsplit(":", 1)[0])
    return source if source.is_dir() else source.parent
