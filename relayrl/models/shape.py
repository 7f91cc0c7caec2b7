"""A model's shape (parameters, layers, hidden size, KV heads, head dim, vocab) from its config.json alone.

The parameter count is config arithmetic for the Llama family (llama, mistral, qwen2, qwen3): embedding,
GQA attention (with the biases each architecture has), gated MLP, RMSNorm weights, and the LM head when it
is not tied. No weights are read. Other architectures are refused by name; pass the shape flags instead.

A vision-language model (a config.json with `vision_config` and `text_config`: Idefics3/SmolVLM, LLaVA,
Qwen2-VL, ...) takes its layers, hidden size, heads and vocabulary from `text_config`, and its parameters from
the model built on the meta device from the config (no weights read, no memory taken): the vision tower (what
`model.freeze_vision` freezes, relayrl/models/vision.py), the language model with its LM head, and the connector
(everything else: the projector from image features to the language model's width). Where the config fixes
them it also gives the image tokens one image becomes in the prompt and the patches the tower encodes per image.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.errors import ModelError

if TYPE_CHECKING:
    from types import SimpleNamespace

    from transformers import PretrainedConfig

    HFConfig = PretrainedConfig | SimpleNamespace  # a config.json: transformers' object, or its raw keys as attributes

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
SHAPE_FLAGS = {"params", "layers", "hidden", "kv_heads", "head_dim", "vocab"}  # enough for a plan without config.json


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    # Known from config.json, not from the shape flags; without them the time model counts 2*P FLOPs per
    # token (the LM head counted as tied) and plan.measure cannot build the model's matmul shapes.
    heads: int | None = None
    intermediate: int | None = None
    tied: bool | None = None
    # A vision-language model's vision part (0 and None for a text-only model); `params` counts it too
    vision_params: int = 0  # the vision tower: what model.freeze_vision freezes
    connector_params: int = 0  # the projector from the tower's features to the language model (trained)
    image_tokens: int | None = None  # tokens one image becomes in the prompt, where the config fixes it
    image_patches: int | None = None  # patches the tower encodes per image, where the config fixes it
    patch_merge: int | None = None  # tower patches per image token (pixel shuffle, spatial merge, pooling)

    @property
    def text_params(self) -> int:
        """The language model's parameters (its LM head included): what runs per token."""
        return self.params - self.vision_params - self.connector_params

    @property
    def matmul_params(self) -> int:
        """Weights a token's forward multiplies by: every linear layer and the LM head (tied or not), not the
        embedding lookup (a gather) and not the norms. Untied: P counts the embedding apart from the head. A
        vision-language model's tower and connector run per image, not per token (relayrl/planner/vision.py)."""
        return self.text_params if self.tied in (True, None) else self.text_params - self.vocab * self.hidden

    @property
    def q_width(self) -> int:
        """heads x head_dim: the width of the queries (and of the attention output)."""
        return self.heads * self.head_dim if self.heads else self.hidden


def count_params(cfg: HFConfig) -> int:
    """Parameters of a Llama-family causal LM from its `PretrainedConfig`, as `sum(p.numel())` counts them."""
    if cfg.model_type not in LLAMA_FAMILY:
        raise ModelError(
            f"cannot count parameters of model_type={cfg.model_type!r} "
            f"(known: {', '.join(LLAMA_FAMILY)}); pass plan.params/layers/hidden/kv_heads/head_dim/"
            "vocab instead"
        )
    h, v, heads, kv, hd = cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads, _kv_heads(cfg), _head_dim(cfg)
    q, k = heads * hd, kv * hd  # widths of the query and of each of the key/value projections
    qkv_bias = cfg.model_type == "qwen2" or getattr(cfg, "attention_bias", False)
    o_bias = cfg.model_type != "qwen2" and getattr(cfg, "attention_bias", False)
    attention = h * q + 2 * h * k + q * h + qkv_bias * (q + 2 * k) + o_bias * h
    mlp = 3 * h * cfg.intermediate_size + getattr(cfg, "mlp_bias", False) * (2 * cfg.intermediate_size + h)
    norms = 2 * h + (2 * hd if cfg.model_type == "qwen3" else 0)  # two RMSNorms; qwen3 adds q_norm and k_norm
    head = 0 if cfg.tie_word_embeddings else v * h
    return v * h + cfg.num_hidden_layers * (attention + mlp + norms) + h + head  # + h: the final norm


def shape_from_config(cfg: PretrainedConfig) -> ModelShape:
    """A text-only model's shape by the Llama-family arithmetic; a vision-language model's by its meta build."""
    if is_vision_language(cfg):
        return vision_language_shape(cfg)
    return text_shape(cfg, count_params(cfg))


def text_shape(cfg: PretrainedConfig, params: int) -> ModelShape:
    """The shape of a decoder of `params` parameters from its (text) config."""
    return ModelShape(
        params=params,
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        kv_heads=_kv_heads(cfg),
        head_dim=_head_dim(cfg),
        vocab=cfg.vocab_size,
        heads=cfg.num_attention_heads,
        intermediate=cfg.intermediate_size,
        tied=bool(getattr(cfg, "tie_word_embeddings", False)),  # a VLM's text config may leave it to the top
    )


def load_shape(model_path: str, **flags: float | None) -> ModelShape:
    """The shape from `model_path`'s config.json; flags that are not None (params=7e9, layers=28, ...) win.

    With every flag given, no config.json is needed (a 7B plan without weights).
    """
    given: dict[str, Any] = {name: int(value) for name, value in flags.items() if value is not None}  # ModelShape's
    if set(given) >= SHAPE_FLAGS:
        return ModelShape(**given)
    if not model_path or not (Path(model_path) / "config.json").is_file():
        raise ModelError(
            f"model.path={model_path!r} has no config.json; point it at a model directory or pass "
            "all of plan.params, layers, hidden, kv_heads, head_dim and vocab"
        )
    from transformers import AutoConfig

    return replace(shape_from_config(AutoConfig.from_pretrained(model_path)), **given)


def is_vision_language(cfg: PretrainedConfig) -> bool:
    return getattr(cfg, "vision_config", None) is not None and getattr(cfg, "text_config", None) is not None


@dataclass(frozen=True)
class VisionLanguageParams:
    """A vision-language model's parameters by part, as `sum(p.numel())` counts them (tied weights once)."""

    tower: int
    connector: int
    text: int
    tied: bool  # the LM head is the input embedding

    @property
    def total(self) -> int:
        return self.tower + self.connector + self.text


def vision_language_shape(cfg: PretrainedConfig) -> ModelShape:
    parts = count_vision_language_params(cfg)
    tokens, patches, merge = image_geometry(cfg)
    return replace(
        text_shape(cfg.text_config, parts.total),
        tied=parts.tied,
        vision_params=parts.tower,
        connector_params=parts.connector,
        image_tokens=tokens,
        image_patches=patches,
        patch_merge=merge,
    )


def count_vision_language_params(cfg: PretrainedConfig) -> VisionLanguageParams:
    """Count the model built on the meta device by part: the tower, the language model with its LM head, and
    the rest (the connector)."""
    from relayrl.models.vision import vision_tower

    model = meta_model(cfg)
    tower = vision_tower(model)
    language = [module for holder in (model, getattr(model, "model", None)) for module in _language_parts(holder)]
    if tower is None or not language:
        raise ModelError(f"{type(model).__name__}: cannot find its vision tower and language model to count them")
    in_tower = {id(p) for p in tower.parameters()}
    in_text = {id(p) for module in language for p in module.parameters()}
    counts = {"tower": 0, "connector": 0, "text": 0}
    for param in model.parameters():  # each shared (tied) parameter once
        part = "tower" if id(param) in in_tower else "text" if id(param) in in_text else "connector"
        counts[part] += param.numel()
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and head.weight is embedding.weight
    return VisionLanguageParams(**counts, tied=tied)


LANGUAGE_NAMES = ("language_model", "text_model", "lm_head")  # the language model and its head, by attribute


def _language_parts(holder) -> list:
    import torch

    modules = (getattr(holder, name, None) for name in LANGUAGE_NAMES) if holder is not None else ()
    return [module for module in modules if isinstance(module, torch.nn.Module)]


def meta_model(cfg: PretrainedConfig):
    """The model `cfg.architectures` names (else transformers' image-text-to-text class for it), built on the
    meta device: its parameters have shapes and no storage."""
    import torch
    import transformers

    named = [getattr(transformers, name, None) for name in getattr(cfg, "architectures", None) or ()]
    builder = next((cls for cls in named if cls is not None), None)
    try:
        with torch.device("meta"):
            if builder is not None:
                return builder(cfg)
            return transformers.AutoModelForImageTextToText.from_config(cfg)
    except (ValueError, TypeError, AttributeError, ImportError, KeyError, RuntimeError) as err:
        raise ModelError(
            f"cannot build model_type={cfg.model_type!r} from its config to count its parameters ({err}); pass "
            "plan.params/layers/hidden/kv_heads/head_dim/vocab instead"
        ) from None


def image_geometry(cfg: PretrainedConfig) -> tuple[int | None, int | None, int | None]:
    """(image tokens per image, tower patches per image, patches per image token) where the config fixes them:
    a fixed `image_size` gives the patches; a dynamic resolution (Qwen2-VL) gives only the merge."""
    vision = cfg.vision_config
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    patches = (size // patch) ** 2 if isinstance(size, int) and isinstance(patch, int) and patch > 0 else None
    merge = _patch_merge(cfg, patches)
    tokens = getattr(cfg, "mm_tokens_per_image", None) or (patches // merge if patches and merge else None)
    return tokens, patches, merge


def _patch_merge(cfg: PretrainedConfig, patches: int | None) -> int | None:
    """Patches per image token: Idefics3's pixel shuffle (scale_factor squared), Qwen2-VL's spatial merge (its
    square), Gemma3's pooling (patches / mm_tokens_per_image), LLaVA's none (one token a patch)."""
    if isinstance(scale := getattr(cfg, "scale_factor", None), int) and scale > 0:
        return scale**2
    if isinstance(merge := getattr(cfg.vision_config, "spatial_merge_size", None), int) and merge > 0:
        return merge**2
    if isinstance(tokens := getattr(cfg, "mm_tokens_per_image", None), int) and tokens > 0 and patches:
        return max(1, patches // tokens)
    return 1 if cfg.model_type == "llava" else None


def _kv_heads(cfg: HFConfig) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def _head_dim(cfg: HFConfig) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
