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
(an update outside a session, two sessions at once) that a GPU push runs.

With `sync.transport=broadcast` the workers take the push themselves: at `init_weight_transfer_engine` each of an
engine's T workers joins the weight-sync group (relayrl/sync/group.py: gloo here, NCCL on a GPU)
at rank `rank_offset` + its own rank, and each `update_weights` receives that push's buckets from the learner's
broadcast, verifies their checksums and loads them: the bytes go from the learner straight into every worker (vLLM's
`nccl` engine's route), not through the engine's process and vLLM's RPC ring. We keep our own engine rather than
vLLM's `nccl` because that one receives through PyNccl, CUDA only: with ours the CPU suite runs, under the strict
group's device checks, the worker-side code a GPU push runs. The trainer side of `ipc` (CUDA IPC into a colocated
engine) is not wired yet (gpu_check.sh measures the IPC handoff by itself).

The engine registers itself when this module is imported: in the driver's process before an in-process engine
starts (relayrl/rollout/vllm_engine.py imports it after vLLM's environment is set), and in each rank process,
which imports `RankExtension` from here as its worker extension before the worker builds its weight-transfer
engine. Every call into this vLLM API lives here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

BACKEND = "relayrl"


@dataclass
class RelayrlInitInfo(WeightTransferInitInfo):
    """`member`: this worker's membership of the weight-sync group (relayrl/sync/transports.py `WorkerMembership`:
    `join(rank)`, `open(layout, checksum)`, `receive(version, buckets)`), for workers that receive the learner's
    broadcast themselves; None leaves the group (the tensors then come with each update)."""

    member: Any = None


@dataclass
class RelayrlUpdateInfo(WeightTransferUpdateInfo):
    named_tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # checkpoint names, full tensors
    version: int = -1  # >= 0: receive this version's buckets from the group instead (`buckets`: None = all)
    buckets: list[int] | None = None


class RelayrlTransferEngine(WeightTransferEngine[RelayrlInitInfo, RelayrlUpdateInfo]):
    """A layerwise reload fed by the tensors of each `update_weights` call."""

    init_info_cls = RelayrlInitInfo
    update_info_cls = RelayrlUpdateInfo
    supports_draft_weight_update = False
    member: Any = None  # the weight-sync group's membership, once joined

    def init_transfer_engine(self, init_info: RelayrlInitInfo) -> None:
        """Join the weight-sync group (a new membership replaces the last: after an engine restart every member joins
        again), or leave it."""
        self.shutdown()
        if init_info.member is not None:
            init_info.member.join(self.parallel_config.rank)
            self.member = init_info.member

    def open_receiver(self, layout, checksum: bool) -> None:
        """The receiving end for `layout` (relayrl/sync/buckets.py): a bucket at a time on the worker's device."""
        self._joined().open(layout, checksum)

    def _joined(self) -> Any:
        if self.member is None:
            raise RuntimeError("this worker is in no weight-sync group: init_weight_transfer_engine comes first")
        return self.member

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
        if update_info.version >= 0:  # from the learner's broadcast, each bucket verified before its tensors load
            named = self._joined().receive(update_info.version, update_info.buckets)
        else:
            named = iter(update_info.named_tensors)
        try:
            self.model.load_weights(named)  # pyright: ignore[reportCallIssue] - vLLM types the model as nn.Module
        except BaseException:
            for _ in named:  # the rest of the broadcast: the learner's side completes, and the error is this one
                pass
            raise
        unread = sum(1 for _ in named)
        if unread:
            raise RuntimeError(f"the model's load_weights returned with {unread} tensors of the push unread")

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        from relayrl.rollout.vllm_engine import _refresh_tied_lm_head

        finalize_layerwise_reload(self.model, self.model_config)
        _refresh_tied_lm_head(self.model)

    def shutdown(self) -> None:
        self.member = None


def register() -> None:
    # ValueError: this process has it already (the module imported twice: as a file and as a module)
    with contextlib.suppress(ValueError):
        WeightTransferEngineFactory.register_engine(BACKEND, RelayrlTransferEngine)


def stream_weights(llm, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None) -> None:
    """Checkpoint-named full tensors into every rank of `llm`, `bucket_bytes` per `update_weights` call (None: one
    call), through the worker's weight-update session (`run_session`)."""

    def updates() -> Iterator[dict[str, Any]]:
        bucket, size = [], 0
        for name, tensor in named_tensors:
            if bucket and bucket_bytes is not None and size + tensor.nbytes > bucket_bytes:
                yield {"named_tensors": bucket}
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.nbytes
        yield {"named_tensors": bucket}

    run_session(llm, updates())


def join_workers(llm, member) -> None:
    """Every worker of `llm` joins the weight-sync group through `member` (the learner and the other engines join at
    the same time: the group forms when all its members have); None: every worker leaves it."""
    llm.collective_rpc("init_weight_transfer_engine", args=({"member": member},))


def open_worker_receivers(llm, layout, checksum: bool) -> None:
    llm.collective_rpc(_open_receiver, args=(layout, checksum))


def receive_broadcast(llm, version: int, buckets: list[int] | None) -> None:
    """One push from the learner's broadcast into every worker of `llm`, in one weight-update session."""
    run_session(llm, iter([{"version": version, "buckets": buckets}]))


def run_session(llm, updates: Iterator[dict[str, Any]]) -> None:
    """Each update into every rank, between `start_weight_update` and `finish_weight_update`; then the caches that
    hold what the old weights computed (the prefix cache, LoRA, encoder and multimodal caches, as vLLM's own
    `reload_weights` resets them). A session that fails part-way raises with it closed: by the worker when an
    update failed in it, by `finish` when the failure was on this side (the iterator), so none is left open."""
    session = {"open": True}

    def send(update: dict[str, Any]) -> None:
        try:
            llm.collective_rpc("update_weights", args=(update,))
        except BaseException:
            session["open"] = False
            raise

    llm.collective_rpc("start_weight_update")
    try:
        for update in updates:
            send(update)
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


def _open_receiver(worker, layout, checksum: bool) -> None:
    worker.weight_transfer_engine.open_receiver(layout, checksum)


register()
from relayrl.rollout.vllm_tp import TPWeightLoader as RankExtension  # noqa: E402, F401 - the ranks' worker extension
