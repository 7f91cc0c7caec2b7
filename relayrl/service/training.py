"""One training client's model: the base loaded from its local directory, with a relayrl LoRA adapter
(relayrl/models/lora.py; B = 0, so it starts equal to the base) or all weights trainable, and its AdamW.

`forward_backward` adds the summed loss's gradient (chunks of one batch accumulate), its data through the model in
padded batches, one forward and one backward each (one per datum made a cookbook RL step of 32 data 7.0-7.7x
`relayrl train`'s, now 3.4-3.8x: benchmarks/service_overhead.py), and, for the mismatch, scores a datum sampled at
a temperature or truncation at those (relayrl/service/mismatch.py); `optim_step` takes the
SDK's Adam parameters per call and clears the gradient; `sampler_weights` is the merged copy a sampler serves;
`save_state`/`load_state` write and read a checkpoint directory atomically (adapter or weights, optimizer,
meta.json).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relayrl.service import losses
from relayrl.service.errors import UserError
from relayrl.service.mismatch import AS_SAMPLED, SampledAt
from relayrl.service.wire import ForwardBackwardCall

LORA_ALPHA = 32  # the hosted service's alpha; the adapter's scale is alpha / rank
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
BATCH_LOGITS = 2**25  # values of fp32 logits one forward_backward batch holds (128 MiB; 200 tokens of a 150k vocab)


@dataclass
class LoraSettings:
    """What relayrl/models/lora.py `add_adapter` reads (the shape of relayrl's `model.lora` section)."""

    rank: int
    alpha: float = LORA_ALPHA
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ATTENTION + MLP


def lora_settings(rank: int, train_attn: bool = True, train_mlp: bool = True) -> LoraSettings:
    if rank < 1:
        raise UserError(f"lora_config.rank={rank}: must be at least 1")
    targets = (ATTENTION if train_attn else ()) + (MLP if train_mlp else ())
    if not targets:
        raise UserError("lora_config: train_attn and train_mlp are both false; nothing would train")
    return LoraSettings(rank=rank, target_modules=targets)


class TrainedModel:
    def __init__(self, model_id: str, base_name: str, base_path: str, lora: LoraSettings | None, seed: int = 0):
        from relayrl.models.loading import load_causal_lm
        from relayrl.models.lora import add_adapter

        self.model_id, self.base_name, self.lora = model_id, base_name, lora
        self.device = "cuda" if torch.cuda.is_available() else "cpu"  # where the HF engine samples too
        model = load_causal_lm(base_path, self.device, key=f"base_model={base_name!r}").eval()
        if lora is not None:
            torch.manual_seed(seed)
            model = add_adapter(model, lora, key="lora_config")
        self.model = model
        self.vocab = int(model.get_input_embeddings().weight.shape[0])
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=1e-4)
        self.steps = 0

    def forward_backward(
        self, call: ForwardBackwardCall, to_score: list[SampledAt | None] | None = None
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum: the target tokens' log-probs (and the loss's gradient added unless `forward_only`), and where
        `to_score` names the settings its sample was drawn at, its log-probs at them too (mismatch.AS_SAMPLED).
        The data go through the model in batches (`batches`), each one forward and one backward."""
        for i, ex in enumerate(call.examples):
            losses.check_inputs(call.loss_fn, i, ex.tokens, ex.inputs, self.vocab)
        losses.check_config(call.loss_fn, call.config)
        scored = to_score or [None] * len(call.examples)
        outputs, total = [], 0.0
        with torch.set_grad_enabled(not call.forward_only):
            for batch in batches([len(ex.tokens) for ex in call.examples], self.vocab):
                examples = [call.examples[i] for i in batch]
                logits = self.batch_logits([ex.tokens for ex in examples])  # [B, T, V]
                batch_loss = torch.zeros((), device=self.device)
                for row, (i, ex) in enumerate(zip(batch, examples)):
                    row_logits, targets = logits[row, : len(ex.tokens)], self.targets(ex.inputs["target_tokens"])
                    logp = torch.log_softmax(row_logits, -1).gather(-1, targets[:, None]).squeeze(-1)
                    batch_loss = batch_loss + losses.datum_loss(call.loss_fn, logp, ex.inputs, call.config)
                    outputs.append({"logprobs": logp.detach().cpu().numpy().astype(np.float32)})
                    if (at := scored[i]) is not None:
                        outputs[-1][AS_SAMPLED] = at.logprobs(row_logits.detach(), targets)
                if not call.forward_only:
                    batch_loss.backward()
                total += float(batch_loss.detach())
        return outputs, {"loss:sum": total}

    def target_logprobs(self, tokens: list[int], targets: np.ndarray) -> torch.Tensor:
        picked = self.targets(targets)
        return torch.log_softmax(self.logits(tokens), -1).gather(-1, picked[:, None]).squeeze(-1)

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """The model's logits [T, V] (fp32) at each of `tokens`."""
        return self.model(input_ids=torch.tensor([tokens], device=self.device)).logits[0].float()

    def batch_logits(self, rows: list[list[int]]) -> torch.Tensor:
        """The model's logits [B, T, V] (fp32) at each of `rows`' tokens, right-padded to the longest: a token
        attends only to those before it, so a row's logits do not depend on its padding."""
        width = max(len(tokens) for tokens in rows)
        padded = [tokens + [0] * (width - len(tokens)) for tokens in rows]
        return self.model(input_ids=torch.tensor(padded, device=self.device)).logits.float()

    def targets(self, targets: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(targets).long().to(self.device)

    def optim_step(self, params) -> dict[str, float]:
        """One AdamW step with the SDK's `AdamParams` (learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm)."""
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, params.grad_clip_norm or float("inf"))
        for group in self.optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": float(norm)}

    @torch.no_grad()
    def sampler_weights(self) -> dict[str, torch.Tensor]:
        """The weights a sampler serves: the base with the adapter merged in (or all weights), copied."""
        from relayrl.models.lora import merged_tensors

        if self.lora is None:
            return {name: p.detach().clone() for name, p in self.model.named_parameters()}
        return {name: t.clone() for name, t in merged_tensors(self.model)}

    def save_state(self, out: Path) -> None:
        """The adapter (or the weights), the optimizer and meta.json, written beside `out` then moved in place."""
        from safetensors.torch import save_file

        from relayrl.models import lora as lora_lib

        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.lora is not None:
            lora_lib.write_adapter_dir(
                tmp, lora_lib.resolved_config(self.model), dict(lora_lib.adapter_tensors(self.model))
            )
        else:
            save_file(
                {n: p.detach().contiguous() for n, p in self.model.named_parameters()}, str(tmp / "model.safetensors")
            )
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        meta = {"base_model": self.base_name, "lora_rank": self.lora.rank if self.lora else None, "steps": self.steps}
        if self.lora is not None:
            meta["target_modules"] = list(self.lora.target_modules)
        (tmp / "meta.json").write_text(json.dumps(meta))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)

    def load_state(self, path: Path, optimizer: bool) -> None:
        from safetensors.torch import load_file

        from relayrl.models import lora as lora_lib

        if self.lora is not None:
            lora_lib.load_adapter(self.model, path)
        else:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in load_file(str(path / "model.safetensors")).items():
                    params[name].copy_(tensor)
        if optimizer:
            self.optimizer.load_state_dict(torch.load(path / "optimizer.pt"))
        self.steps = json.loads((path / "meta.json").read_text())["steps"]


def batches(lengths: list[int], vocab: int) -> list[list[int]]:
    """The data's indices in batches of consecutive data whose padded logits stay within BATCH_LOGITS values (a
    datum longer than that is a batch of its own)."""
    out: list[list[int]] = []
    width = 0
    for i, length in enumerate(lengths):
        if out and (len(out[-1]) + 1) * max(width, length) * vocab <= BATCH_LOGITS:
            out[-1].append(i)
            width = max(width, length)
        else:
            out.append([i])
            width = length
    return out


def read_meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())
