"""A broadcast push into a two-rank vLLM engine: the workers receive the learner's buckets themselves (what
`sync.transport=broadcast` runs now: relayrl/rollout/vllm_transfer.py) against the route before it, where the
engine's process received the broadcast and streamed the tensors to its ranks over vLLM's RPC ring
(`load_weights_tp`). Same engine, same tensors, same bucket layout, measured in the same run.

    .venv/bin/python benchmarks/vllm_tp_push.py [--hidden 512 --layers 8 --repeats 5]

The learner is a thread of this process (rank 0 of a gloo group; one group per route); the engine's two ranks
are its child processes, one core each. Printed: the model's size, the median seconds of each route from the
first byte sent to the push landed (alternating, so the machine's load drifts onto both alike), and the ratio.
After each push the engine's prompt log-probs are checked against the pushed model's. CPU fp32.

Measured here (2 cores, 2026-12-05): into the workers 1.09x / 1.16x (25M parameters, 2 buckets of 64 MiB), 1.00x
(16 MiB buckets), 1.15x (100M parameters): no gain on a CPU, where the old route is a shared-memory copy and gloo
sends the bytes once per worker. The route exists for GPUs, where the old one took each byte device -> host ->
shared memory -> device per rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")

import torch  # noqa: E402

TIMEOUT_S = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()

    from relayrl.models.tiny import build_tiny
    from relayrl.rollout.vllm_engine import VLLMEngine
    from relayrl.rollout.vllm_tp import load_weights_tp
    from relayrl.sync.buckets import layout_of
    from relayrl.sync.group import join_group
    from relayrl.sync.remote import free_port
    from relayrl.sync.transports import Manifest, WorkerMembership, make_receiver, make_sender

    with tempfile.TemporaryDirectory() as out, ThreadPoolExecutor(2) as pool:
        texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(10)] + [" "]
        hidden = args.hidden
        intermediate = (hidden * 8 // 3 + 7) // 8 * 8  # split evenly over the two ranks
        model, _ = build_tiny(texts, out, hidden=hidden, layers=args.layers, heads=2, intermediate=intermediate)
        engine = VLLMEngine(out, max_model_len=64, seed=0, tensor_parallel=2)
        named = [(n, p.detach().clone()) for n, p in model.named_parameters()]
        layout = layout_of(named, args.bucket_mb, "fp32")
        ids = [1, 5, 6, 7, 8]

        def group(members: int, join_other):
            port = free_port()
            learner = pool.submit(join_group, "127.0.0.1", port, 0, members, TIMEOUT_S)
            join_other(port, members)
            return learner.result(TIMEOUT_S)

        # route 1: the two workers are ranks 1 and 2
        into_workers = group(
            3, lambda port, world: engine.join_weight_group(WorkerMembership("127.0.0.1", port, 1, world, TIMEOUT_S))
        )
        engine.open_weight_receivers(layout, True)
        sender_workers = make_sender("broadcast", layout, True, into_workers, TIMEOUT_S)
        # route 2: this process is rank 1 and forwards by RPC
        side: dict = {}
        via = group(2, lambda port, world: side.update(g=join_group("127.0.0.1", port, 1, world, TIMEOUT_S)))
        receiver = make_receiver("broadcast", layout, True, side["g"], TIMEOUT_S)
        sender_via = make_sender("broadcast", layout, True, via, TIMEOUT_S)

        def workers(version: int) -> None:
            sent = pool.submit(sender_workers.send, iter(named), version)
            engine.receive_broadcast(version)
            sent.result(TIMEOUT_S)

        def via_process(version: int) -> None:
            sent = pool.submit(sender_via.send, iter(named), version)
            load_weights_tp(engine.llm, receiver.receive(Manifest(version, None)))
            sent.result(TIMEOUT_S)

        expected = torch.tensor(engine.prompt_logprobs(ids))
        times: dict[str, list[float]] = {"workers": [], "process": []}
        for version in range(1, args.repeats + 1):
            for name, push in (("workers", workers), ("process", via_process)):
                started = time.perf_counter()
                push(version)
                times[name].append(time.perf_counter() - started)
                torch.testing.assert_close(torch.tensor(engine.prompt_logprobs(ids)), expected, atol=1e-4, rtol=0)
        params = sum(p.numel() for p in model.parameters())
        workers_s, process_s = (statistics.median(times[k]) for k in ("workers", "process"))
        buckets = len(layout.bucket_sizes)
        print(f"model: {params / 1e6:.1f}M parameters, {layout.nbytes / 2**20:.0f} MiB fp32 in {buckets} buckets; T=2")
        print(f"{args.repeats} pushes each, alternating")
        print("| route | median s | vs through the engine's process |\n|---|---|---|")
        print(f"| broadcast into both workers | {workers_s:.3f} | {workers_s / process_s:.2f}x |")
        print(f"| broadcast to the engine's process, RPC to its ranks | {process_s:.3f} | 1.00x |")
        for worker in engine.llm.llm_engine.engine_core.engine_core.model_executor.workers:  # pyright: ignore[reportAttributeAccessIssue]
            worker.death_writer.close()


if __name__ == "__main__":
    main()
