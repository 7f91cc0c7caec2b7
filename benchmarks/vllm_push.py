"""A weight push into an in-process vLLM engine: vLLM's weight-update session through relayrl's weight-transfer
engine (relayrl/rollout/vllm_transfer.py, what every push runs) against vLLM's own `reload_weights` on the same
engine and the same tensors (the path before it), measured in the same run.

    .venv/bin/python benchmarks/vllm_push.py [--hidden 512 --layers 8 --repeats 7]

Printed: the model's parameters and bytes, the median seconds of each path over `--repeats` pushes (alternating,
so that the machine's load drifts onto both alike), and the session's time as a ratio to reload_weights'. After
each push the engine's prompt log-probs are checked against the pushed model's (both paths must load the same
weights). CPU fp32, one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    from relayrl.models.tiny import build_tiny
    from relayrl.rollout.vllm_engine import VLLMEngine, _refresh_tied_lm_head

    with tempfile.TemporaryDirectory() as out:
        texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(10)] + [" "]
        hidden = args.hidden
        model, _ = build_tiny(
            texts, out, hidden=hidden, layers=args.layers, heads=hidden // 64, intermediate=hidden * 8 // 3
        )
        engine = VLLMEngine(out, max_model_len=64, seed=0)
        named = [(n, p.detach().clone()) for n, p in model.named_parameters()]
        ids = [1, 5, 6, 7, 8]

        def session():
            engine.load_base_weights(iter(named))

        def reload():
            worker = engine._worker()
            worker.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
            _refresh_tied_lm_head(worker.model_runner.get_model())
            engine.llm.reset_prefix_cache()

        expected = torch.tensor(engine.prompt_logprobs(ids))
        times: dict[str, list[float]] = {"session": [], "reload_weights": []}
        for _ in range(args.repeats):
            for name, push in (("session", session), ("reload_weights", reload)):
                started = time.perf_counter()
                push()
                times[name].append(time.perf_counter() - started)
                torch.testing.assert_close(torch.tensor(engine.prompt_logprobs(ids)), expected, atol=1e-4, rtol=0)
        params = sum(p.numel() for p in model.parameters())
        session_s, reload_s = (statistics.median(times[k]) for k in ("session", "reload_weights"))
        print(f"model: {params / 1e6:.1f}M parameters, {params * 4 / 2**20:.0f} MiB fp32; {args.repeats} pushes each")
        print("| path | median s | vs reload_weights |\n|---|---|---|")
        print(f"| weight-update session (relayrl engine) | {session_s:.3f} | {session_s / reload_s:.2f}x |")
        print(f"| vLLM reload_weights | {reload_s:.3f} | 1.00x |")


if __name__ == "__main__":
    main()
