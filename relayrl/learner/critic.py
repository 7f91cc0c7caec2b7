"""The PPO critic: a value model (an HF backbone + a scalar head) and its clipped value-loss update.

Values are aligned like the policy's log-probs: column j is the value of the state at position j, the one
from which token j+1 is generated ([B, T-1]). Built only when `algorithm.advantage = gae`.

With `model.lora` the critic trains an adapter of its own (same settings as the policy's) on its frozen copy
of the backbone, plus the full value head; its checkpoint state is those trainable tensors only.

A vision-language backbone reads the rows' images as the policy does (`layout.image_inputs`), its value head
sits on the language model's hidden size, and `model.freeze_vision` freezes its tower as the policy's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from relayrl.learner import malloc
from relayrl.learner.activation_checkpointing import checkpointing_on, enable_activation_checkpointing
from relayrl.learner.batching import MicroBatcher
from relayrl.learner.layout import image_inputs
from relayrl.learner.optim import build_optimizer
from relayrl.models.loading import check_model_dir
from relayrl.models.vision import freeze_vision
from relayrl.types import filled

if TYPE_CHECKING:
    from relayrl.learner.settings import LearnerSettings
    from relayrl.types import Experience


class ValueModel(nn.Module):
    """A transformer body without its LM head, and a linear head reading one value per position."""

    def __init__(self, path: str, lora_settings=None, meta: bool = False, freeze_tower: bool = False):
        """`meta`: built on the meta device without reading the weights (sharded ranks other than 0);
        `freeze_tower`: a vision-language body's vision tower gets no gradients."""
        super().__init__()
        from transformers import AutoModel

        self.body: Any  # an HF decoder without its head (peft-wrapped with LoRA)
        if meta:
            from relayrl.learner.sharded_init import empty_value_body

            self.body = empty_value_body(path)
        else:
            self.body = AutoModel.from_pretrained(path, dtype=torch.float32)
        hidden = self.body.config.get_text_config().hidden_size  # a VLM's config nests it in text_config
        self.frozen = freeze_vision(self.body) if freeze_tower else set()
        if lora_settings is not None:
            from relayrl.models.lora import add_adapter

            self.body = add_adapter(self.body, lora_settings)
        self.head = nn.Linear(hidden, 1, device="meta" if meta else None)
        nn.init.zeros_(self.head.weight)  # start at V = 0 everywhere: GAE then begins as plain returns
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **images: torch.Tensor) -> torch.Tensor:
        """[B, T] values; `images`: a vision-language body's pixel values and other image inputs."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, **images).last_hidden_state
        return self.head(hidden).squeeze(-1)  # [B, T]


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    normaliser: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), token-mean over the
    mini-batch (`normaliser` = its token count). Returns (loss, number of tokens where the clipped term won)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_error, clipped_error = (values - returns) ** 2, (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
    loss = (per_token * mask).sum() / max(normaliser, 1.0)
    return loss, ((clipped_error > unclipped_error) & mask.bool()).sum().detach()


def token_count(mask: torch.Tensor) -> float:
    """The value loss's normaliser: the mini-batch's response tokens (sharded.py sums it over the ranks)."""
    return float(mask.sum())


class Critic:
    def __init__(self, settings: LearnerSettings, device: str, meta: bool = False, on_host: bool = False):
        """`meta`: built without weights (sharded ranks other than 0); `on_host`: loaded into CPU memory and left
        there (sharded rank 0: `attach` shards it onto `device`)."""
        critic = settings.critic
        path = critic.path or settings.model.path
        check_model_dir(path, "critic.path" if critic.path else "model.path")
        self.settings, self.device = settings, device
        self.lora = settings.model.lora
        model = ValueModel(path, self.lora, meta, freeze_tower=settings.model.freeze_vision)
        self.model = (model if meta or on_host else model.to(device)).eval()  # eval: no dropout, as for the policy
        self.normaliser = token_count
        if checkpointing_on(settings.learner, device):
            body = self.model.body
            enable_activation_checkpointing(body.get_base_model() if self.lora is not None else body)
        malloc.apply(settings.learner, device)  # learner.return_freed_memory
        self.optimizer = build_optimizer(self.model, critic.lr, settings.train.weight_decay, settings.train.betas)
        self.generator = torch.Generator().manual_seed(settings.train.seed + 1)
        self.micro = MicroBatcher(settings.train.micro_batch, settings.train.micro_batch_tokens)  # padded rows

    def _values(self, part: Experience) -> torch.Tensor:
        images = {key: tensor.to(self.device) for key, tensor in image_inputs(part).items()}
        out = self.model(part.input_ids.to(self.device), part.attention_mask.to(self.device), **images)
        return out[:, :-1]  # [b, t-1], aligned to targets

    @torch.no_grad()
    def values(self, exp: Experience) -> torch.Tensor:
        out = torch.zeros_like(exp.loss_mask)
        for index in self.micro.split(torch.arange(len(exp)), exp, count=False):
            part = exp.select(index)
            out[index, : part.loss_mask.shape[1]] = self._values(part).cpu() * part.loss_mask
        return out

    def update(self, exp: Experience) -> dict[str, float]:
        """Epochs of shuffled mini-batches regressing values on the GAE returns, as the actor's update."""
        train, clip = self.settings.train, self.settings.critic.value_clip
        losses, clipped, tokens, grad_norms = [], 0.0, 0.0, []
        for _ in range(train.epochs):
            order = torch.randperm(len(exp), generator=self.generator)
            for mini in order.split(self.settings.mini_batch):
                normaliser = self.normaliser(exp.loss_mask[mini])
                step_loss = 0.0
                for micro in self.micro.split(mini, exp, count=False):
                    part = exp.select(micro)
                    mask = part.loss_mask.to(self.device)
                    loss, n_clipped = clipped_value_loss(
                        self._values(part),
                        filled(part.values, "values").to(self.device),
                        filled(part.returns, "returns").to(self.device),
                        mask,
                        clip,
                        normaliser,
                    )
                    loss.backward()
                    step_loss += float(loss.detach())
                    clipped += float(n_clipped)
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.grad_clip)))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                losses.append(step_loss)
                tokens += float(exp.loss_mask[mini].sum())
        return {
            "critic/value_loss": sum(losses) / len(losses),  # on a sharded rank: its part of the global loss
            "critic/grad_norm": sum(grad_norms) / len(grad_norms),
            "critic/clip_frac": clipped / max(tokens, 1.0),
            "critic/values_mean": float(filled(exp.values, "values")[exp.loss_mask.bool()].mean()),
            "critic/returns_mean": float(filled(exp.returns, "returns")[exp.loss_mask.bool()].mean()),
        }

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint must hold: every weight, or with LoRA the adapter and the head."""
        names = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {name: t for name, t in self.model.state_dict().items() if self.lora is None or name in names}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        _, unexpected = self.model.load_state_dict(state, strict=self.lora is None)
        if unexpected:
            raise ValueError(f"critic checkpoint holds tensors the critic does not have: {unexpected[:3]}")

    def save(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        self.model.body.save_pretrained(str(out))
        torch.save(self.model.head.state_dict(), out / "value_head.pt")
