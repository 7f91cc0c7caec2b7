"""Per-token KL estimators of KL(policy || reference) from sampled tokens' log-probs. [B, T] -> [B, T]."""

from __future__ import annotations

import torch


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance unbiased estimator: exp(r) - r - 1 with r = ref - policy (always >= 0)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS = {"k3": k3}
