"""A learned reward: a transformers sequence-classification model (one label) scoring prompt + completion.

`RewardModel(path).score(prompts, completions)` pads each batch (right side; the model reads the last
non-pad token) and returns one float per sample. It holds nothing but the model and tokenizer, so it can
run as its own role (a reward worker, or a Ray actor wrapping it). As a reward spec:
`reward: {fn: reward_model, kwargs: {path: runs/rm}}`; the model is loaded once per process.
On a GPU (`device=cuda`) its weights claim their share of it first (relayrl/rollout/memory.py: refused naming the
engine beside it when the two do not fit). Left out: GPU placement beyond `device=`, and chat-template rendering (the text is prompt + completion).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from relayrl.errors import RewardError
from relayrl.rollout.memory import REWARD_MODEL_ROLE, claim_bytes


class RewardModel:
    def __init__(self, path: str | Path, batch_size: int = 16, max_length: int = 1024, device: str = "cpu"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise RewardError(f"reward_model: no model at {path} (expected a directory with config.json)")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        claim_bytes(REWARD_MODEL_ROLE, device, nbytes)  # on an engine's GPU: refused by name, not an OOM later
        self.model = model.to(device).eval()
        if self.model.config.num_labels != 1:
            raise RewardError(
                f"reward_model: {path} has num_labels={self.model.config.num_labels}; a reward model "
                "has one output (num_labels=1)"
            )
        if self.tokenizer.pad_token_id is None:
            raise RewardError(f"reward_model: the tokenizer at {path} has no pad token; batches cannot be padded")
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # how the model finds each row's last token
        self.tokenizer.padding_side = "right"
        self.batch_size, self.max_length, self.device = batch_size, max_length, device

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
            )
            logits = self.model(**batch.to(self.device)).logits  # [B, 1]
            scores.extend(logits[:, 0].float().tolist())
        return scores


@functools.cache
def shared_reward_model(path: str | None, **options) -> RewardModel:
    if path is None:
        raise RewardError("reward 'reward_model' needs a model: set reward.kwargs.path")
    return RewardModel(path, **options)
