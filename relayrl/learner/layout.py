"""How the learner runs the model over a batch and turns its output into per-token log-probs and entropies.

Two choices, each with a setting:
- `train.packing`: right-padded rows, one per sample, or one packed row per group (relayrl/learner/packing.py).
- `train.logits_chunk`: the LM head applied to the final hidden states only where a response token is
  predicted, that many positions at a time (relayrl/learner/token_stats.py); 0 = the model's own logits.

The first forward of a run is checked against the plain one (padded rows, the model's logits) on the same
batch: a model whose attention ignores a custom mask or position ids, or whose logits are more than its
head over the hidden states (soft-capping, scaling), would give other log-probs, and the run stops with
one message naming the setting to change instead of training on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from relayrl.errors import ConfigError
from relayrl.learner.packing import pack_groups, packed_positions, packing_pays, padded_positions
from relayrl.learner.token_stats import head_stats, logits_stats, output_head

if TYPE_CHECKING:
    from relayrl.types import Experience

PACKABLE_ATTENTION = ("sdpa", "eager", "flex_attention")  # implementations that take a custom mask as it is
# max |log-prob difference| vs the plain forward. Half precision: bf16 logits of magnitude ~10 round to ~0.06, so
# only gross differences (a mask or position ids ignored: order 1 and more) are caught there
PARITY_TOLERANCE = {torch.float32: 1e-3}
HALF_PRECISION_TOLERANCE = 0.25
PAD_ID = 0  # any id: padded positions are masked out and predict nothing


@dataclass(frozen=True)
class Sampled:
    """The distribution the engine sampled from: what the log-probs are taken under."""

    temperature: float
    top_k: int
    top_p: float
    suppressed: tuple[int, ...] = ()  # never sampled: a vision-language model's image tokens (data/vision.py)


@dataclass
class Predictions:
    """What the model says at the positions that predict a response token: hidden states [N, H] (or
    logits [N, V] with train.logits_chunk=0), and where each prediction goes in the Experience."""

    output: torch.Tensor
    sample: torch.Tensor  # [N] row in the Experience
    column: torch.Tensor  # [N] target column there


class ForwardLayout:
    def __init__(self, packing: str, logits_chunk: int, sampled: Sampled, model_config, device: str):
        self.packing, self.logits_chunk, self.sampled, self.device = packing, logits_chunk, sampled, device
        self.attention = getattr(model_config, "_attn_implementation", None)
        self.architecture = (getattr(model_config, "architectures", None) or ["?"])[0]
        if packing == "groups" and self.attention not in PACKABLE_ATTENTION:
            raise ConfigError(
                f"train.packing=groups needs {' or '.join(PACKABLE_ATTENTION)} attention; "
                f"{self.architecture} uses {self.attention!r}. Use train.packing=auto or none."
            )
        if packing == "groups" and device == "cuda" and self.attention != "flex_attention":
            raise ConfigError(
                f"train.packing=groups on a GPU needs model.attention=flex_attention: with {self.attention!r} "
                "attention each packed row takes a dense [L, L] mask built on the host (a 32k-token row: 1 GiB), "
                "and SDPA loses its flash kernel. Set model.attention=flex_attention, or train.packing=auto (padded "
                "rows on a GPU without FlexAttention)"
            )
        self.checked = False
        self.positions = self.tokens = self.packed_forwards = self.forwards = 0  # since the last take_counts

    def chooses_packing(self, exp: Experience) -> bool:
        if exp.images is not None:
            if self.packing == "groups":
                raise ConfigError(
                    "train.packing=groups does not take rows with images: a group's packed row would put several "
                    "samples' image tokens in one sequence, and the vision model's inputs are per sample. Use "
                    "train.packing=auto (padded rows for image batches) or none"
                )
            return False
        if self.packing == "none" or exp.prompt_lengths is None or self.attention not in PACKABLE_ATTENTION:
            return False
        if self.device == "cuda" and self.attention != "flex_attention":
            return False  # auto: never a dense [L, L] mask on a GPU (groups without flex is refused at the start)
        return self.packing == "groups" or packing_pays(packed_positions(exp), padded_positions(exp))

    def token_stats(self, model, exp: Experience, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, entropies) of the response tokens of `exp`, [B, T-1] each (fp32, 0 elsewhere)."""
        packed = self.chooses_packing(exp)
        predictions = self._packed(model, exp) if packed else self._padded(model, exp)
        targets = exp.input_ids[predictions.sample, predictions.column + 1].to(self.device)
        index = (predictions.sample.to(self.device), predictions.column.to(self.device))
        logp, entropy = self._stats(model, predictions.output, targets, entropy_grad)
        if not self.checked:
            self._check(model, exp, index, targets, logp, packed)
        shape = (len(exp), exp.input_ids.shape[1] - 1)
        return logp.new_zeros(shape).index_put(index, logp), entropy.new_zeros(shape).index_put(index, entropy)

    def take_counts(self) -> dict[str, float]:
        """Positions computed and their padding share since the last call (learner/* metrics)."""
        counts = {
            "learner/positions": float(self.positions),
            "learner/padding_frac": 1.0 - self.tokens / max(self.positions, 1),
            "learner/packed_frac": self.packed_forwards / max(self.forwards, 1),
        }
        self.positions = self.tokens = self.packed_forwards = self.forwards = 0
        return counts

    # ------------------------------------------------------------------ the forward, each layout
    def _output(self, model, **inputs) -> torch.Tensor:
        inputs = {name: value.to(self.device) for name, value in inputs.items()}
        if self.logits_chunk > 0:  # hidden states; the head is applied in chunks (token_stats.py)
            decoder = getattr(model, "decoder_forward", None) or model.base_model  # sharded: via the root's hooks
            return decoder(**inputs).last_hidden_state
        return model(**inputs).logits

    def _padded(self, model, exp: Experience) -> Predictions:
        self.forwards += 1
        self.positions += exp.attention_mask.numel()
        self.tokens += int(exp.attention_mask.sum())
        output = self._output(model, input_ids=exp.input_ids, attention_mask=exp.attention_mask, **image_inputs(exp))
        sample, column = response_targets(exp)
        return Predictions(output[sample.to(self.device), column.to(self.device)], sample, column)

    def _packed(self, model, exp: Experience) -> Predictions:
        packed = pack_groups(exp, PAD_ID)
        self.forwards += 1
        self.packed_forwards += 1
        self.positions += packed.positions
        self.tokens += packed.tokens
        mask = self._packed_mask(packed, model.dtype)
        output = self._output(model, input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask)
        return Predictions(
            output[packed.row.to(self.device), packed.position.to(self.device)], packed.sample, packed.column
        )

    def _packed_mask(self, packed, dtype: torch.dtype):
        """The packed rows' mask in the form the attention kernel takes: SDPA a bool mask, eager an additive one,
        FlexAttention a BlockMask."""
        if self.attention == "flex_attention":
            return packed.flex_mask(self.device)
        return packed.attention_mask if self.attention == "sdpa" else packed.additive_mask(dtype)

    def _stats(self, model, output, targets, entropy_grad):
        s = self.sampled
        if self.logits_chunk > 0:
            head = output_head(model)
            return head_stats(
                output, head, targets, s.temperature, s.top_k, s.top_p, self.logits_chunk, entropy_grad, s.suppressed
            )
        return logits_stats(output, targets, s.temperature, s.top_k, s.top_p, entropy_grad, s.suppressed)

    # ------------------------------------------------------------------ first-use check
    @torch.no_grad()
    def _check(self, model, exp: Experience, index, targets: torch.Tensor, logp: torch.Tensor, packed: bool) -> None:
        """Compare this run's log-probs with the plain forward's (padded rows, the model's logits), once."""
        self.checked = True
        if not packed and self.logits_chunk <= 0:
            return  # this is the plain forward
        inputs = {"input_ids": exp.input_ids, "attention_mask": exp.attention_mask, **image_inputs(exp)}
        logits = model(**{name: value.to(self.device) for name, value in inputs.items()}).logits
        s = self.sampled
        plain, _ = logits_stats(logits[index], targets, s.temperature, s.top_k, s.top_p, False, s.suppressed)
        gap = float((logp.detach() - plain).abs().max()) if len(plain) else 0.0
        tolerance = PARITY_TOLERANCE.get(logits.dtype, HALF_PRECISION_TOLERANCE)
        if gap > tolerance:
            self.checked = False
            settings = [
                name
                for on, name in ((packed, "train.packing=none"), (self.logits_chunk > 0, "train.logits_chunk=0"))
                if on
            ]
            rows = "group-packed" if packed else "padded"
            head = "head over hidden states" if self.logits_chunk > 0 else "model logits"
            raise ConfigError(
                f"the learner's forward of {self.architecture} ({self.attention} attention, {rows} "
                f"rows, {head}) gives log-probs up to {gap:.2g} away from the plain forward (tolerance "
                f"{tolerance:g}): this model does not support it. Set {' or '.join(settings)}."
            )


def image_inputs(exp: Experience) -> dict[str, torch.Tensor]:
    """The rows' image tensors for the forward (pixel values and the model's other image inputs), if any."""
    return exp.images.batch() if exp.images is not None else {}


def response_targets(exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, target column) of every response token of a right-padded `exp`, row by row."""
    if exp.prompt_lengths is None:
        rows, columns = exp.loss_mask.nonzero(as_tuple=True)
        return rows, columns
    positions = torch.arange(exp.input_ids.shape[1] - 1)[None]
    first = exp.prompt_lengths[:, None] - 1
    last = exp.attention_mask.sum(dim=1, keepdim=True) - 1
    rows, columns = ((positions >= first) & (positions < last)).nonzero(as_tuple=True)
    return rows, columns
