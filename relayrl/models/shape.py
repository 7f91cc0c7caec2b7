"""A model's shape (parameters, layers, hidden size, KV heads, head dim, vocab) from its config.json alone.

The parameter count is config arithmetic for the Llama family (llama, mistral, qwen2, qwen3): embedding,
GQA attention (with the biases each architecture has), gated MLP, RMSNorm weights, and the LM head when it
is not tied. No weights are read. Other architectures are refused by name; pass the shape flags instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from relayrl.errors import ModelError

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
    # token (the LM head counted as tied) and --measure cannot build the model's matmul shapes.
    heads: int | None = None
    intermediate: int | None = None
    tied: bool | None = None

    @property
    def matmul_params(self) -> int:
        """Weights a token's forward multiplies by: every linear layer and the LM head (tied or not), not the
        embedding lookup (a gather) and not the norms. Untied: P counts the embedding apart from the head."""
        return self.params if self.tied in (True, None) else self.params - self.vocab * self.hidden

    @property
    def q_width(self) -> int:
        """heads x head_dim: the width of the queries (and of the attention output)."""
        return self.heads * self.head_dim if self.heads else self.hidden


def count_params(cfg) -> int:
    """Parameters of a Llama-family causal LM from its `PretrainedConfig`, as `sum(p.numel())` counts them."""
    if cfg.model_type not in LLAMA_FAMILY:
        raise ModelError(
            f"cannot count parameters of model_type={cfg.model_type!r} "
            f"(known: {', '.join(LLAMA_FAMILY)}); pass --params/--layers/--hidden/--kv-heads/--head-dim/"
            "--vocab instead"
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


def shape_from_config(cfg) -> ModelShape:
    return ModelShape(
        params=count_params(cfg),
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        kv_heads=_kv_heads(cfg),
        head_dim=_head_dim(cfg),
        vocab=cfg.vocab_size,
        heads=cfg.num_attention_heads,
        intermediate=cfg.intermediate_size,
        tied=bool(cfg.tie_word_embeddings),
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
            "all of --params --layers --hidden --kv-heads --head-dim --vocab"
        )
    from transformers import AutoConfig

    return replace(shape_from_config(AutoConfig.from_pretrained(model_path)), **given)


def _kv_heads(cfg) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def micro_batch_rows(config) -> int:
    """Rows of one micro-batch as the planner sizes activations: `train.micro_batch`, or with
    `train.micro_batch_tokens` the longest sequences the limits allow that fit in the budget (at least one:
    a sequence over the budget gets a micro-batch of its own)."""
    budget = config.train.micro_batch_tokens
    if budget is None:
        return min(config.train.micro_batch, config.mini_batch)
    longest = config.data.max_prompt_tokens + config.rollout.max_tokens
    return max(1, min(config.mini_batch, budget // longest))
