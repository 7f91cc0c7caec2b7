"""Checkpoints of sharded learner ranks, resumable at another number of ranks.

A sharded checkpoint is today's checkpoint directory (checkpoint.py: atomic rename, manifest of sha256s) with
`sharded/` in place of `model/`: `torch.distributed.checkpoint` files of the policy and its AdamW state (and
the critic's), each rank writing its own shards, from `get_state_dict`. `trainer_state.pt` holds what every
rank shares: the loop's state (sampler, version, ...), the schedule, the shuffling generator, the KL
coefficient and the RNG. Loading goes through `set_state_dict`, which reshards to whatever the loading side
is: W ranks, or one plain process (so 2 -> 1 and 1 -> 2 resume). A W=1 checkpoint (`model/` and the
optimizer in `trainer_state.pt`) loads into W ranks through the same call, as a full state dict.

With `model.lora` only the trainable tensors are saved (the adapters, and the critic's value head): the frozen
base is the run's model.path, loaded again on resume; loading then fills what was saved and leaves the base
(`ignore_frozen_params`, non-strict). The final model of a LoRA run is the merged base plus `adapter/` beside
it, as a single learner writes it, and `export_sharded` merges the saved adapter into the base.

Rank 0 runs `save_checkpoint` and the others write their shards into the same temporary directory between
two barriers, so the rename still happens once every shard is on disk.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from relayrl.models.loading import load_causal_lm
from relayrl.run.checkpoint import checkpoint_root, save_checkpoint

SHARDED_DIR = "sharded"


def is_sharded(checkpoint: str | Path) -> bool:
    return (Path(checkpoint) / SHARDED_DIR).is_dir()


def _trained(learner) -> list[tuple[str, torch.nn.Module, torch.optim.Optimizer]]:
    models = [("policy", learner.policy.model, learner.policy.optimizer)]
    if learner.critic is not None:
        models.append(("critic", learner.critic.model, learner.critic.optimizer))
    return models


def _options(learner, **full) -> StateDictOptions:
    """With LoRA the frozen base is neither saved nor expected on load."""
    lora = learner.settings.model.lora is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora, **full)


def _sharded_state(learner) -> dict:
    state = {}
    for name, model, optimizer in _trained(learner):
        model_state, optimizer_state = get_state_dict(model, optimizer, options=_options(learner))
        state[name] = {"model": model_state, "optimizer": optimizer_state}
    return state


def shared_state(learner) -> dict:
    """What every rank holds alike (written once, by rank 0)."""
    policy = learner.policy
    return {
        "scheduler": policy.scheduler.state_dict(),
        "generator": policy.generator.get_state(),
        "kl_coef": policy.objective.kl_controller.coef,
        "torch_rng": torch.get_rng_state(),
        "critic_generator": None if learner.critic is None else learner.critic.generator.get_state(),
    }


class _ShardWriter:
    """Stands in for the model in `save_checkpoint`: its save_pretrained writes this rank's shards."""

    def __init__(self, state: dict):
        self.state = state

    def save_pretrained(self, target: Path) -> None:
        write_shards(self.state, Path(target).parent)


def write_shards(state: dict, directory: Path) -> None:
    dist.barrier()  # rank 0 has made the temporary directory
    dcp.save(state, checkpoint_id=directory / SHARDED_DIR)  # pyright: ignore[reportPrivateImportUsage] - public API


def save_sharded(learner, run_dir: str | Path, step: int, loop_state: dict, keep: int) -> str:
    """Every rank calls this; returns the checkpoint's path once it is in place."""
    state = _sharded_state(learner)
    final = checkpoint_root(run_dir) / f"step_{step:06d}"
    if dist.get_rank() == 0:
        save_checkpoint(run_dir, step, _ShardWriter(state), {**loop_state, **shared_state(learner)}, keep)
    else:
        write_shards(state, checkpoint_root(run_dir) / f".tmp_step_{step:06d}")
    dist.barrier()  # renamed into place
    return str(final)


def load_any(learner, checkpoint: str | Path, state: dict) -> None:
    """Restore a sharded or a single-process checkpoint into `learner` (sharded ranks or one plain process)."""
    if is_sharded(checkpoint):
        saved = _sharded_state(learner)  # the loading side's layout: DCP reshards into it
        with warnings.catch_warnings():  # one plain process reading shards is the intent (2 -> 1)
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(saved, checkpoint_id=Path(checkpoint) / SHARDED_DIR, no_dist=not dist.is_initialized())  # pyright: ignore[reportPrivateImportUsage]
        for name, model, optimizer in _trained(learner):
            model_state, optim_state = saved[name]["model"], saved[name]["optimizer"]
            set_state_dict(
                model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=_options(learner)
            )
        critic_generator = state["critic_generator"]
    else:
        _load_full(learner, checkpoint, state)
        critic_generator = None if state["critic"] is None else state["critic"]["generator"]
    policy = learner.policy
    policy.scheduler.load_state_dict(state["scheduler"])
    policy.generator.set_state(state["generator"])
    policy.objective.kl_controller.coef = state["kl_coef"]
    if learner.critic is not None:
        learner.critic.generator.set_state(critic_generator)
    torch.set_rng_state(state["torch_rng"])


def _load_full(learner, checkpoint: str | Path, state: dict) -> None:
    """A single-process checkpoint (save_pretrained model, optimizer by parameter index) into sharded ranks."""
    full = _options(learner, full_state_dict=True)
    if learner.settings.model.lora is not None:  # model/ holds the adapter alone, under peft's saved names
        policy_state = _adapter_state(Path(checkpoint) / "model")
    else:
        policy_state = load_causal_lm(Path(checkpoint) / "model", "cpu").state_dict()
    models = [(learner.policy.model, learner.policy.optimizer, policy_state, state["optimizer"])]
    if learner.critic is not None:
        critic = state["critic"]
        models.append((learner.critic.model, learner.critic.optimizer, critic["model"], critic["optimizer"]))
    for model, optimizer, model_state, optimizer_state in models:
        named = _by_name(model, optimizer_state)
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=named, options=full)  # pyright: ignore[reportArgumentType] - a plain tensor dict is what it takes


def _adapter_state(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """A saved peft adapter under the parameter names of the model it was trained in."""
    from safetensors.torch import load_file

    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return {
        n.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): t for n, t in saved.items()
    }


def _by_name(model: torch.nn.Module, optimizer_state: dict) -> dict:
    """torch.optim's state dict (parameters by index, in the order the optimizer was given them) keyed by
    parameter name, as set_state_dict takes it."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    (group,) = optimizer_state["param_groups"]
    return {
        "state": {names[i]: value for i, value in optimizer_state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]}],
    }


def save_pretrained_from_shards(learner, target: Path, tokenizer=None) -> None:
    """The final policy as a save_pretrained directory: gathered to full tensors, written by rank 0."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if learner.settings.model.lora is not None:
        return _save_lora_from_shards(learner, target, tokenizer)
    full = get_model_state_dict(learner.policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        plain = load_causal_lm(learner.settings.model.path, "cpu")
        plain.load_state_dict(full)
        plain.save_pretrained(target)
        if tokenizer is not None:
            tokenizer.save_pretrained(target)
    dist.barrier()


def _save_lora_from_shards(learner, target: Path, tokenizer=None) -> None:
    """A LoRA run's final model as a single learner writes it: the merged base, and its adapter in `adapter/`.
    Every rank joins each gather; rank 0 keeps the tensors (the whole merged model, as without LoRA)."""
    from relayrl.learner.sharded_lora import adapter_entries, merged_entries
    from relayrl.models import lora

    policy = learner.policy
    policy.network.reshard()
    merged, adapter = _on_rank0(merged_entries(policy.model)), _on_rank0(adapter_entries(policy.model))
    if dist.get_rank() == 0:
        load_causal_lm(learner.settings.model.path, "cpu").save_pretrained(target, state_dict=merged)
        lora.write_adapter_dir(Path(target) / lora.ADAPTER_DIR, lora.resolved_config(policy.model), adapter)
        if tokenizer is not None:
            tokenizer.save_pretrained(target)
    dist.barrier()


def _on_rank0(entries: dict) -> dict[str, torch.Tensor]:
    out = {}
    for name, entry in entries.items():
        tensor = entry.full_tensor().detach().cpu()  # a collective on every rank
        if dist.get_rank() == 0:
            out[name] = tensor
    return out


def export_sharded(checkpoint: str | Path, out: str | Path, base_model: str | Path, tokenizer=None) -> Path:
    """A sharded checkpoint's policy as a save_pretrained directory: the base model's architecture (the run's
    model.path) filled with the checkpoint's weights, read in one plain process; a LoRA run's saved adapter is
    merged into the base (its settings from the run's config.yaml)."""
    from relayrl.models import lora

    model, lora_settings = load_causal_lm(base_model, "cpu"), _run_lora(Path(checkpoint))
    if lora_settings is None:
        tensors = model.state_dict()
    else:  # the adapter alone was saved; these tensors share the parameters' storage: dcp.load fills them
        model = lora.add_adapter(model, lora_settings)
        tensors = {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}
    state = {"policy": {"model": tensors}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=Path(checkpoint) / SHARDED_DIR, no_dist=not dist.is_initialized())  # pyright: ignore[reportPrivateImportUsage]
    if lora_settings is None:
        model.load_state_dict(state["policy"]["model"])
        model.save_pretrained(str(out))
    else:
        lora.save_merged(model, out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return Path(out)


def _run_lora(checkpoint: Path):
    """The run's `model.lora` (from its config.yaml) when its sharded checkpoint holds adapter tensors; else None."""
    metadata = dcp.FileSystemReader(str(checkpoint / SHARDED_DIR)).read_metadata()  # pyright: ignore[reportPrivateImportUsage]
    if not any(".lora_" in key for key in metadata.state_dict_metadata):
        return None
    from relayrl.run.checkpoint import run_config

    return run_config(checkpoint).model.lora
