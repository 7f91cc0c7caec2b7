"""Build a tiny vision-language model locally: an Idefics3 (SmolVLM's architecture) with a character tokenizer.

Why Idefics3: it is the one architecture that vLLM's CPU build (0.32) and transformers 5.19 both serve here
without torchvision, which cannot be installed beside torch 2.13.0+cpu. vLLM's Qwen2-VL and LLaVA modules
import transformers' torchvision image processors at import time and fail ("No module named 'torchvision'");
Idefics3's processor has a PIL implementation (`Idefics3ImageProcessorPil`). Its language model is a Llama,
so the character vocabulary keeps its spaces (relayrl/models/tiny.py says why that matters).

The model reads each image (resized to `image_size` square, no splitting) as `image_size / patch` squared
patches, pixel-shuffled by `scale_factor` into `image_tokens` placeholder tokens. A prompt holds one `<image>`
per image; the processor (transformers) and vLLM expand it to `<fake_token_around_image><global-img>` +
`<image>` x image_tokens + `<fake_token_around_image>`, both to the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from relayrl.models.tiny import train_char_tokenizer

IMAGE = "<image>"
VISION_TOKENS = ("<fake_token_around_image>", IMAGE, "<global-img>")

# The tiny chat template, taking a message's content as a string or as content parts (`{"type": "image"}`,
# `{"type": "text", "text": ...}`, as transformers' templates take them): an image part is written `<image>`.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['content'] is string %}{% set body = m['content'] %}"
    "{% else %}{% set body = namespace(text='') %}"
    "{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}{% set body.text = body.text + '<image>' %}"
    "{% else %}{% set body.text = body.text + part['text'] %}{% endif %}"
    "{% endfor %}{% set body = body.text %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ body + eos_token }}{% else %}{{ body }}{% endif %}"
    "{% endfor %}"
)


def build_tiny_vlm(
    texts: Iterable[str],
    out_dir: str | Path,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 3,
    vision_hidden: int = 64,
    vision_layers: int = 2,
    image_size: int = 32,
    patch: int = 4,
    scale_factor: int = 2,
    max_positions: int = 512,
):
    """A randomly initialised fp32 Idefics3 and its processor (tokenizer trained on `texts`), saved to `out_dir`.
    Returns (model, processor)."""
    import torch
    from transformers import Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = train_char_tokenizer(texts)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    shape = dict(hidden=hidden, layers=layers, vision_hidden=vision_hidden, vision_layers=vision_layers)
    config = _config(tokenizer, image_size, patch, scale_factor, max_positions, **shape)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).float()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    image_tokens = (image_size // patch) ** 2 // scale_factor**2
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_tokens, chat_template=CHAT_TEMPLATE
    )
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model, processor


def _config(tokenizer, image_size, patch, scale_factor, max_positions, hidden, layers, vision_hidden, vision_layers):
    """The Idefics3Config: a SigLIP-shaped vision tower of `vision_layers` and a Llama text model of `layers`."""
    from transformers import Idefics3Config, LlamaConfig
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

    pad, bos, eos = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    image_id = tokenizer.convert_tokens_to_ids(IMAGE)
    assert isinstance(pad, int) and isinstance(bos, int) and isinstance(eos, int) and isinstance(image_id, int)
    vision = Idefics3VisionConfig(
        hidden_size=vision_hidden,
        intermediate_size=4 * vision_hidden,
        num_hidden_layers=vision_layers,
        num_attention_heads=max(1, vision_hidden // 32),
        image_size=image_size,
        patch_size=patch,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 32),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
    )
    return Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=image_id,
        scale_factor=scale_factor,
        tie_word_embeddings=True,
        pad_token_id=pad,
    )
