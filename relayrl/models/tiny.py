"""Build a tiny Llama-style causal LM and a character-level tokenizer, locally, from text.

Nothing is downloaded: the tokenizer's vocabulary is trained on the caller's corpus with the
`tokenizers` library and the model is a randomly initialised `LlamaForCausalLM`. The Llama config is
deliberate: transformers 5 rebuilds the byte-level pre-tokenizer of any `qwen2` checkpoint, which
silently drops the spaces of a character vocabulary; a `llama` checkpoint keeps ours, and vLLM serves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"

# A minimal chat template: user turns are written as-is, an assistant turn follows directly.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def train_char_tokenizer(texts: Iterable[str]):
    """A character-level `PreTrainedTokenizerFast` whose vocabulary is every character in `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # vocab_size: the trainer's default cap (30000) silently dropped every character past it (found by the GPU check,
    # whose 0.5B-shaped model asks for 32000 ids); a character vocabulary is every character seen, however many.
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, BOS, EOS, UNK], min_frequency=1, vocab_size=1 << 30)
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    vocab_size: int,
    hidden: int = 128,
    layers: int = 3,
    heads: int = 4,
    intermediate: int = 512,
    max_positions: int = 256,
    seed: int = 0,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
):
    """A randomly initialised fp32 `LlamaForCausalLM` (head_dim = hidden / heads, 32 by default)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def build_tiny(texts: Iterable[str], out_dir: str | Path | None = None, seed: int = 0, **model_kwargs):
    """Tokenizer trained on `texts` plus a fresh tiny model sized to it; saved to `out_dir` if given."""
    tokenizer = train_char_tokenizer(texts)
    pad, bos, eos = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    assert isinstance(pad, int) and isinstance(bos, int) and isinstance(eos, int)  # all three are in its vocabulary
    model = build_tiny_model(
        vocab_size=len(tokenizer), seed=seed, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos, **model_kwargs
    )
    if out_dir is not None:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return model, tokenizer
