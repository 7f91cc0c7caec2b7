"""The SDK's built-in losses over one datum's per-token log-probs, as Thinking Machines' Tinker docs define them
(tinker-docs.thinkingmachines.ai/tinker/losses/<name>): sums over tokens (not means), the gradient of the summed
`loss:sum` metric. `logp` are the target tokens' log-probs under the trained weights, `q` the sampler's
(`logprobs`), `A` the `advantages`, r = exp(logp - q), sg a stop-gradient.

- `cross_entropy`: -(weights * logp).sum()                              inputs: target_tokens, weights
- `importance_sampling`: -(r * A).sum()                                 inputs: target_tokens, logprobs, advantages
- `ppo`: -min(r * A, clip(r, low, high) * A).sum()                      same inputs
- `cispo` (losses/cispo): -(sg(clip(r, low, high)) * logp * A).sum()    same inputs
- `dro` (losses/dro): -(logp * A - beta/2 * (logp - q)**2).sum()        same inputs; `beta` in loss_fn_config
- `gspo` (losses/gspo, the GSPO-token form): the ppo surrogate on s_t = sg(s) * exp(logp - sg(logp)), where
  log s is the mean of (logp - q) over the tokens `sequence_ratio_mask` marks; inputs: those and the mask

`ppo`, `cispo` and `gspo` read `clip_low_threshold` / `clip_high_threshold` from `loss_fn_config` (0.8 / 1.2 when
absent, as the docs' examples set them; the hosted defaults are not published). `dro`'s `beta` has no published
default, so a request must name it. `ppo` and `gspo` are relayrl's own `ppo_clip_loss`
(relayrl/algorithms/losses.py) summed over the datum; gspo hands it the token-form sequence log-ratio.
`stable_reinforce` is not served: its objective is not public. What SDK 0.38.0 and cookbook 0.6.1 say of it is
its inputs and one setting, never its formula: sequences sampled with `record_stability_info` (the server records
"stability information" per sequence, types/sample_request.py), each datum naming them by provenance spans
(`Datum.with_provenance`, `loss_fn_input_spans`; rl/train.py's `_check_provenance`, rl_loop.py's
`with_sampled_provenance`), and a `kl_coeff` constructor argument (`loss_fn_config_v2`'s example,
{"kl_coeff": 0.01}); the cookbook only adds that it "stays stable on off-policy data".
Every datum's inputs are checked first (the key present, one value per input token), so a bad request fails
before any gradient is added.
"""

from __future__ import annotations

import numpy as np
import torch

from relayrl.algorithms.losses import ppo_clip_loss
from relayrl.service.errors import UserError

RL_INPUTS = ("target_tokens", "logprobs", "advantages")
NEEDS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": RL_INPUTS,
    "ppo": RL_INPUTS,
    "cispo": RL_INPUTS,
    "dro": RL_INPUTS,
    "gspo": (*RL_INPUTS, "sequence_ratio_mask"),
}
NOT_PUBLIC = {
    "stable_reinforce": "its objective is not public (the SDK gives only its inputs: recorded stability info, "
    "provenance spans, kl_coeff)"
}


def check_inputs(loss_fn: str, index: int, tokens: list[int], inputs: dict[str, np.ndarray], vocab: int) -> None:
    if loss_fn not in NEEDS:
        known = ", ".join(NEEDS)
        why = f"; {NOT_PUBLIC[loss_fn]}" if loss_fn in NOT_PUBLIC else ""
        raise UserError(f"loss_fn={loss_fn!r}: not served here{why} (served: {known})")
    if not tokens:
        raise UserError(f"data[{index}].model_input: no tokens")
    for key in NEEDS[loss_fn]:
        if key not in inputs:
            raise UserError(f"data[{index}].loss_fn_inputs: {loss_fn} needs {key!r} (given: {sorted(inputs)})")
        if inputs[key].size != len(tokens):
            raise UserError(
                f"data[{index}].loss_fn_inputs[{key!r}]: {inputs[key].size} values for {len(tokens)} input tokens"
            )
    if loss_fn == "gspo" and not (inputs["sequence_ratio_mask"] != 0).any():
        raise UserError(f"data[{index}].loss_fn_inputs['sequence_ratio_mask']: marks no token")
    for name, ids in (
        ("model_input", np.asarray(tokens)),
        ("loss_fn_inputs['target_tokens']", inputs["target_tokens"]),
    ):
        bad = ids[(ids < 0) | (ids >= vocab)]
        if bad.size:
            raise UserError(f"data[{index}].{name}: token {int(bad[0])} is outside the vocabulary (size {vocab})")


def check_config(loss_fn: str, config: dict) -> None:
    """The request's `loss_fn_config`: numbers where a loss reads them, `beta` present for dro."""
    if loss_fn == "dro" and "beta" not in config:
        raise UserError("loss_fn_config: dro needs 'beta' (the hosted service's default is not published)")
    for key in ("clip_low_threshold", "clip_high_threshold", "beta"):
        if key in config and not isinstance(config[key], float):
            raise UserError(f"loss_fn_config[{key!r}]={config[key]!r}: must be a number")
    low, high = clip_thresholds(config)
    if loss_fn in ("ppo", "cispo", "gspo") and not 0.0 < low <= 1.0 <= high:
        raise UserError(f"loss_fn_config: needs 0 < clip_low_threshold <= 1 <= clip_high_threshold, got {low}, {high}")


def clip_thresholds(config: dict) -> tuple[float, float]:
    return float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))


def datum_loss(loss_fn: str, logp: torch.Tensor, inputs: dict[str, np.ndarray], config: dict) -> torch.Tensor:
    """The summed loss of one datum from its target tokens' log-probs `logp` [N] (with grad)."""

    def tensor(key: str) -> torch.Tensor:
        return torch.from_numpy(inputs[key]).float().to(logp.device)

    if loss_fn == "cross_entropy":
        return -(logp * tensor("weights")).sum()
    q, advantages = tensor("logprobs"), tensor("advantages")
    low, high = clip_thresholds(config)
    if loss_fn == "importance_sampling":
        return -(torch.exp(logp - q) * advantages).sum()
    if loss_fn == "cispo":
        return -(torch.exp(logp - q).clamp(low, high).detach() * logp * advantages).sum()
    if loss_fn == "dro":
        return -(logp * advantages - 0.5 * float(config["beta"]) * (logp - q) ** 2).sum()
    if loss_fn == "gspo":
        in_ratio = tensor("sequence_ratio_mask") != 0
        sequence_log_ratio = (logp.detach() - q)[in_ratio].mean()
        logp, q = sequence_log_ratio + logp - logp.detach(), torch.zeros_like(q)  # r = exp(logp - q) is s_t
    return clipped_sum(logp, q, advantages, low, high)


def clipped_sum(logp: torch.Tensor, q: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """-sum(min(r A, clip(r, low, high) A)): relayrl's ppo_clip_loss over one row, summed (normaliser 1)."""
    row = (logp[None], q[None], advantages[None], torch.ones_like(logp)[None])
    loss, _ = ppo_clip_loss(*row, agg="token_mean", normaliser=1.0, eps_low=1.0 - low, eps_high=high - 1.0)
    return loss
