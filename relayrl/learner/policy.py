"""The single-process policy learner: log-probs, the optional reference, and the PPO-style update.

Owns the trainable model, its optimizer and schedule, and the frozen reference (loaded only when
`algorithm.kl.coef > 0`). The update runs `epochs` passes of shuffled mini-batches; each mini-batch is one
optimizer step, accumulated over micro-batches whose losses are divided by the mini-batch's token count,
so the micro-batch size changes neither the loss nor the gradients. The separate old-log-prob pass runs
only when the policy moves before the last mini-batch is seen (several mini-batches or epochs); otherwise
the current log-probs, detached, are the old ones and the ratio starts at exactly 1.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Iterator

import torch

from relayrl.algorithms.losses import entropy_from_logits, kl_penalty, ppo_clip_loss
from relayrl.config import Config
from relayrl.learner.batching import token_logprobs
from relayrl.learner.optim import build_optimizer, build_scheduler
from relayrl.models.loading import load_causal_lm
from relayrl.types import Experience


class PolicyLearner:
    def __init__(self, config: Config):
        self.config = config
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        use_bf16 = self.device == "cuda" and config.model.dtype in ("auto", "bfloat16")
        # fp32 master weights always; on GPU the forward runs under bf16 autocast
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()
        torch.manual_seed(config.train.seed)
        # eval mode throughout: dropout would make the on-policy ratio differ from 1 and the log-probs
        # of the old/reference passes differ from the update's; gradients flow the same
        self.model = load_causal_lm(config.model.path, self.device).eval()
        self.model.config.use_cache = False
        self.reference = None
        if config.algorithm.kl.coef > 0:
            self.reference = load_causal_lm(config.model.path, self.device).eval().requires_grad_(False)
        self.temperature = config.rollout.temperature
        train = config.train
        self.updates_per_step = (config.rollout_batch // config.mini_batch) * train.epochs
        self.optimizer = build_optimizer(self.model, train.lr, train.weight_decay, train.betas)
        self.scheduler = build_scheduler(self.optimizer, train.steps * self.updates_per_step,
                                         train.warmup_steps, train.lr_schedule, train.min_lr_ratio)
        self.needs_old_logprobs = self.updates_per_step > 1
        self.generator = torch.Generator().manual_seed(train.seed)

    # ------------------------------------------------------------------ log-probs
    def _forward(self, model, exp: Experience) -> torch.Tensor:
        """Logits for target positions, temperature-scaled like the sampler's: [B, T-1, V] (fp32)."""
        input_ids = exp.input_ids.to(self.device)
        with self.autocast:
            logits = model(input_ids=input_ids, attention_mask=exp.attention_mask.to(self.device)).logits
        return logits[:, :-1].float() / self.temperature

    @torch.no_grad()
    def logprobs(self, exp: Experience, model=None) -> torch.Tensor:
        """Log-probs of every target token under `model` (the policy by default), micro-batched: [B, T-1]."""
        model = model or self.model
        out = torch.zeros_like(exp.loss_mask)
        for index in self._chunks(torch.arange(len(exp)), self.config.train.micro_batch):
            part = exp.select(index)
            logp = token_logprobs(self._forward(model, part), part.input_ids[:, 1:].to(self.device))
            out[index, : logp.shape[1]] = logp.cpu()
        return out

    def fill_logprobs(self, exp: Experience) -> None:
        """The passes that must see the pre-update policy: old log-probs (if needed) and the reference."""
        if self.needs_old_logprobs:
            exp.old_logprobs = self.logprobs(exp)
        if self.reference is not None:
            exp.ref_logprobs = self.logprobs(exp, self.reference)

    # ------------------------------------------------------------------ update
    def update(self, exp: Experience) -> dict[str, float]:
        train = self.config.train
        totals = _Totals()
        lr = self.scheduler.get_last_lr()[0]  # the rate this step's first update uses
        pre_update = torch.zeros_like(exp.loss_mask) if exp.old_logprobs is None else exp.old_logprobs
        for _ in range(train.epochs):
            order = torch.randperm(len(exp), generator=self.generator)
            for mini in self._chunks(order, self.config.mini_batch):
                totals.n_stale.append(len(totals.grad_norm))  # optimizer steps since the samples' policy
                tokens = float(exp.loss_mask[mini].sum())
                for micro in self._chunks(mini, train.micro_batch):
                    logp = self._accumulate(exp.select(micro), tokens, totals)
                    if exp.old_logprobs is None:  # single on-policy step: these are the pre-update log-probs
                        pre_update[micro, : logp.shape[1]] = logp
                totals.grad_norm.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.grad_clip)))
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        stats = totals.summary(exp.loss_mask.sum() * train.epochs)
        stats.update(mismatch_metrics(pre_update, exp.behaviour_logprobs, exp.loss_mask))
        stats["lr"] = lr
        return stats

    def _accumulate(self, part: Experience, mini_tokens: float, totals: "_Totals") -> torch.Tensor:
        """Forward + backward of one micro-batch; returns its detached log-probs [b, t]."""
        algo = self.config.algorithm
        logits = self._forward(self.model, part)
        logp = token_logprobs(logits, part.input_ids[:, 1:].to(self.device))
        mask = part.loss_mask.to(self.device)
        old = logp.detach() if part.old_logprobs is None else part.old_logprobs.to(self.device)
        policy_loss, metrics = ppo_clip_loss(logp, old, part.advantages.to(self.device), mask, algo.clip_eps,
                                             algo.loss_agg, normaliser=mini_tokens)
        loss = policy_loss
        if self.reference is not None:
            kl_loss, kl_sum = kl_penalty(logp, part.ref_logprobs.to(self.device), mask, algo.kl.estimator,
                                         algo.loss_agg, normaliser=mini_tokens)
            loss = policy_loss + algo.kl.coef * kl_loss
            totals.add("kl", kl_sum)
        loss.backward()
        with torch.no_grad():
            totals.add("loss_policy", policy_loss.detach() * mini_tokens)
            totals.add("loss_total", loss.detach() * mini_tokens)
            totals.add("entropy", (entropy_from_logits(logits.detach()) * mask).sum())
            totals.add("clip_tokens", metrics["clip_tokens"])
            totals.add("ratio_sum", metrics["ratio_sum"])
            totals.ratio_max = max(totals.ratio_max, float(metrics["ratio_max"]))
        return logp.detach().cpu()

    @staticmethod
    def _chunks(index: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
        return iter(index.split(size))

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Checkpoint-named parameters for the engine (tied weights appear once)."""
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def save(self, out_dir: str | Path, tokenizer=None) -> None:
        self.model.save_pretrained(out_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)


class _Totals:
    """Token-weighted sums across micro-batches, turned into per-token means once per step."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.grad_norm: list[float] = []
        self.n_stale: list[int] = []  # per mini-batch
        self.ratio_max = 0.0

    def add(self, name: str, value: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def summary(self, tokens: torch.Tensor) -> dict[str, float]:
        tokens = max(float(tokens), 1.0)
        stats = {
            "loss/policy": self.sums["loss_policy"] / tokens,
            "loss/total": self.sums["loss_total"] / tokens,
            "stale/mean": sum(self.n_stale) / len(self.n_stale),  # optimizer steps, per mini-batch
            "stale/max": float(max(self.n_stale)),
            "actor/entropy": self.sums["entropy"] / tokens,
            "actor/clip_frac": self.sums["clip_tokens"] / tokens,
            "actor/ratio_mean": self.sums["ratio_sum"] / tokens,
            "actor/ratio_max": self.ratio_max,
            "actor/grad_norm": sum(self.grad_norm) / len(self.grad_norm),
        }
        if "kl" in self.sums:
            stats["actor/kl"] = self.sums["kl"] / tokens
        return stats


def mismatch_metrics(learner_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's behaviour log-probs are from the learner's on the same tokens (pre-update)."""
    diff = (learner_logprobs - behaviour_logprobs).abs()[mask.bool()]
    if diff.numel() == 0:
        return {"mismatch/logprob_abs_mean": 0.0, "mismatch/logprob_abs_max": 0.0}
    return {"mismatch/logprob_abs_mean": float(diff.mean()), "mismatch/logprob_abs_max": float(diff.max())}
