"""How the learner lays a batch out for the model (`train.packing`): right-padded rows, one per sample, or one
packed row per group (relayrl/learner/packing.py), and the positions each forward computes over.

The first packed forward of a run is checked against the padded forward of the same batch (no gradients):
a model whose attention or positions do not honour a custom 4D mask and explicit position ids would give
other log-probs, and the run stops with one message instead of training on them.
"""

from __future__ import annotations

import torch

from relayrl.errors import ConfigError
from relayrl.learner.packing import pack_groups, packed_positions, padded_positions, unpack_logits
from relayrl.types import Experience

PACKABLE_ATTENTION = ("sdpa", "eager")  # implementations that take a custom 4D mask as it is
MIN_SAVING = 0.10  # `auto` packs when that computes at least this share fewer positions
PARITY_TOLERANCE = {torch.float32: 1e-3}  # max |log-prob difference|, packed vs padded; 5e-2 under bf16
PAD_ID = 0  # any id: padded positions are masked out and predict nothing


class ForwardLayout:
    def __init__(self, packing: str, model_config, device: str):
        self.packing = packing
        self.attention = getattr(model_config, "_attn_implementation", None)
        self.architecture = (getattr(model_config, "architectures", None) or ["?"])[0]
        self.device = device
        if packing == "groups" and self.attention not in PACKABLE_ATTENTION:
            raise ConfigError(f"train.packing=groups needs {' or '.join(PACKABLE_ATTENTION)} attention; "
                              f"{self.architecture} uses {self.attention!r}. Use train.packing=auto or none.")
        self.checked = False
        self.positions = 0  # computed over since the last `take_counts`
        self.tokens = 0  # of which real tokens (the rest is padding)
        self.packed_forwards = 0
        self.forwards = 0

    def chooses_packing(self, exp: Experience) -> bool:
        if self.packing == "none" or exp.prompt_lengths is None or self.attention not in PACKABLE_ATTENTION:
            return False
        return self.packing == "groups" or packed_positions(exp) <= (1 - MIN_SAVING) * padded_positions(exp)

    def logits(self, model, exp: Experience) -> torch.Tensor:
        """Logits predicting every target token of `exp`: [B, T-1, V] in the model's output dtype."""
        self.forwards += 1
        if not self.chooses_packing(exp):
            self.positions += exp.attention_mask.numel()
            self.tokens += int(exp.attention_mask.sum())
            return self._padded(model, exp)
        packed = pack_groups(exp, PAD_ID)
        self.positions += packed.positions
        self.tokens += packed.tokens
        self.packed_forwards += 1
        logits = self._packed(model, packed)
        if not self.checked:
            self._check(model, exp, packed, logits)
        return logits

    def take_counts(self) -> dict[str, float]:
        """Positions computed and their padding share since the last call (learner/* metrics)."""
        counts = {"learner/positions": float(self.positions),
                  "learner/padding_frac": 1.0 - self.tokens / max(self.positions, 1),
                  "learner/packed_frac": self.packed_forwards / max(self.forwards, 1)}
        self.positions = self.tokens = self.packed_forwards = self.forwards = 0
        return counts

    def _padded(self, model, exp: Experience) -> torch.Tensor:
        out = model(input_ids=exp.input_ids.to(self.device), attention_mask=exp.attention_mask.to(self.device))
        return out.logits[:, :-1]

    def _packed(self, model, packed) -> torch.Tensor:
        mask = packed.attention_mask if self.attention == "sdpa" else packed.additive_mask(model.dtype)
        out = model(input_ids=packed.input_ids.to(self.device), position_ids=packed.position_ids.to(self.device),
                    attention_mask=mask.to(self.device))
        return unpack_logits(out.logits, packed)

    @torch.no_grad()
    def _check(self, model, exp: Experience, packed, logits: torch.Tensor) -> None:
        padded = self._padded(model, exp)
        index = (packed.sample, packed.column)
        gap = float((torch.log_softmax(logits.detach()[index].float(), -1)
                     - torch.log_softmax(padded[index].float(), -1)).abs().max())
        tolerance = PARITY_TOLERANCE.get(padded.dtype, 5e-2)
        if gap > tolerance:
            raise ConfigError(f"train.packing: the group-packed forward of {self.architecture} ({self.attention} "
                              f"attention) gives log-probs up to {gap:.2g} away from the padded forward (tolerance "
                              f"{tolerance:g}); this model does not honour a custom attention mask and position "
                              "ids. Set train.packing=none.")
        self.checked = True
