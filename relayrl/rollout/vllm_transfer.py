"""relayrl's engine in vLLM's weight-transfer registry (`vllm.distributed.weight_transfer`, backend `relayrl`), and
the stream that drives it: every weight push into a vLLM engine, one rank or T, goes through the worker's own
weight-update lifecycle (`start_weight_update`, `update_weights` per bucket, `finish_weight_update`), the path
vLLM's `nccl` and `ipc` engines take on GPU.

Why an engine of our own rather than `nccl` or `ipc`: both move tensors between CUDA devices (a NCCL group with the
trainer, CUDA IPC handles), and neither runs on this CPU. Here the tensors themselves are the update: in the
engine's process (one rank) by reference, and to T rank processes through vLLM's RPC queue (its shared-memory
ring, out of band), as before this engine existed. What the engine does with them is what vLLM's checkpoint-
format engines do: a layerwise reload (`initialize_layerwise_reload` at start, the model's `load_weights` per
bucket, `finalize_layerwise_reload` at the end), so the CPU suite runs the worker-side sequence and its checks
(an update outside a session, two sessions at once) that a GPU push runs. The trainer side of `nccl`/`ipc` on GPU
is not wired yet (gpu_check.sh measures the IPC handoff by itself).

The engine registers itself when this module is imported: in the driver's process before an in-process engine
starts (relayrl/rollout/vllm_engine.py imports it after vLLM's environment is set), and in each rank process,
which imports `RankExtension` from here as its worker extension before the worker builds its weight-transfer
engine. Every call into this vLLM API lives here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

BACKEND = "relayrl"


@dataclass
class RelayrlInitInfo(WeightTransferInitInfo):
    """Nothing to connect: the tensors come with each update."""


@dataclass
class RelayrlUpdateInfo(WeightTransferUpdateInfo):
    named_tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # checkpoint names, full tensors


class RelayrlTransferEngine(WeightTransferEngine[RelayrlInitInfo, RelayrlUpdateInfo]):
    """A layerwise reload fed by the tensors of each `update_weights` call."""

    init_info_cls = RelayrlInitInfo
    update_info_cls = RelayrlUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: RelayrlInitInfo) -> None:
        return None

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """One bucket. A bucket that fails leaves its layer half reloaded (vLLM's layerwise reload buffers the
        layer's tensors and cannot roll back); the worker closes the session, and relayrl's engine refuses to
        serve until it is restarted (relayrl/rollout/vllm_engine.py)."""
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # the base class synchronises unconditionally: CPU has no accelerator
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: RelayrlUpdateInfo) -> None:
        self.model.load_weights(iter(update_info.named_tensors))  # pyright: ignore[reportCallIssue] - vLLM types the model as nn.Module

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        from relayrl.rollout.vllm_engine import _refresh_tied_lm_head

        finalize_layerwise_reload(self.model, self.model_config)
        _refresh_tied_lm_head(self.model)

    def shutdown(self) -> None:
        return None


def register() -> None:
    # ValueError: this process has it already (the module imported twice: as a file and as a module)
    with contextlib.suppress(ValueError):
        WeightTransferEngineFactory.register_engine(BACKEND, RelayrlTransferEngine)


def stream_weights(llm, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None) -> None:
    """Checkpoint-named full tensors into every rank of `llm`, `bucket_bytes` per `update_weights` call (None: one
    call), through the worker's weight-update session; then the caches that hold what the old weights computed
    (the prefix cache, LoRA, encoder and multimodal caches, as vLLM's own `reload_weights` resets them). A stream
    that fails part-way raises with the session closed: by the worker when a bucket failed in it, by `finish`
    when the failure was on this side (the iterator), so no session is ever left open."""
    session = {"open": True}

    def send(bucket: list[tuple[str, torch.Tensor]]) -> None:
        try:
            llm.collective_rpc("update_weights", args=({"named_tensors": bucket},))
        except BaseException:
            session["open"] = False
            raise

    llm.collective_rpc("start_weight_update")
    try:
        bucket, size = [], 0
        for name, tensor in named_tensors:
            if bucket and bucket_bytes is not None and size + tensor.nbytes > bucket_bytes:
                send(bucket)
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.nbytes
        send(bucket)
    finally:
        if session["open"]:
            llm.collective_rpc("finish_weight_update")
        llm.collective_rpc(_reset_lora_state)
    llm.reset_prefix_cache()
    # image embeddings computed with the old weights: dropped on both sides, the scheduler's record of them and the
    # workers' tensors (a worker-only reset left the scheduler sending requests to a cache that was empty:
    # "Encoder cache miss"); the processor cache likewise on the sender's and the receivers' side
    llm.llm_engine.reset_encoder_cache()
    llm.reset_mm_cache()


def _reset_lora_state(worker) -> None:
    worker.model_runner.reset_lora_state()


register()
from relayrl.rollout.vllm_tp import TPWeightLoader as RankExtension  # noqa: E402, F401 - the ranks' worker extension
