"""How a sharded learner rank gets its weights without loading the whole model, and its mixed-precision policy.

Only rank 0 reads the checkpoint (`load_causal_lm`, a full model in its memory, as at W=1). Every other rank
builds the same architecture on the meta device (shapes, no storage: `empty_causal_lm`, `empty_value_body`),
so its peak at start is its shards, not the model. After `fully_shard` (sharded.py), `fill_from_rank0`
allocates each rank's shards (`to_empty`) and fills them from rank 0's full state dict with
`set_model_state_dict(..., broadcast_from_rank0=True)`: rank 0 broadcasts one tensor at a time and every rank
keeps its slice. Buffers outside the state dict (a rotary embedding's `inv_freq`, computed at construction,
which `to_empty` leaves as garbage) are broadcast from rank 0 too.

`mixed_precision`: on GPU with model.dtype auto or bfloat16, FSDP2 all-gathers parameters in bf16 for the
forward and backward and reduce-scatters gradients in fp32, while the shards the optimizer steps stay fp32
(the master weights). On CPU, or with model.dtype=float32, everything stays fp32 (no policy).

Leaves out: the sharding itself and the group (sharded.py, process_group.py).
"""

from __future__ import annotations

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


def full_state_on_rank0(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """What rank 0 broadcasts, taken before sharding (references to its loaded tensors, no copy); {} elsewhere."""
    return model.state_dict() if rank == 0 else {}


def fill_from_rank0(model: nn.Module, full_state: dict[str, torch.Tensor], device: str, offload: bool = False) -> None:
    """Every rank calls this after `fully_shard`: allocate the shards of a meta-built model (in CPU memory under
    learner.offload=params, its buffers on `device` either way), then fill every rank's shards from rank 0's
    `full_state` and copy rank 0's buffers."""
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device="cpu" if offload else device)
        for module in model.modules():  # FSDP2 keeps buffers on the compute device, offloaded or not
            for name, buffer in module.named_buffers(recurse=False):
                setattr(module, name, buffer.to(device))
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state, options=options)  # pyright: ignore[reportArgumentType] - tensors
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def mixed_precision(model: ModelConfig, device: str) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for the learner ranks: bf16 parameters in the passes, fp32 gradient reduction and fp32
    master shards, on GPU unless model.dtype=float32; None (fp32 throughout) on CPU."""
    if device != "cuda" or model.dtype == "float32":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
