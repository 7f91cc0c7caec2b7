"""The learner's peak memory in an update, beyond its states: what one micro-batch's forward keeps for the
backward, what the backward adds at its peak, and the LM head's logits (issue 18: long responses, token
budgets). Counted from what a Hugging Face Llama-family decoder saves, not fitted to a measurement.

Values kept per token by one decoder layer (`layer_values`; fp32 on CPU, bf16 under autocast on GPU):
  the residual stream before and after attention (2h), the two RMSNorm outputs (2h), q and k, their
  rotate_half and their rotary-embedded copies (3q + 3kv), v (kv), the attention output (q) and its
  log-sum-exp (heads), the MLP's gate, SiLU(gate), up and their product (4I)
  = 4h + 4q + 4kv + 4I + heads
(checked with `torch.autograd.graph.saved_tensors_hooks` on two shapes: within 8%). The final norm keeps 2h.
- The backward frees what a node saved as that node finishes, and the gradients it makes are about the size of
  what it frees; so at its peak it adds only the gradient of the residual stream (h) and, in a plain run, the
  response positions' hidden states with their gradient scattered back over every position (2h): 3h.
- `learner.activation_checkpointing`: a layer keeps only its input (h); the backward rebuilds one layer at a
  time (its values) beside the residual stream's gradient (h); the head is done with by then.
(The in-flight terms were first written as 3h + 3I, the MLP's gradients counted on top of its saved values;
the first three points of the checkpointed sweep measured with MALLOC_MMAP_THRESHOLD_ set showed them freed.)
- Logits (`train.logits_chunk` C > 0): the head runs over C response positions at a time and is recomputed in
  the backward: up to 5 [C, V] fp32 tensors alive (the logits, logits / T, their log-softmax kept for the
  backward, the entropy's two temporaries). C = 0: the model's logits over every position [positions, V] plus
  those 5 over all the response positions (the backward's gradient takes the place of the temporaries).
- The micro-batch's copied tensors (`Experience.select`): ~32 B a position (ids, masks, log-probs).
Left out: allocator slack (glibc keeps freed blocks under its mmap threshold, up to 32 MiB each, in its heap:
a checkpointed CPU run's peak RSS held up to 2.2x these live bytes, unless learner.return_freed_memory fixes the
threshold, relayrl/learner/malloc.py), attention kernels' workspace. The weights' bf16 copies are `weight_copies`.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.models.shape import ModelShape

LOGITS_ALIVE = 5  # [C, V] fp32 tensors of one head chunk alive at once (see the module docstring)
BATCH_BYTES_PER_POSITION = 32  # a micro-batch's copy of its rows: int64 ids and versions, masks, log-probs


def intermediate_size(shape: ModelShape) -> int:
    """The MLP width: config.json's, or what the parameter count leaves after embeddings and attention."""
    if shape.intermediate:
        return shape.intermediate
    h, q, kv = shape.hidden, shape.q_width, shape.kv_heads * shape.head_dim
    embeddings = shape.vocab * h * (1 if shape.tied in (True, None) else 2)
    per_layer = (shape.text_params - embeddings - h) / shape.layers - (2 * h * q + 2 * h * kv) - 2 * h
    return max(1, round(per_layer / (3 * h)))


def layer_values(shape: ModelShape) -> int:
    """Values one decoder layer keeps per token for its backward: 4h + 4q + 4kv + 4I + heads."""
    h, q, kv = shape.hidden, shape.q_width, shape.kv_heads * shape.head_dim
    return 4 * h + 4 * q + 4 * kv + 4 * intermediate_size(shape) + (shape.heads or q // shape.head_dim)


@dataclass(frozen=True)
class LearnerPeak:
    """Bytes of one micro-batch's update beyond the states (weights, gradients, optimizer)."""

    positions: int  # forward positions of the largest micro-batch
    response_positions: int  # of them, those predicting a response token (where the LM head runs)
    kept: float  # activations the forward keeps for the backward
    backward: float  # what the backward adds at its peak: a rebuilt layer (checkpointing), gradients in flight
    logits: float
    batch: float  # the micro-batch's copied tensors
    checkpointing: bool
    chunk: int

    @property
    def activations(self) -> float:
        return self.kept + self.backward + self.batch


def learner_peak(
    shape: ModelShape,
    positions: int,
    response_positions: int,
    value_bytes: int,
    checkpointing: bool = False,
    logits_chunk: int = 0,
) -> LearnerPeak:
    """`value_bytes`: bytes of an activation (4 fp32, 2 bf16); the logits are fp32 whatever it is."""
    h, layers = shape.hidden, shape.layers
    per_layer = layer_values(shape)
    kept = layers * (h if checkpointing else per_layer) + 2 * h
    backward = per_layer + h if checkpointing else 3 * h  # a rebuilt layer + the residual's gradient, or the head's
    if logits_chunk > 0:
        logits = LOGITS_ALIVE * min(logits_chunk, response_positions) * shape.vocab * 4
    else:
        logits = (positions + LOGITS_ALIVE * response_positions) * shape.vocab * 4
    return LearnerPeak(
        positions=positions,
        response_positions=response_positions,
        kept=positions * kept * value_bytes,
        backward=positions * backward * value_bytes,
        logits=float(logits),
        batch=float(positions * BATCH_BYTES_PER_POSITION),
        checkpointing=checkpointing,
        chunk=logits_chunk,
    )


def pass_logits(shape: ModelShape, positions: int, response_positions: int, value_bytes: int, chunk: int) -> float:
    """The peak of a no-grad log-prob pass beyond the weights (old log-probs, the reference): the head's output in
    the activation dtype and the LOGITS_ALIVE fp32 [C, V] tensors of one chunk; with `chunk` 0 the model's logits
    over every position, their response rows gathered, and those tensors over all the response rows. The decoder's
    own values are freed layer by layer without a backward (measured by relayrl/planner/simulate.py)."""
    vocab = shape.vocab
    if chunk > 0:
        return float(min(chunk, response_positions) * vocab * (value_bytes + LOGITS_ALIVE * 4))
    return float(positions * vocab * value_bytes + response_positions * vocab * (value_bytes + LOGITS_ALIVE * 4))


def check_logits(shape: ModelShape, positions: int, response_positions: int, value_bytes: int, chunk: int) -> float:
    """The run's first pass adds the forward layout's one-time check (relayrl/learner/layout.py `_check`): a plain
    forward whose logits cover every position, compared with the chunked or packed log-probs. None with `chunk` 0
    on padded rows (the plain forward is the pass itself)."""
    return pass_logits(shape, positions, response_positions, value_bytes, 0)


def weight_copies(shape: ModelShape, ranks: int, value_bytes: int, backward: bool, reference: bool = False) -> float:
    """The bf16 copies of the fp32 weights a GPU pass holds beside them (none with fp32 passes, `value_bytes` 4).
    One process: autocast casts each weight of the policy once and keeps the copy until the pass (and its backward)
    ends: P x 2 B. W ranks: FSDP2 gathers a unit's parameters in bf16 for its pass; the root's (the embeddings and the
    head) stay gathered for the whole pass, a decoder layer's while it runs; the backward adds their unsharded bf16
    gradients before the reduce-scatter. The no-grad passes leave the policy's root gathered while the reference's
    runs (relayrl/learner/sharded.py reshards after both). Measured by relayrl/planner/simulate.py."""
    if value_bytes >= 4:
        return 0.0
    if ranks == 1:
        return float(shape.params * value_bytes)
    root = shape.vocab * shape.hidden * (1 if shape.tied in (True, None) else 2)
    layer = max(0.0, (shape.params - root) / shape.layers)
    if backward:
        return (root + layer) * value_bytes * 2.0
    return (root * (2 if reference else 1) + layer) * value_bytes
