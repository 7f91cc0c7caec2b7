"""Tensor-parallel vLLM engines (`rollout.tensor_parallel` = T > 1): each replica runs T vLLM ranks.

vLLM's CPU backend runs TP with the `mp` executor (one worker process per rank; the engine core stays in
the caller's process), eager mode, and one OpenMP core list per rank in `VLLM_CPU_OMP_THREADS_BIND`
(`"0|1"`: `|` separates the ranks). The model then lives in the worker processes, not in the caller's, so
weights travel by `collective_rpc` to a worker extension (`TPWeightLoader`) that every rank loads: one
layerwise reload (vLLM's own `reload_weights`, split into begin / buckets / end) takes the full tensors
in buckets of at most `RPC_BUCKET_BYTES`, and each rank's weight loaders keep their own slice of every
tensor (column/row-parallel shards, fused qkv and gate_up). The bytes of one bucket cross vLLM's shared
memory queue out of band, inside vLLM's weight-update session (relayrl/rollout/vllm_transfer.py); no rank ever
holds a second copy of the model. With `sync.transport=broadcast` the ranks take a push from the learner's broadcast
themselves instead (vllm_transfer.py), a bucket at a time.

`check_tensor_parallel` is the config rule (`relayrl.build.resolve` calls it): T > 1 needs vLLM (`auto` then
chooses vLLM; an explicit `hf` is an error), T must split the attention heads as vLLM does, and each
replica needs T cores (CPU) or T GPUs. Every call into vLLM internals for TP lives in this module.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relayrl.errors import ConfigError

if TYPE_CHECKING:
    from relayrl.config import PlacementConfig, RolloutConfig
    from relayrl.rollout.choice import EngineChoice

# One RPC's worth of tensors: under vLLM's 16 MiB shared-memory chunk (VLLM_MQ_MAX_CHUNK_BYTES_MB), so a
# bucket crosses the ring buffer instead of the overflow socket; a larger tensor travels alone.
RPC_BUCKET_BYTES = 15 * 2**20
# TPWeightLoader, named through the module that registers relayrl's weight-transfer engine: a rank process imports
# it (vLLM already loaded there) before its worker builds that engine. This module never imports vLLM at the top:
# the driver imports it before vLLM's environment is set (relayrl/rollout/vllm_engine.py).
EXTENSION = "relayrl.rollout.vllm_transfer.RankExtension"


def engine_args(tensor_parallel: int) -> dict:
    """`LLM(...)` arguments of a T-rank engine (none for T = 1: the in-process engine stays as it is)."""
    if tensor_parallel == 1:
        return {}
    return {
        "tensor_parallel_size": tensor_parallel,
        "distributed_executor_backend": "mp",
        "worker_extension_cls": EXTENSION,
    }


def parse_cores(cores: str) -> list[int]:
    """'0,2-3' -> [0, 2, 3] (the `Slot.cores` form; `|` is taken as a separator too)."""
    ids: list[int] = []
    for part in cores.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        ids += list(range(int(first), int(last or first) + 1))
    return ids


def rank_binding(cores: str | None, tensor_parallel: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for T ranks: the replica's cores (default: this machine's) dealt into T
    contiguous lists, `|` between ranks. Fewer cores than ranks is an error naming what did not fit."""
    ids = parse_cores(cores) if cores else list(range(os.cpu_count() or 1))
    if len(ids) < tensor_parallel:
        where = f"the cores given to this engine ({cores})" if cores else f"this machine's {len(ids)} core(s)"
        raise ConfigError(
            f"rollout.tensor_parallel={tensor_parallel} needs one core per rank, but {where} are only "
            f"{len(ids)}: raise placement.engine_threads (or placement.engine_cpus), or lower rollout.tensor_parallel"
        )
    size, extra = divmod(len(ids), tensor_parallel)
    lists, start = [], 0
    for rank in range(tensor_parallel):
        end = start + size + (rank < extra)
        lists.append(",".join(map(str, ids[start:end])))
        start = end
    return "|".join(lists)


def started(llm) -> None:
    """After a T-rank engine has started: its shared-memory segments no longer need names."""
    llm.collective_rpc("relayrl_unlink_shm")


@contextlib.contextmanager
def ranks_bound(cores: str | None, tensor_parallel: int) -> Iterator[None]:
    """While an engine starts, its rank processes read their core lists from the environment: set them, and
    put back what was there once the ranks have started (another engine of this process, a test's, keeps its
    own). vLLM caches its environment after an engine starts; the cache is dropped so this engine reads the
    values set here. The ranks also skip vLLM's FutureWarnings (its own use of deprecated torch names, which
    `_configure_environment` filters in this process)."""
    from vllm import envs

    warn = ",".join(filter(None, ["ignore::FutureWarning", os.environ.get("PYTHONWARNINGS")]))  # a user's wins
    values = {"VLLM_CPU_OMP_THREADS_BIND": rank_binding(cores, tensor_parallel), "PYTHONWARNINGS": warn}
    before = {key: os.environ.get(key) for key in values}
    envs.disable_envs_cache()
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        envs.disable_envs_cache()


class TPWeightLoader:
    """vLLM worker extension (mixed into every rank's worker, as `vllm_transfer.RankExtension`, whose import registers
    relayrl's weight-transfer engine in the rank's process): every push reaches the rank through that engine; each
    rank's weight loaders slice the full tensors it is given."""

    # the worker's own, once mixed in (annotations only: no class attribute clashes with the worker's)
    model_runner: Any
    vllm_config: Any

    def relayrl_unlink_shm(self) -> int:
        """Drop the names of vLLM's CPU all-reduce segments (/dev/shm/<VLLM_DIST_IDENT>-...-cpushm_<rank>): every
        rank has mapped all of them once the engine has started, and vLLM never unlinks them, so each start
        would leave 4 MiB per rank behind (a rank ends by SIGTERM here; a Ray restart kills it)."""
        ident = os.environ.get("VLLM_DIST_IDENT")
        paths = list(Path("/dev/shm").glob(f"{ident}-*-cpushm*")) if ident else []
        for path in paths:
            path.unlink(missing_ok=True)
        return len(paths)

    def relayrl_lora_view(self) -> LoraView:
        return LoraView.of(self.model_runner.get_model())


@dataclass(frozen=True)
class LoraView:
    """What the LoRA start-up check needs of an engine's model (relayrl/rollout/vllm_adapters.py, `EngineAdapters.check`):
    the modules that serve adapters, the fused-projection map and the vocabulary size. A T-rank engine's model
    is in its rank processes: rank 0 reports this instead."""

    served: frozenset[str]
    packed: dict[str, list[str]]
    vocab: int

    @classmethod
    def of(cls, model) -> LoraView:
        from vllm.lora.layers import BaseLayerWithLoRA

        served = frozenset(name for name, module in model.named_modules() if isinstance(module, BaseLayerWithLoRA))
        vocab = model.config.get_text_config().vocab_size if hasattr(model, "config") else 16  # a VLM nests it
        return cls(served, dict(getattr(model, "packed_modules_mapping", {})), vocab)


def rank_lora_view(llm) -> LoraView:
    return llm.collective_rpc("relayrl_lora_view")[0]


def load_weights_tp(
    llm, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = RPC_BUCKET_BYTES
) -> None:
    """Stream checkpoint-named full tensors into every rank, `bucket_bytes` per call (vLLM's weight-update session,
    relayrl/rollout/vllm_transfer.py); the prefix cache is reset after."""
    from relayrl.rollout.vllm_transfer import stream_weights

    stream_weights(llm, named_tensors, bucket_bytes)


def check_tensor_parallel(rollout: RolloutConfig, model_path: str, placement: PlacementConfig) -> EngineChoice | None:
    """The config rule for `rollout.tensor_parallel` (see the module docstring); run after `rollout.engine: auto`
    has chosen (and before `sync.lora: auto`, which then sees the engine T ranks need). Returns the engine chosen
    anew when `auto` had chosen HF (T ranks are vLLM's), for the builder to record; else None."""
    tp = rollout.tensor_parallel
    if tp == 1:
        return None
    choice = None
    if rollout.engine == "hf":
        if "engine" in rollout.model_fields_set:
            raise ConfigError(
                f"rollout.tensor_parallel={tp} splits a vLLM engine into ranks; rollout.engine=hf has none: "
                "set rollout.engine=vllm (or auto), or rollout.tensor_parallel=1"
            )
        from relayrl.rollout.choice import EngineChoice

        # auto chose HF for a small model on CPU; asking for ranks is asking for vLLM
        choice = EngineChoice("vllm", f"rollout.tensor_parallel={tp} runs vLLM ranks")
        rollout.engine = "vllm"
    check_heads(model_path, tp)
    check_devices(placement, tp)
    return choice


def check_devices(placement: PlacementConfig, tp: int) -> None:
    """T cores (CPU) or T GPUs per engine. Under Ray the engine bundles reserve them (relayrl/placement/cluster.py
    gives each engine's bundle T GPUs, and the cluster's GPUs are counted when it is placed: the driver's node may
    have none); a GPU count the user set below T in placement.engine_resources is an error naming it. In one
    process, this machine must have T GPUs. On CPU: an engine size the user left unset is raised to T cores."""
    ray = placement.mode == "ray"
    if ray and placement.engine_resources.get("GPU", tp) < tp:
        raise ConfigError(
            f"rollout.tensor_parallel={tp} needs {tp} GPUs per engine bundle, "
            f"placement.engine_resources gives GPU: {placement.engine_resources['GPU']:g}"
        )
    if _on_gpu():
        have = torch.cuda.device_count()
        if not ray and have < tp:
            raise ConfigError(f"rollout.tensor_parallel={tp} needs {tp} GPUs per engine, this machine has {have}")
        return
    if not ray:
        if (os.cpu_count() or 1) < tp:
            raise ConfigError(
                f"rollout.tensor_parallel={tp} needs one core per rank, this machine has {os.cpu_count()}"
            )
        return
    if "engine_cpus" not in placement.model_fields_set:
        placement.engine_cpus = max(placement.engine_cpus, float(tp))
    threads = placement.engine_threads or max(1, math.floor(placement.engine_cpus))
    if placement.engine_cpus < tp or threads < tp:
        raise ConfigError(
            f"rollout.tensor_parallel={tp} needs {tp} cores per engine (one per rank), but each engine reserves "
            f"placement.engine_cpus={placement.engine_cpus:g} and is pinned to {threads} "
            f"(placement.engine_threads={placement.engine_threads}): set both to at least {tp}, or unset them"
        )


def check_heads(model_path: str, tp: int) -> None:
    """vLLM's own rule: T divides the attention heads; T divides the KV heads, or (fewer KV heads than ranks)
    the KV heads divide T and are replicated. Skipped when the model's config.json cannot be read yet."""
    path = Path(model_path) / "config.json" if model_path else None
    try:
        raw = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return
    raw = raw.get("text_config", raw)
    heads = raw.get("num_attention_heads")
    if not isinstance(heads, int):
        return
    kv = raw.get("num_key_value_heads") or heads
    kv_ok = kv % tp == 0 if kv >= tp else tp % kv == 0
    if heads % tp or not kv_ok:
        raise ConfigError(
            f"rollout.tensor_parallel={tp} must divide the model's attention heads: {path} has "
            f"num_attention_heads={heads} and num_key_value_heads={kv} (each rank takes heads/T query heads "
            "and a whole share of the KV heads)"
        )


def _on_gpu() -> bool:
    return torch.cuda.is_available()
