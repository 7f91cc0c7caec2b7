"""The single-process policy learner: log-probs, the optional reference, and the PPO-style update.

Owns the trainable model, its optimizer and schedule, and the frozen reference (loaded only when
`algorithm.kl.coef > 0`). The update runs `epochs` passes of shuffled mini-batches; each mini-batch is one
optimizer step, accumulated over micro-batches whose losses are divided by the mini-batch's token count,
so the micro-batch size changes neither the loss nor the gradients. The separate old-log-prob pass runs
only when the policy moves before the last mini-batch is seen (several mini-batches or epochs); otherwise
the current log-probs, detached, are the old ones and the ratio starts at exactly 1.

With `model.lora` the model is the base wrapped by peft: only the adapter trains (the optimizer holds
nothing else), the reference is the same model with its adapter disabled (no second copy), and
`named_weights` yields what `sync.lora` sends: the adapter's tensors or the merged full weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from relayrl.data.vision import vision_token_ids
from relayrl.learner import malloc
from relayrl.learner.activation_checkpointing import checkpointing_on, enable_activation_checkpointing
from relayrl.learner.batching import MicroBatcher, packs_groups
from relayrl.learner.compile import compile_decoder_layers
from relayrl.learner.layout import ForwardLayout, Sampled
from relayrl.learner.objective import Objective
from relayrl.learner.optim import build_optimizer, build_scheduler
from relayrl.learner.result import UpdateResult
from relayrl.models import lora
from relayrl.models.adapter_sync import lora_sync_mode
from relayrl.models.loading import load_causal_lm, set_attention
from relayrl.models.vision import freeze_vision
from relayrl.types import filled

if TYPE_CHECKING:
    from relayrl.learner.result import MismatchByVersion
    from relayrl.learner.settings import LearnerSettings
    from relayrl.types import Experience


class PolicyLearner:
    def __init__(self, settings: LearnerSettings, load=load_causal_lm):
        """`load(path, device)` builds the policy and the reference: `load_causal_lm`, or on sharded learner ranks
        other than 0 `sharded_init.empty_causal_lm` (meta device, filled from rank 0 once sharded)."""
        self.settings = settings
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        use_bf16 = self.device == "cuda" and settings.model.dtype in ("auto", "bfloat16")
        # fp32 master weights always; on GPU the forward runs under bf16 autocast
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()
        torch.manual_seed(settings.train.seed)
        # eval mode throughout: dropout would make the on-policy ratio differ from 1 and the log-probs
        # of the old/reference passes differ from the update's; gradients flow the same
        self.model = load(settings.model.path, self.device).eval()
        set_attention(self.model, settings.model.attention, self.device)
        # a vision-language model's frozen tower: no gradients, no optimizer state, left out of pushes
        self.frozen = freeze_vision(self.model) if settings.model.freeze_vision else set()
        if settings.model.lora is not None:
            self.model = lora.add_adapter(self.model, settings.model.lora).eval()
        self.model.config.use_cache = False
        # the HF model the forward passes run (with LoRA: peft's layers inside it, switched by disable_adapter)
        self.network = self.model.get_base_model() if settings.model.lora is not None else self.model
        if checkpointing_on(settings.learner, self.device):  # before any FSDP2 wrap (sharded.py shards the built model)
            enable_activation_checkpointing(self.network)
        if settings.learner.compile:
            compile_decoder_layers(self.network)
        malloc.apply(settings.learner, self.device)  # learner.return_freed_memory
        # None (full fine-tuning), "adapter" or "merged"
        self.sync_mode = lora_sync_mode(settings.model.lora, settings.lora_sync, settings.rollout.engine)
        self.use_reference = settings.algorithm.kl.coef > 0
        self.reference = None  # a frozen copy for full fine-tuning; with LoRA the base is the reference
        if self.use_reference and settings.model.lora is None:
            self.reference = load(settings.model.path, self.device).eval().requires_grad_(False)
            set_attention(self.reference, settings.model.attention, self.device)
            if use_bf16:  # frozen, and its passes run in bf16 anyway: half the memory (sharded ranks shard it
                self.reference.to(torch.bfloat16)  # so: bf16 shards, FSDP2's bf16 all-gathers cast nothing)
        rollout = settings.rollout
        self.objective = Objective(settings.algorithm, rollout.max_tokens, use_reference=self.use_reference)
        train = settings.train
        self.updates_per_step = settings.updates_per_step
        self.optimizer = build_optimizer(self.model, train.lr, train.weight_decay, train.betas)
        self.scheduler = build_scheduler(
            self.optimizer,
            train.steps * self.updates_per_step,
            train.warmup_steps,
            train.lr_schedule,
            train.min_lr_ratio,
        )
        # the learner's pre-update log-probs are needed as such when the policy moves before the last
        # mini-batch, when the KL enters the rewards, or when they are compared with the behaviour's
        algo = settings.algorithm
        # TIS weights of a single on-policy mini-batch come from the update's own forward (Objective.correct_in_pass)
        self.correct_in_pass = self.updates_per_step == 1 and algo.correction.mode.startswith("tis")
        self.needs_old_logprobs = (
            self.updates_per_step > 1
            or (algo.correction.mode != "none" and not self.correct_in_pass)
            or (self.use_reference and algo.kl.placement == "reward")
            or settings.teacher is not None  # the distillation signal is teacher - old, taken before the update
        )
        self.generator = torch.Generator().manual_seed(train.seed)
        self.layout = ForwardLayout(
            train.packing,
            train.logits_chunk,
            Sampled(rollout.temperature, rollout.top_k, rollout.top_p, vision_token_ids(settings.model.path)),
            self.model.config,
            self.device,
        )
        self.micro = MicroBatcher(train.micro_batch, train.micro_batch_tokens, packs_groups(self.layout))

    # ------------------------------------------------------------------ log-probs
    def _token_stats(
        self, model, exp: Experience, entropy_grad: bool = False, layout: ForwardLayout | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, entropies) of the response tokens [B, T-1] under the distribution the engine sampled from:
        temperature-scaled and, with top-k/top-p, truncated and renormalised the way vLLM does (fp32).
        `layout`: another model's forward layout (a teacher's), the policy's by default."""
        with self.autocast:
            return (layout or self.layout).token_stats(model, exp, entropy_grad)

    @torch.no_grad()
    def logprobs(self, exp: Experience, model=None, layout: ForwardLayout | None = None) -> torch.Tensor:
        """Log-probs of the response tokens under `model` (the policy by default), micro-batched: [B, T-1]
        (other columns hold no meaningful value: a packed forward does not predict prompt tokens). The one
        no-grad pass of the policy, the reference and a teacher (`layout`: its forward layout)."""
        model = model or self.network
        out = torch.zeros_like(exp.loss_mask)
        for index in self.micro.split(torch.arange(len(exp)), exp, count=False):
            logp, _ = self._token_stats(model, exp.select(index), layout=layout)
            out[index, : logp.shape[1]] = logp.float().cpu()
        return out

    def fill_logprobs(self, exp: Experience) -> None:
        """The passes that must see the pre-update policy: old log-probs (if needed) and the reference."""
        if self.needs_old_logprobs:
            exp.old_logprobs = self.logprobs(exp)
        if self.use_reference:
            exp.ref_logprobs = self.reference_logprobs(exp)

    def reference_logprobs(self, exp: Experience) -> torch.Tensor:
        """The reference policy's log-probs: the frozen copy, or with LoRA the base with its adapter disabled."""
        if self.reference is not None:
            return self.logprobs(exp, self.reference)
        with self.model.disable_adapter():
            return self.logprobs(exp)

    # ------------------------------------------------------------------ update
    def update(self, exp: Experience, sample_rows: int = 0) -> UpdateResult:
        """One step's optimizer updates; `sample_rows`: the pre-update log-probs of that many first rows come back
        in the result (`sample_logprobs`), for the samples the step logs."""
        train = self.settings.train
        totals = _Totals()
        lr = self.scheduler.get_last_lr()[0]  # the rate this step's first update uses
        self.layout.take_counts()  # count the update's passes only
        # on the device while the update fills it: one copy to the host a step, not one a micro-batch
        pre_update = exp.old_logprobs
        if pre_update is None:
            pre_update = torch.zeros_like(exp.loss_mask, device=self.device)
        correction = {} if self.correct_in_pass else self.objective.correct(exp)
        for _ in range(train.epochs):
            order = torch.randperm(len(exp), generator=self.generator)
            for mini in self._mini_batches(order):
                totals.n_stale.append(len(totals.grad_norm))  # optimizer steps since the samples' policy
                normaliser = self.objective.normaliser(exp.loss_mask[mini])
                for micro in self.micro.split(mini, exp):
                    logp = self._accumulate(exp.select(micro), normaliser, totals)
                    if exp.old_logprobs is None:  # single on-policy step: these are the pre-update log-probs
                        pre_update[micro, : logp.shape[1]] = logp
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.grad_clip)
                totals.grad_norm.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP2: reduced
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        stats = totals.summary(exp.loss_mask.sum() * train.epochs)
        pre_update = pre_update.cpu()
        mismatch = mismatch_by_version(pre_update, exp.behaviour_logprobs, exp.loss_mask, exp.versions)
        stats.update(correction or totals.correction_metrics())
        if self.use_reference:
            stats.update(self._kl_step(exp, stats))
        stats["lr"] = lr
        counts = self.layout.take_counts()
        counts["learner/positions"] /= train.epochs  # per pass over the batch
        stats.update(counts)
        stats.update(self.micro.take_counts())
        return UpdateResult(stats, mismatch, pre_update[:sample_rows].tolist() if sample_rows else None)

    def _kl_step(self, exp: Experience, stats: dict[str, float]) -> dict[str, float]:
        """Measure the KL to the reference on this batch (pre-update policy) and adapt the coefficient."""
        kl = stats.get("actor/kl")
        if kl is None:  # KL in the reward: measure it from the pre-update log-probs
            mask = exp.loss_mask.bool()
            old, ref = filled(exp.old_logprobs, "old_logprobs"), filled(exp.ref_logprobs, "ref_logprobs")
            kl = float((old - ref)[mask].mean()) if mask.any() else 0.0
            stats["actor/kl"] = kl
        coef = self.objective.kl_controller.coef
        self.objective.kl_controller.update(kl, len(exp))
        return {"actor/kl_coef": coef}

    def _accumulate(self, part: Experience, normaliser: float, totals: _Totals) -> torch.Tensor:
        """Forward + backward of one micro-batch; returns its detached log-probs [b, t], on the device. Nothing here
        waits for the device: its metrics stay device tensors until the step's summary."""
        logp, entropy = self._token_stats(self.network, part, entropy_grad=self.objective.entropy_in_loss)
        old = logp.detach() if part.old_logprobs is None else part.old_logprobs.to(self.device)
        if self.correct_in_pass:
            totals.add_correction(self.objective.correct_in_pass(part, logp))
        loss, sums = self.objective.loss(logp, entropy, old, part, normaliser)
        loss.backward()
        with torch.no_grad():
            mask = part.loss_mask.to(self.device)
            sums["entropy"] = (entropy.detach() * mask).sum()
            totals.add_max("ratio_max", sums.pop("ratio_max"))
            for name, value in sums.items():
                totals.add(name, value)
        return logp.detach()

    def _mini_batches(self, order: torch.Tensor) -> list[torch.Tensor]:
        """The rows of each optimizer step: `mini_batch` rows each, as many steps as the schedule counts per epoch
        (`updates_per_step / epochs`). A step whose forks (relayrl/sources/trajectory.py) or ranks' padding rows
        (relayrl/learner/process_group.py) add rows keeps that count, its rows spread over the same steps: more
        steps would run the learning-rate schedule out early and train later mini-batches off-policy. The rule
        reads only the row count, which every rank shares, so ranks take the same number of steps."""
        steps = max(1, self.updates_per_step // self.settings.train.epochs)
        if len(order) > steps * self.settings.mini_batch:
            return list(order.tensor_split(steps))
        return list(order.split(self.settings.mini_batch))

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a push sends the engine: checkpoint-named parameters (tied weights appear once); with LoRA the
        adapter's tensors (`sync.lora=adapter`) or the merged weights under the base's names (`merged`)."""
        if self.sync_mode == "adapter":
            return lora.adapter_tensors(self.model)
        if self.sync_mode == "merged":
            return lora.merged_tensors(self.model)
        return ((name, param.detach()) for name, param in self.model.named_parameters() if name not in self.frozen)

    def save(self, out_dir: str | Path, tokenizer=None) -> None:
        """save_pretrained into `out_dir`; with LoRA the merged model there (what `relayrl eval --model` and
        vLLM load as they are) and the adapter beside it in `out_dir/adapter`."""
        if self.settings.model.lora is None:
            self.model.save_pretrained(str(out_dir))
        else:
            lora.save_merged(self.model, out_dir)
            self.model.save_pretrained(str(Path(out_dir) / lora.ADAPTER_DIR))
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)

    def load_model(self, model_dir: str | Path) -> None:
        """Load a checkpoint's `model/`: full weights, or with LoRA the adapter alone."""
        if self.settings.model.lora is not None:
            lora.load_adapter(self.model, model_dir)
            return
        self.model.load_state_dict(load_causal_lm(model_dir, "cpu").state_dict())


class _Totals:
    """Token-weighted sums across micro-batches, turned into per-token means once per step. The sums stay where the
    update computed them (device tensors, float64) and come to the host together in `summary`: on a GPU, one
    synchronisation a step instead of one per metric per micro-batch."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.maxima: dict[str, torch.Tensor] = {}  # ratio_max, and in-pass TIS's ratio_max
        self.grad_norm: list[torch.Tensor] = []  # per optimizer step
        self.n_stale: list[int] = []  # per mini-batch
        self.correction: dict[str, torch.Tensor] = {}  # in-pass TIS: token-weighted sums
        self.tokens = 1.0  # response tokens of the step, set by `summary`
        self.host: dict[str, Any] = {}  # the accumulated values, on the host: set by `summary`

    def add(self, name: str, value: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> None:
        sums = self.sums if into is None else into
        value = value.detach().double()
        sums[name] = sums[name] + value if name in sums else value

    def add_max(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self.maxima[name] = torch.maximum(self.maxima[name], value) if name in self.maxima else value

    def add_correction(self, sums: dict[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            if name == "ratio_max":
                self.add_max("correction_ratio_max", value)
            else:
                self.add(name, value, into=self.correction)

    def summary(self, trained: torch.Tensor) -> dict[str, Any]:
        values = self.host = self._to_host()
        sums, grad_norm = values["sums"], values["grad_norm"]
        tokens = self.tokens = max(float(trained), 1.0)
        stats = {
            "loss/policy": sums["loss_policy"] / len(grad_norm),  # mean over optimizer steps
            "loss/total": sums["loss_total"] / len(grad_norm),
            "actor/dual_clip_frac": sums["dual_clip_tokens"] / tokens,
            "stale/mean": sum(self.n_stale) / len(self.n_stale),  # optimizer steps, per mini-batch
            "stale/max": float(max(self.n_stale)),
            "actor/entropy": sums["entropy"] / tokens,
            "actor/clip_frac": sums["clip_tokens"] / tokens,
            "actor/ratio_mean": sums["ratio_sum"] / tokens,
            "actor/ratio_max": values["maxima"].get("ratio_max", 0.0),
            "actor/grad_norm": sum(grad_norm) / len(grad_norm),
        }
        if "kl" in sums:
            stats["actor/kl"] = sums["kl"] / tokens
        return stats

    def correction_metrics(self) -> dict[str, float]:
        """In-pass TIS's metrics, from the values `summary` brought to the host."""
        correction = self.host["correction"]
        if not correction:
            return {}
        return {
            "correction/ratio_mean": correction["ratio_sum"] / self.tokens,
            "correction/ratio_max": self.host["maxima"]["correction_ratio_max"],
            "correction/truncated_frac": correction["hit_tokens"] / self.tokens,
        }

    def _to_host(self) -> dict[str, Any]:
        """Every accumulated tensor in one device-to-host copy."""
        parts = {"sums": self.sums, "maxima": self.maxima, "correction": self.correction}
        flat = [v for part in parts.values() for v in part.values()] + [n.double() for n in self.grad_norm]
        host = torch.stack([v.reshape(()).to(flat[0].device) for v in flat]).tolist() if flat else []
        out: dict[str, Any] = {}
        at = 0
        for key, part in parts.items():
            out[key] = dict(zip(part, host[at : at + len(part)]))
            at += len(part)
        out["grad_norm"] = host[at:]
        return out


def mismatch_by_version(
    learner_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, versions: torch.Tensor
) -> MismatchByVersion:
    """|learner - behaviour| log-prob of the trained tokens (pre-update learner), per policy version that sampled
    them: {version: (sum, max, tokens)}; all [B, T-1]. The learner does not know which version it holds, so the
    controller splits these by lag (`mismatch_metrics`)."""
    trained = mask.bool()
    gap, version = (learner_logprobs - behaviour_logprobs).abs()[trained], versions[trained]
    out = {}
    for v in version.unique().tolist():
        part = gap[version == v]
        out[int(v)] = (float(part.sum()), float(part.max()), part.numel())
    return out


def mismatch_metrics(by_version: MismatchByVersion, trained_version: int) -> dict[str, float]:
    """`mismatch/logprob_abs_{mean,max}`: over tokens sampled by the policy being trained (no version lag), the
    engine's and learner's numerics alone. `drift/logprob_abs_{mean,max}`: over lagged tokens, where the policy
    has also moved since sampling (off-policy schedules). `drift/token_frac`: the lagged share of trained
    tokens. A side with no tokens is left out rather than reported as 0."""
    fresh = [part for v, part in by_version.items() if v >= trained_version]
    lagged = [part for v, part in by_version.items() if v < trained_version]
    out = {}
    for prefix, parts in (("mismatch", fresh), ("drift", lagged)):
        tokens = sum(n for _, _, n in parts)
        if tokens:
            out[f"{prefix}/logprob_abs_mean"] = sum(s for s, _, _ in parts) / tokens
            out[f"{prefix}/logprob_abs_max"] = max(m for _, m, _ in parts)
    total = sum(n for _, _, n in by_version.values())
    if total:
        out["drift/token_frac"] = sum(n for _, _, n in lagged) / total
    return out
