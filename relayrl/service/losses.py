"""The SDK's built-in losses over one datum's per-token log-probs, as the Tinker docs define them: sums over
tokens (not means), the gradient of the summed `loss:sum` metric.

- `cross_entropy`: -(weights * logp).sum()                         inputs: target_tokens, weights
- `importance_sampling`: -(exp(logp - q) * advantages).sum()       inputs: target_tokens, logprobs (q), advantages
- `ppo`: -min(r * A, clip(r, low, high) * A).sum(), r = exp(logp - q); `loss_fn_config` clip_low_threshold (0.8)
  and clip_high_threshold (1.2)
Every datum's inputs are checked first (the key present, one value per input token), so a bad request fails
before any gradient is added.
"""

from __future__ import annotations

import numpy as np
import torch

from relayrl.service.errors import UserError

NEEDS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}


def check_inputs(loss_fn: str, index: int, tokens: list[int], inputs: dict[str, np.ndarray], vocab: int) -> None:
    if loss_fn not in NEEDS:
        known = ", ".join(NEEDS)
        raise UserError(f"loss_fn={loss_fn!r}: not served here (served: {known})")
    if not tokens:
        raise UserError(f"data[{index}].model_input: no tokens")
    for key in NEEDS[loss_fn]:
        if key not in inputs:
            raise UserError(f"data[{index}].loss_fn_inputs: {loss_fn} needs {key!r} (given: {sorted(inputs)})")
        if inputs[key].size != len(tokens):
            raise UserError(
                f"data[{index}].loss_fn_inputs[{key!r}]: {inputs[key].size} values for {len(tokens)} input tokens"
            )
    for name, ids in (
        ("model_input", np.asarray(tokens)),
        ("loss_fn_inputs['target_tokens']", inputs["target_tokens"]),
    ):
        bad = ids[(ids < 0) | (ids >= vocab)]
        if bad.size:
            raise UserError(f"data[{index}].{name}: token {int(bad[0])} is outside the vocabulary (size {vocab})")


def datum_loss(loss_fn: str, logp: torch.Tensor, inputs: dict[str, np.ndarray], config: dict) -> torch.Tensor:
    """The summed loss of one datum from its target tokens' log-probs `logp` [N] (with grad)."""

    def tensor(key: str) -> torch.Tensor:
        return torch.from_numpy(inputs[key]).float().to(logp.device)

    if loss_fn == "cross_entropy":
        return -(logp * tensor("weights")).sum()
    ratio = torch.exp(logp - tensor("logprobs"))
    advantages = tensor("advantages")
    if loss_fn == "importance_sampling":
        return -(ratio * advantages).sum()
    low, high = float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()
