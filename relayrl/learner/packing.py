"""Group packing: the learner's forward over one row per group, the prompt once and every response after it.

A GRPO-style batch holds n responses to each prompt. Right-padded rows (`Experience`) repeat the prompt n
times and pad every row to the longest sequence; on short responses that is most of the positions the
forward and backward compute over. Packed, a group's row is

    prompt | response 1 | response 2 | ... | response k

with position ids restarting at the prompt's length for each response and a block attention mask: the
prompt is causal, and a response token sees the prompt and the earlier tokens of its own response only.
Every response token then has exactly the context it has in its own row, so log-probs and gradients are
the same (the prompt positions receive the sum of their k rows' gradients, as before) over far fewer
positions: the shared-prefix idea of e.g. Prefix Grouper (Liu et al. 2025) for GRPO, done with a custom
4D mask that transformers passes to SDPA or eager attention as-is, or (model.attention=flex_attention, GPU) the
same rule as a FlexAttention block mask. A variable-length kernel (flash-attention's cu_seqlens) cannot express it:
its segments are independent sequences, and here every response shares the prompt's keys.

A row holds the samples of one group that share their prompt token for token. A group's samples usually do; a
forked multi-turn sample (env.tito=fork: an agent's call that rewrote its history starts a new sample from the
rebuilt call) or an agent whose first calls differ does not, and gets a row of its own (`shared_prompts`).

`pack_groups` builds the rows and says, for every response token, which packed position predicts it and
where it goes in the Experience's [B, T-1] layout (relayrl/learner/layout.py reads the model there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relayrl.types import Experience, filled


@dataclass
class PackedGroups:
    input_ids: torch.Tensor  # [R, L], one row per group
    position_ids: torch.Tensor  # [R, L]
    attention_mask: torch.Tensor  # [R, 1, L, L] bool: True where a query may attend (SDPA's convention)
    sample: torch.Tensor  # [N] per predicted response token: its row in the Experience
    column: torch.Tensor  # [N] its target column in the Experience
    row: torch.Tensor  # [N] the packed row holding its predictor position
    position: torch.Tensor  # [N] that position
    segments: torch.Tensor  # [R, L] per position: -1 padding, 0 the prompt, i response i
    shape: tuple[int, int]  # the Experience's [B, T-1]
    tokens: int  # real tokens among the positions (the rest is padding)

    @property
    def positions(self) -> int:
        return self.input_ids.numel()

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as eager attention adds it to the scores: 0 where allowed, the dtype's minimum elsewhere."""
        return torch.zeros(self.attention_mask.shape, dtype=dtype).masked_fill(
            ~self.attention_mask, torch.finfo(dtype).min
        )

    def flex_mask(self, device: str):
        """The same mask as FlexAttention's BlockMask: block-sparse, so the kernel skips every block in which one
        response would see another, and no dense [L, L] mask reaches the layers (model.attention=flex_attention)."""
        from torch.nn.attention.flex_attention import create_block_mask

        segments = self.segments.to(device)

        def allowed(row, head, query, key):  # _block_mask's rule, one position pair at a time
            seen, own = segments[row, key], segments[row, query]
            return ((key <= query) & ((seen == 0) | (seen == own)) & (own >= 0)) | (query == key)

        rows, width = segments.shape
        return create_block_mask(allowed, rows, None, width, width, device=device)


def shared_prompts(exp: Experience, index: list[int] | None = None) -> list[list[int]]:
    """The samples of `exp` (those in `index`, by default all) that one packed row holds: same group, same prompt
    tokens; in order of first appearance."""
    prompt_lengths = filled(exp.prompt_lengths, "prompt_lengths").tolist()
    group_ids = exp.group_ids.tolist()
    rows: dict[tuple[int, bytes], list[int]] = {}
    for sample in range(len(exp)) if index is None else index:
        prompt = exp.input_ids[sample, : prompt_lengths[sample]].cpu().numpy().tobytes()  # its tokens, as bytes
        rows.setdefault((group_ids[sample], prompt), []).append(sample)
    return list(rows.values())


def pack_groups(exp: Experience, pad_id: int) -> PackedGroups:
    """One packed row per group of `exp` and prompt (the members present in it; a group may be split across parts,
    and a sample whose prompt differs from the others' gets a row of its own)."""
    if exp.prompt_lengths is None:
        raise ValueError("group packing needs the prompt length of every sample (Experience.prompt_lengths)")
    lengths = exp.attention_mask.sum(dim=1).tolist()
    prompt_lengths = exp.prompt_lengths.tolist()
    rows = [_pack_group(exp.input_ids, samples, prompt_lengths[samples[0]], lengths) for samples in shared_prompts(exp)]
    width = max(len(tokens) for tokens, *_ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    segments = torch.full((len(rows), width), -1, dtype=torch.long)  # -1 padding, 0 prompt, i response i
    index: list[tuple[int, int, int, int]] = []
    for r, (tokens, positions, segment, predicted) in enumerate(rows):
        input_ids[r, : len(tokens)] = torch.tensor(tokens)
        position_ids[r, : len(tokens)] = torch.tensor(positions)
        segments[r, : len(tokens)] = torch.tensor(segment)
        index += [(sample, column, r, position) for sample, column, position in predicted]
    sample, column, row, position = torch.tensor(index, dtype=torch.long).reshape(-1, 4).unbind(1)
    return PackedGroups(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=_block_mask(segments),
        segments=segments,
        sample=sample,
        column=column,
        row=row,
        position=position,
        shape=(len(exp), exp.input_ids.shape[1] - 1),
        tokens=sum(len(t) for t, *_ in rows),
    )


def _pack_group(input_ids: torch.Tensor, samples: list[int], prompt_length: int, lengths: list[int]):
    """(tokens, position ids, segment ids, [(sample, target column, predictor position)]) of one row: `samples`
    share their first `prompt_length` tokens (`shared_prompts`)."""
    prompt = input_ids[samples[0], :prompt_length]
    tokens, positions = prompt.tolist(), list(range(prompt_length))
    segment, predicted = [0] * prompt_length, []
    for number, sample in enumerate(samples, start=1):
        response = input_ids[sample, prompt_length : lengths[sample]].tolist()
        start = len(tokens)
        for j in range(len(response)):  # token j is predicted from the prompt's last position, or token j-1
            predicted.append((sample, prompt_length - 1 + j, prompt_length - 1 if j == 0 else start + j - 1))
        tokens += response
        positions += range(prompt_length, prompt_length + len(response))
        segment += [number] * len(response)
    return tokens, positions, segment, predicted


def _block_mask(segments: torch.Tensor) -> torch.Tensor:
    """[R, 1, L, L] bool mask: causal, and a query sees the prompt (segment 0) and its own segment;
    padding sees only itself (a query with nothing to attend to would give NaN)."""
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    allowed = causal & ((key == 0) | (key == query)) & (query >= 0)
    allowed |= torch.eye(width, dtype=torch.bool)
    return allowed[:, None]


MIN_SAVING = 0.10  # `train.packing=auto` packs when that computes at least this share fewer positions


def packing_pays(packed: float, padded: float) -> bool:
    """The `auto` rule, shared by the learner and the planner."""
    return packed <= (1 - MIN_SAVING) * padded


def padded_positions(exp: Experience) -> int:
    """Positions a right-padded forward over `exp` computes: rows x the longest sequence."""
    return len(exp) * int(exp.attention_mask.sum(dim=1).max())


def packed_positions(exp: Experience) -> int:
    """Positions the packed forward would compute: rows x the longest packed row (without building it)."""
    widths = packed_widths(exp, shared_prompts(exp))
    return len(widths) * max(widths)


def packed_widths(exp: Experience, rows: list[list[int]]) -> list[int]:
    """The positions of each packed row of `rows` (`shared_prompts`): its prompt once, then every response."""
    lengths = exp.attention_mask.sum(dim=1).tolist()
    prompts = filled(exp.prompt_lengths, "prompt_lengths").tolist()
    return [prompts[samples[0]] + sum(lengths[i] - prompts[i] for i in samples) for samples in rows]
