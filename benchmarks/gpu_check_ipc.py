"""gpu_check.py's `cuda_ipc` step: a weight handoff between two processes on one GPU, by CUDA IPC handle.

A producer process (spawned, torch.multiprocessing) holds the weights as flat bf16 buckets on the GPU (1 GiB in 4
buckets of 256 MiB); each round it changes them in place (an optimizer step), waits for the consumer's "go" and
puts the buckets on a queue: torch.multiprocessing sends a CUDA tensor as an IPC handle, never its bytes. The
consumer (this process) opens them and copies them into its own buffers (an engine's weights). A round's time
runs from the "go" to the copies' completion: the handle's pickling, its opening (cold: the first round; warm:
torch keeps opened handles, as a transport that reuses its buckets would) and the copy. Beside it: the same
bytes copied device to device in one process, and the ratio. Exactness: sampled elements equal the producer's.

CPU rehearsal: shared-memory CPU tensors (`share_memory_`, sent as file descriptors) and memcpy, 256 MiB.
What relayrl's future IPC transport would get; relayrl has no CUDA-IPC transport today (relayrl/sync/transports.py).
"""

from __future__ import annotations

import statistics
import time

BUCKETS = 4
ROUNDS = 6
SAMPLE = 64  # elements of each bucket compared exactly


def producer(numel: int, rounds: int, dev: str, to_consumer, from_consumer) -> None:
    import torch
    from gpu_check_common import set_threads

    set_threads()
    torch.manual_seed(0)
    buckets = [torch.randn(numel, dtype=torch.bfloat16, device=dev) for _ in range(BUCKETS)]
    if dev == "cpu":
        for bucket in buckets:
            bucket.share_memory_()
    for round_ in range(rounds):
        for bucket in buckets:
            bucket.add_(1)  # new weights, in place: the buffers (and their IPC handles) stay the same
        if dev == "cuda":
            torch.cuda.synchronize()
        samples = [bucket[:SAMPLE].to("cpu", copy=True) for bucket in buckets]
        to_consumer.put("ready")  # the round's weights are made: what follows is the handoff alone
        from_consumer.get()  # "go"
        to_consumer.put((round_, buckets, samples))
        from_consumer.get()  # "copied": the buckets may change again
    from_consumer.get()  # the consumer has dropped its views: the memory may go


def run_ipc() -> dict:
    import torch
    import torch.multiprocessing as mp
    from gpu_check_common import device, sync

    dev = device()
    cuda = dev == "cuda"
    total = (1 << 30) if cuda else (256 << 20)
    numel = total // BUCKETS // 2  # bf16
    ctx = mp.get_context("spawn")
    to_consumer, from_consumer = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=producer, args=(numel, ROUNDS, dev, to_consumer, from_consumer), daemon=True)
    proc.start()
    own = [torch.zeros(numel, dtype=torch.bfloat16, device=dev) for _ in range(BUCKETS)]  # touched: no first faults
    times, exact, previous = [], True, None
    try:
        for round_ in range(ROUNDS):
            assert to_consumer.get(timeout=300) == "ready"
            sync()
            start = time.perf_counter()
            from_consumer.put("go")
            got_round, received, samples = to_consumer.get(timeout=300)
            for mine, theirs in zip(own, received):
                mine.copy_(theirs)
            sync()
            times.append(time.perf_counter() - start)
            from_consumer.put("copied")
            exact &= got_round == round_ and all(
                torch.equal(mine[:SAMPLE].cpu(), sample) for mine, sample in zip(own, samples)
            )
            previous = received  # held until the next round's arrive: torch reuses an open handle while it lives
        del previous, received
        from_consumer.put("done")
        proc.join(timeout=60)
    finally:
        if proc.is_alive():
            proc.kill()
    # the same bytes, device to device in one process
    sources = [torch.randn(numel, dtype=torch.bfloat16, device=dev) for _ in range(BUCKETS)]
    copies = []
    for _ in range(ROUNDS):
        sync()
        start = time.perf_counter()
        for mine, source in zip(own, sources):
            mine.copy_(source)
        sync()
        copies.append(time.perf_counter() - start)
    warm = statistics.median(times[1:])
    local = statistics.median(copies[1:])
    gbps = {"cold": total / times[0] / 1e9, "warm": total / warm / 1e9, "local": total / local / 1e9}
    kind = "CUDA IPC" if cuda else "rehearsal: shared-memory CPU tensors"
    base = "device-to-device copy" if cuda else "memcpy"
    figure = (
        f"{kind}, {total >> 20} MiB bf16 in {BUCKETS} buckets: {gbps['warm']:.1f} GB/s warm ({gbps['cold']:.1f} "
        f"cold) vs {base} {gbps['local']:.1f} GB/s: ratio {gbps['warm'] / gbps['local']:.2f}"
    )
    checks = {"exact": exact, "producer_exited": proc.exitcode == 0}
    return {"checks": checks, "figure": figure, "details": {"GBps": gbps, "round_s": times, "copy_s": copies}}
