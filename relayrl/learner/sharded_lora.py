"""What a push from sharded learner ranks sends, one gathered tensor at a time, with or without LoRA.

`push_view(policy)` is the object `send_from_shards` (relayrl/sync/gather.py) and `ShardedRanks.named_weights`
walk: `reshard()` and `named_parameters()` whose entries have a global `shape` and a `full_tensor()`. Without
LoRA it is the sharded model itself (its DTensor parameters). With `model.lora` (FSDP2 shards the base and the
adapter alike; only the adapter trains) it yields what `sync.lora` sends, under the names a single learner uses
(relayrl/models/lora.py):
- `adapter`: the adapter's tensors under peft's saved names (`...lora_A.weight`), each gathered;
- `merged`: every base weight under the base model's names, an adapted one gathered with its A and B and
  returned as W + scale * B @ A (one merged tensor at a time, as `lora.merged_tensors`).
Every rank walks the entries in the same order and each `full_tensor()` is all-gathers every rank joins, so the
learner group's collectives stay in step.

Leaves out: the buckets and transports (relayrl/sync/), sharded checkpoints (dist_checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from relayrl.models import lora


class Gathered:
    """One pushed tensor: its global shape, and the gather (a collective) that makes it whole."""

    def __init__(self, shape: torch.Size, gather: Callable[[], torch.Tensor]):
        self.shape, self._gather = shape, gather

    def full_tensor(self) -> torch.Tensor:
        return self._gather()


class PushView:
    def __init__(self, network: nn.Module, entries: dict[str, Gathered]):
        self.network, self.entries = network, entries

    def reshard(self) -> None:
        cast(FSDPModule, self.network).reshard()  # a no-grad forward leaves the root's parameters gathered

    def named_parameters(self) -> Iterator[tuple[str, Gathered]]:
        return iter(self.entries.items())


def push_view(policy) -> Any:
    """The sharded policy's network, or with LoRA the view of what `policy.sync_mode` sends."""
    if policy.sync_mode is None:
        return policy.network
    if policy.sync_mode == "adapter":
        return PushView(policy.network, adapter_entries(policy.model))
    return PushView(policy.network, merged_entries(policy.model))


def saved_name(name: str) -> str:
    """A peft parameter's name as saved (and as vLLM loads it): the adapter's name dropped."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def adapter_entries(model) -> dict[str, Gathered]:
    return {saved_name(n): Gathered(p.shape, p.full_tensor) for n, p in model.named_parameters() if ".lora_" in n}


def merged_entries(model) -> dict[str, Gathered]:
    return {
        name: Gathered(
            param.shape, cast(DTensor, param).full_tensor if layer is None else partial(_merged, param, layer)
        )
        for name, param, layer in lora.base_weights(model)
    }


@torch.no_grad()
def _merged(param, layer) -> torch.Tensor:
    """W + scale * B @ A from the gathered base weight and adapter (peft's `get_delta_weight`, on full tensors)."""
    from peft.utils.other import transpose

    full = param.full_tensor()
    for adapter in layer.active_adapters:
        a, b = layer.lora_A[adapter].weight.full_tensor(), layer.lora_B[adapter].weight.full_tensor()
        full = full + (transpose(b @ a, layer.fan_in_fan_out) * layer.scaling[adapter]).to(full.dtype)
    return full
