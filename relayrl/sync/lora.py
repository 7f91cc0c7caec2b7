"""`sync.lora: auto`, resolved once before a run is built: which LoRA sync a run uses. The mode's rules (what
each consumer reads: `lora_sync_mode`, the engine's `adapter_spec`) are in relayrl/models/adapter_sync.py.

`adapter`: only the adapter's tensors travel; the vLLM engine registers each version as a new adapter
(relayrl/rollout/vllm_engine.py). `merged`: the learner sends W + scale * B @ A under the base's names and
any engine loads them as full weights. `auto`, resolved once by `relayrl.build.resolve` (so the learner and
every engine actor read the same answer): adapter on vLLM with a GPU; merged on CPU and on the HF engine, which
loads plain weights only.

Why merged on CPU: vLLM's CPU backend serves LoRA, but its LoRA kernels cost more in generation than the smaller
push saves. Measured on the demo (50 steps, rank 16, 2-core CPU, load ~10, 2026-11-30): 6.99 s a step with
`adapter` (generate 4.69 s) vs 3.32 s with `merged` (generate 0.78 s), the same held-out gain (0.600 -> 0.856);
32 prompts x 32 tokens generate in 8.9 s serving the adapter vs 5.1 s on the merged model. The push itself is
where `adapter` wins (25M-param model: 4.75 MiB in 0.020 s vs 96 MiB in 1.13 s, benchmarks/lora_sync.py).
"""

from __future__ import annotations

from typing import Literal


def resolve_lora_auto(engine: str, cuda=None) -> Literal["adapter", "merged"]:
    """What `sync.lora: auto` becomes for `engine` (`rollout.engine`, chosen): `adapter` (vLLM on a GPU) or `merged`
    (see above). The builder sets it as set: the dump (and a resume) say which mode the run used."""
    if engine == "vllm":
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available
        return "adapter" if cuda() else "merged"
    return "merged"
