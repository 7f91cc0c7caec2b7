"""How a sharded learner rank gets its weights without any rank holding the whole model on its device, and its
mixed-precision policy.

Only rank 0 reads the checkpoint, and into CPU memory (`load_on_host`, `ValueModel` for the critic): the whole
model never reaches its GPU. Every other rank builds the same architecture on the meta device (shapes, no storage:
`empty_causal_lm`, `empty_value_body`). Before `fully_shard` (sharded.py) rank 0 keeps its loaded tensors aside
(`full_state_on_rank0`: the state dict and the buffers) and moves its model to the meta device too, so every rank
shards the same empty model (`fully_shard` would otherwise move rank 0's whole model to the GPU before splitting
it). `fill_from_rank0` then allocates each rank's shards on its device (`to_empty`) and fills them from rank 0's
host copy with `set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)`: rank 0 copies one
tensor at a time to its device and broadcasts it, every rank keeps its slice. Buffers outside the state dict (a
rotary embedding's `inv_freq`, computed at construction, which `to_empty` leaves as garbage) are rank 0's, copied
back and broadcast. So a rank's device peak at load is its shards plus one full tensor in flight; rank 0's host
holds the model once (the reference in bf16 on a GPU run), as verl's rank 0 does (verl/utils/fsdp_utils.py).

`mixed_precision`: on GPU with model.dtype auto or bfloat16, FSDP2 all-gathers parameters in bf16 for the
forward and backward and reduce-scatters gradients in fp32, while the shards the optimizer steps stay fp32
(the master weights). On CPU, or with model.dtype=float32, everything stays fp32 (no policy).

Leaves out: the sharding itself and the group (sharded.py, process_group.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy

from relayrl.models.loading import check_model_dir

if TYPE_CHECKING:
    from relayrl.config import ModelConfig


def empty_causal_lm(path: str | Path, device: str = "meta", key: str = "model.path") -> nn.Module:
    """The causal LM of `path` built from its config alone, on the meta device (no weights read or allocated);
    the signature of `load_causal_lm`, so PolicyLearner takes either. The same auto class as rank 0 loads (a
    vision-language model's is not AutoModelForCausalLM: relayrl/models/loading.py `model_class`)."""
    from transformers import AutoConfig

    from relayrl.models.loading import model_class

    check_model_dir(path, key)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return model_class(config).from_config(config, dtype=torch.float32)


def empty_value_body(path: str | Path) -> nn.Module:
    """The critic's transformer body (AutoModel, no LM head) of `path`, on the meta device."""
    from transformers import AutoConfig, AutoModel

    with torch.device("meta"):
        return AutoModel.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)


def load_on_host(path: str | Path, device: str = "cpu") -> nn.Module:
    """Rank 0's policy and reference: `load_causal_lm` into CPU memory whatever `device` the learner runs on (the
    signature PolicyLearner calls); `attach` shards them onto the device."""
    from relayrl.models.loading import load_causal_lm

    return load_causal_lm(path, "cpu")


@dataclass
class HostCopy:
    """Rank 0's loaded tensors, kept in CPU memory while its model is sharded: the state dict and the buffers (the
    rotary `inv_freq` is not in the state dict). Empty on the other ranks."""

    state: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def full_state_on_rank0(model: nn.Module, rank: int) -> HostCopy:
    """What rank 0 broadcasts, taken before sharding (references to its loaded tensors, no copy), its model then
    moved to the meta device as the other ranks' are; an empty copy elsewhere."""
    if rank != 0:
        return HostCopy()
    held = HostCopy(model.state_dict(), {name: b for name, b in model.named_buffers()})
    to_meta(model)  # the loaded storage stays alive in `held` only
    return held


def to_meta(model: nn.Module) -> None:
    """Every parameter and buffer of `model` replaced by one of its shape on the meta device (a parameter two modules
    share, a tied head, stays shared; `fully_shard` makes new parameters anyway). Not `model.to("meta")`, which
    cannot swap the simulation's fake parameters (relayrl/planner/simulate.py)."""
    moved: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                if id(param) not in moved:
                    empty = torch.empty_like(param, device="meta")
                    moved[id(param)] = nn.Parameter(empty, requires_grad=param.requires_grad)
                module._parameters[name] = moved[id(param)]
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = torch.empty_like(buffer, device="meta")


def fill_from_rank0(model: nn.Module, held: HostCopy, device: str, offload: bool = False) -> None:
    """Every rank calls this after `fully_shard`: allocate the shards of the meta model (in CPU memory under
    learner.offload=params, its buffers on `device` either way), then fill every rank's shards from rank 0's
    host copy `held`, and its buffers from rank 0's."""
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device="cpu" if offload else device)
        for module in model.modules():  # FSDP2 keeps buffers on the compute device, offloaded or not
            for name, buffer in module.named_buffers(recurse=False):
                setattr(module, name, buffer.to(device))
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, held.state, options=options)  # pyright: ignore[reportArgumentType] - tensors
    for name, buffer in model.named_buffers():
        if held.buffers:  # rank 0
            buffer.copy_(held.buffers[name])
        dist.broadcast(buffer, src=0)


def mixed_precision(model: ModelConfig, device: str) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for the learner ranks: bf16 parameters in the passes, fp32 gradient reduction and fp32
    master shards, on GPU unless model.dtype=float32; None (fp32 throughout) on CPU."""
    if device != "cuda" or model.dtype == "float32":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
