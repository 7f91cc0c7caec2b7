"""LoRA weight sync and learner memory: adapter vs merged vs full fine-tuning, on a >= 20M-parameter tiny Llama.

    .venv/bin/python benchmarks/lora_sync.py [--hidden 512 --layers 8 --rank 16 --repeats 5]

One vLLM engine (serving adapters) takes every push, through the production path: the learner's
`named_weights()` for the mode (adapter tensors / merged W + s*B@A / the full weights), packed into the shm
transport's buckets with their checksums (the Ray path's sender side), then verified and loaded by the
engine (`load_weights`: a new adapter per version, or `reload_weights` of the base). Printed per mode: the
bytes a push moves, the sender's pack+checksum seconds, the engine's receive+load seconds, the total, and
each as a ratio to full fine-tuning's measured in the same run (medians of `--repeats` pushes).
Learner memory: bytes of every tensor the learner holds at an optimizer step's end, before the gradients
are freed (weights, gradients, AdamW moments, the KL reference), with and without LoRA, beside the
planner's prediction.
Simplifications: one process (no second actor), CPU fp32; the adapter's values are random (the cost of a
push does not depend on them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from relayrl.placement.sections import learner_settings

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402


def build_model(out: str, hidden: int, layers: int) -> int:
    from relayrl.models.tiny import build_tiny

    texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(10)] + [" "]
    heads = hidden // 64
    model, _ = build_tiny(texts, out, hidden=hidden, layers=layers, heads=heads, intermediate=hidden * 8 // 3)
    return sum(p.numel() for p in model.parameters())


def overrides_for(model_dir: str, rank: int | None, mode: str | None, kl: bool = True) -> list[str]:
    overrides = [f"model.path={model_dir}", "rollout.engine=vllm", "train.lr=1e-4", "rollout.n=2"]
    overrides += ["rollout.prompts_per_step=2", f"algorithm.kl.coef={0.1 if kl else 0}"]
    if rank:
        overrides += [f"model.lora.rank={rank}", f"model.lora.alpha={2 * rank}", f"sync.lora={mode}"]
    return overrides


def learner_for(model_dir: str, rank: int | None, mode: str | None, kl: bool = True):
    from relayrl.config import load_config
    from relayrl.learner.policy import PolicyLearner

    return PolicyLearner(learner_settings(load_config(None, overrides_for(model_dir, rank, mode, kl))))


def one_update(learner) -> None:
    """One optimizer step on a tiny synthetic batch: the optimizer state then exists (memory is measured)."""
    from relayrl.learner.batching import make_experience
    from relayrl.types import Prompt, Rollout, Score

    prompt = Prompt(id="p", text="", token_ids=[5, 6, 7, 8])
    rollouts = [Rollout(prompt, i, [9, 10, 11], "", [-1.0] * 3, "stop", [0] * 3) for i in range(2)]
    exp = make_experience(rollouts, [Score(1.0), Score(0.0)], pad_id=0)
    exp.advantages = torch.tensor([1.0, -1.0])[:, None] * exp.loss_mask
    learner.fill_logprobs(exp)
    learner.update(exp)


def held_bytes(learner) -> int:
    """Bytes of every distinct tensor the learner holds: weights, gradients, AdamW state, the reference."""
    seen, total = set(), 0
    tensors = list(learner.model.parameters()) + list(learner.model.buffers())
    tensors += [p.grad for p in learner.model.parameters() if p.grad is not None]
    tensors += [t for state in learner.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    if learner.reference is not None:
        tensors += list(learner.reference.parameters())
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


class Pusher:
    """One mode's shm sender and receiver, created once and reused every push (as a run does: fresh shared
    memory pays its first-touch page faults)."""

    def __init__(self, learner):
        from relayrl.sync.buckets import layout_of
        from relayrl.sync.transports import make_receiver, make_sender

        self.learner = learner
        layout = layout_of(learner.named_weights(), 64, "fp32")
        self.sender = make_sender("shm", layout, True, owner=os.getpid())
        self.receiver = make_receiver("shm", layout, True)

    def push(self, engine, version: int) -> tuple[int, float, float]:
        """(bytes, sender pack+checksum s, engine receive+load s) of one push."""
        start = time.perf_counter()
        manifest = self.sender.send(self.learner.named_weights(), version)
        sent = time.perf_counter()
        tensors = self.receiver.receive(manifest)
        if self.learner.sync_mode == "adapter":
            engine.load_weights(tensors, version)
        else:  # merged or full: the base's own weights are replaced (the adapter engine takes those too)
            engine.adapters.current = None
            engine.load_base_weights(tensors)
        return manifest.nbytes, sent - start, time.perf_counter() - sent

    def close(self) -> None:
        self.receiver.close()
        self.sender.close()


def measure(args) -> None:
    from relayrl.config import load_config
    from relayrl.models.shape import load_shape
    from relayrl.placement.sections import engine_settings
    from relayrl.planner.estimate import adapter_params
    from relayrl.rollout.vllm_engine import VLLMEngine

    model_dir = tempfile.mkdtemp(prefix="lora_sync_model_")
    params = build_model(model_dir, args.hidden, args.layers)
    modes = {"adapter": learner_for(model_dir, args.rank, "adapter")}
    modes["merged"] = learner_for(model_dir, args.rank, "merged")
    modes["full"] = learner_for(model_dir, None, None)
    memory = {}
    for name, learner in modes.items():  # measured at the peak: after the optimizer step, gradients still held
        hook = learner.optimizer.register_step_post_hook(
            lambda *_, n=name, le=learner: memory.update({n: held_bytes(le)})
        )
        one_update(learner)
        hook.remove()
    engine = VLLMEngine(
        model_dir,
        64,
        0,
        adapter=engine_settings(load_config(None, overrides_for(model_dir, args.rank, "adapter"))).adapter(),
    )
    rows, version = {}, 0
    for name, learner in modes.items():
        pusher, samples = Pusher(learner), []
        for _ in range(args.repeats + 1):  # the first push maps the shared memory: not counted
            version += 1
            samples.append(pusher.push(engine, version))
        pusher.close()
        rows[name] = (samples[0][0], *(statistics.median(s[i] for s in samples[1:]) for i in (1, 2)))
    adapter = adapter_params(load_shape(model_dir), args.rank)
    report(params, adapter, args, rows, memory)
    generation_cost(engine, modes["adapter"], version + 1)


def generation_cost(engine, learner, version: int) -> None:
    """What serving the adapter costs the rollout: the same sampled batch with the adapter and with the merged
    weights as the base (vLLM's LoRA kernels vs plain matmuls), medians of 3."""
    from relayrl.models.lora import merged_tensors
    from relayrl.types import Prompt, Sampling

    prompts = [Prompt(id=str(i), text="", token_ids=[4 + i % 8, 5, 6, 7]) for i in range(32)]
    sampling = Sampling(n=1, temperature=1.0, max_tokens=32, seed=0)
    engine.load_weights(learner.named_weights(), version)

    def seconds() -> float:
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            engine.generate(prompts, sampling, version)
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    with_adapter = seconds()
    engine.adapters.current = None
    engine.load_base_weights(merged_tensors(learner.model))
    merged = seconds()
    print(f"\ngenerate 32 prompts x 32 tokens: adapter {with_adapter:.3f} s, merged base {merged:.3f} s ", end="")
    print(f"({with_adapter / merged:.2f}x)")


def report(params: int, adapter: int, args, rows: dict, memory: dict) -> None:
    print(f"model: tiny Llama, {params / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers), fp32")
    print(f"LoRA rank {args.rank}, all-linear: A = {adapter / 1e6:.2f}M parameters ({adapter / params:.2%} of P)")
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}\n")
    full_bytes, full_total = rows["full"][0], rows["full"][1] + rows["full"][2]
    print("| push | bytes | pack+checksum s | receive+load s | total s | bytes vs full | total vs full |")
    print("|---|---|---|---|---|---|---|")
    for name, (nbytes, send, load) in rows.items():
        total = send + load
        print(
            f"| {name} | {nbytes / 2**20:.2f} MiB | {send:.4f} | {load:.4f} | {total:.4f} | "
            f"{nbytes / full_bytes:.4f}x | {total / full_total:.3f}x |"
        )
    print("\nlearner memory at the optimizer step (weights + grads + AdamW + KL reference), measured vs planner:")
    predicted = {"full": params * 16 + params * 4, "lora": params * 4 + adapter * 16}
    print(f"  full fine-tuning: {memory['full'] / 2**20:.1f} MiB (planner {predicted['full'] / 2**20:.1f} MiB)")
    print(f"  LoRA (adapter):   {memory['adapter'] / 2**20:.1f} MiB (planner {predicted['lora'] / 2**20:.1f} MiB)")
    print(f"  ratio LoRA / full: {memory['adapter'] / memory['full']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    measure(parser.parse_args())


if __name__ == "__main__":
    main()
