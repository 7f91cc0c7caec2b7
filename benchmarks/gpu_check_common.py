"""What the steps of benchmarks/gpu_check.py share: the device, timing, local models, experience and configs.

Nothing here is downloaded: models are random Llamas built with relayrl/models/tiny.py's character tokenizer, in
the work directory the shell script hands over (never under $OUT, whose files travel back). torch is imported by
the functions, not the module, so `gpu_check.py table` runs without it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

REHEARSE = os.environ.get("GPU_CHECK_REHEARSE") == "1"
# the CPU rehearsal's stand-in for the GPU shapes (step_0p5b, learner_speed: one model, built once in the work dir);
# it asks for the GPU shape's 32000 ids too, so its tokenizer is built as the device builds it
SHAPE_REHEARSAL = {"vocab": 32000, "hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 1024}
TEXTS = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [" "]  # the toy task's characters


class Missing(Exception):  # noqa: N818  (a step raises it to be skipped: "skipped: needs <what>")
    """What a step needs and this machine lacks; the row reads `skipped: needs <message>`."""


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, *args, **kwargs):
    """(fn's result, seconds), the device synchronised on both sides."""
    sync()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    sync()
    return out, time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads() -> int:
    """torch's CPU threads per process: GPU_CHECK_THREADS, else every core with CUDA (the box's 16 feed one GPU) and
    one in the CPU rehearsal (its 2 shared cores: two OpenMP threads on a loaded machine ran a step 4-30x slower)."""
    import torch

    if os.environ.get("GPU_CHECK_THREADS"):
        return int(os.environ["GPU_CHECK_THREADS"])
    return max(1, os.cpu_count() or 1) if torch.cuda.is_available() else 1


def set_threads() -> None:
    import torch

    torch.set_num_threads(threads())


def tiny_model(work: Path, name: str = "tiny", **shape) -> Path:
    """relayrl's tiny random Llama with the toy task's character tokenizer (vocab ~16), built once in `work`."""
    from relayrl.models.tiny import build_tiny

    out = Path(work) / name
    if not (out / "config.json").is_file():
        build_tiny(TEXTS, out, seed=0, **shape)
    return out


def shaped_model(
    work: Path,
    name: str,
    vocab: int,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_positions: int = 512,
) -> Path:
    """A random Llama of a given shape (grouped-query attention, tied embeddings) with a character tokenizer of
    exactly `vocab` ids: the tokenizer's corpus is `vocab - 4` distinct code points from U+3400 on (CJK and Hangul
    blocks, below the surrogates), so every id the model can sample decodes. Built on the device, saved in bf16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from relayrl.models.tiny import train_char_tokenizer

    out = Path(work) / name
    if (out / "config.json").is_file():
        return out
    assert 0x3400 + vocab < 0xD800, "the corpus must stay below the surrogate code points"
    tokenizer = train_char_tokenizer([chr(0x3400 + i) for i in range(vocab - 4)])
    assert len(tokenizer) == vocab, (len(tokenizer), vocab)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(0)
    with torch.device(device()):
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)  # the learner and the engine load it as fp32
    tokenizer.save_pretrained(out)
    return out


def config(model_dir: Path, *extra: str, groups: int = 4, n: int = 4):
    """relayrl's resolved config for the learner and the HF engine on `model_dir`."""
    from relayrl.build import resolve
    from relayrl.config import load_config

    overrides = [
        f"model.path={model_dir}",
        "rollout.engine=hf",
        f"rollout.n={n}",
        f"rollout.prompts_per_step={groups}",
        "train.lr=1e-3",
    ]
    return resolve(load_config(None, overrides + list(extra)))


def experience(seed: int = 0, groups: int = 4, n: int = 4, vocab: int = 16, prompt: int = 3, response: int = 7):
    """Rollouts of ragged prompts (prompt.. prompt+groups-1 tokens) and responses (1..response tokens) with
    rewards that vary within each group, and their GRPO advantages."""
    import torch

    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.learner.batching import make_experience
    from relayrl.types import Prompt, Rollout, Score

    gen = torch.Generator().manual_seed(seed)
    rollouts, scores = [], []
    for g in range(groups):
        ids = torch.randint(4, vocab, (prompt + g,), generator=gen).tolist()
        p = Prompt(id=f"p{g}", text="", token_ids=ids)
        for i in range(n):
            length = 1 + (3 * g + 2 * i + seed) % response
            tokens = torch.randint(4, vocab, (length,), generator=gen).tolist()
            rollouts.append(Rollout(p, i, tokens, "", [-1.5] * length, "stop", [0] * length))
            scores.append(Score(float((g + i + seed) % 2) + 0.1 * i))
    exp = make_experience(rollouts, scores, pad_id=0)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def rollouts_experience(rollouts, pad_id: int):
    """The learner's Experience of an engine's rollouts, with made-up rewards (response length parity, varied
    within groups) and their GRPO advantages."""
    from relayrl.algorithms.advantages import grpo, make_inputs
    from relayrl.learner.batching import make_experience
    from relayrl.types import Score

    scores = [Score(float(len(r.response_ids) % 2) + 0.01 * r.group_index) for r in rollouts]
    exp = make_experience(rollouts, scores, pad_id=pad_id)
    exp.advantages, _ = grpo(make_inputs(exp.rewards, exp.loss_mask, exp.group_ids))
    return exp


def prompts(count: int, length: int, vocab: int, seed: int = 0):
    """`count` prompts of `length` random token ids (ids 4.. vocab-1: no special tokens)."""
    import torch

    from relayrl.types import Prompt

    gen = torch.Generator().manual_seed(seed)
    return [
        Prompt(id=f"q{i}", text="", token_ids=torch.randint(4, vocab, (length,), generator=gen).tolist())
        for i in range(count)
    ]


def grads_of_first_step(learner, exp):
    """The trainable parameters' gradients at the first optimizer step (before it), and the update's stats."""
    captured = []
    trainable = [p for p in learner.model.parameters() if p.requires_grad]

    def hook(*_):
        if not captured:
            captured.extend(p.grad.clone() for p in trainable)

    learner.optimizer.register_step_pre_hook(hook)
    return captured, learner.update(exp).metrics


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def fmt(x: float) -> str:
    return f"{x:.2g}" if abs(x) < 0.01 and x != 0 else f"{x:.3g}"
