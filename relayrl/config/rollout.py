"""The `rollout.*` section: the engine, the sampling, the engine's device settings and colocated sleep."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from relayrl.config.section import Section


class RolloutConfig(Section):
    engine: Literal["auto", "vllm", "hf"] = Field(
        default="auto",
        description="vllm, or hf (transformers generate). auto = hf under 5M params (config.json) on CPU, the measured "
        "crossover; else vllm (GPU, Ray too). Chosen at each load (resumes too), noted in the resolved config.",
    )
    n: int = Field(default=8, ge=1, description="Responses sampled per prompt (the GRPO group size).")
    prompts_per_step: int = Field(
        default=16, ge=1, description="Prompts per training step; rollout batch = prompts_per_step * n."
    )
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for training rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass (1 = off).")
    top_k: int = Field(default=-1, ge=-1, description="Sample among the k most likely tokens (-1 = off).")
    max_tokens: int = Field(default=64, ge=1, description="Longest response, in tokens.")
    min_tokens: int = Field(
        default=0,
        ge=0,
        description="Shortest response, in tokens: end-of-sequence and stop strings are "
        "ignored before it (decode-heavy benchmarks, length floors).",
    )
    stop: list[str] = Field(default_factory=list, description="Strings that end a response.")
    kv_cache_gib: float = Field(default=1.0, gt=0, description="vLLM CPU KV-cache size (VLLM_CPU_KVCACHE_SPACE), GiB.")
    prefix_caching: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="vLLM prefix caching. `auto`: on unless no sequence can fill one KV block (then it only "
        "costs hashing: ~15% of a short rollout on CPU, where blocks are 128 tokens).",
    )
    gpu_memory_utilization: float | Literal["auto"] = Field(
        default="auto",
        description="vLLM's share of its GPU's memory (GPU only): auto = 0.9 where the engine has its GPU alone, 0.5 "
        "beside a learner rank (what relayrl plan bills), less a judge reward's share on the same GPU; the choice "
        "is in the run's config dump (relayrl/rollout/memory.py).",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="The engine's weights and activations: auto = bfloat16 on a GPU that supports it, float16 on one "
        "that does not, float32 on CPU (where bf16 is 6-8x slower and its log-probs stray from fp32's by up to 0.2).",
    )
    enforce_eager: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="vLLM eager mode (no CUDA graphs or compilation): auto = on on CPU (compiling costs 40-95 s a "
        "start there and is not faster), off on a GPU.",
    )
    model_runner: Literal["auto", "v1", "v2"] = Field(
        default="auto",
        description="vLLM's model runner: auto = vLLM's own choice (V2 where Triton is installed, its GPU default; V1 "
        "otherwise, as on CPU, where the suite runs); v1 = the runner the CPU suite tests, a first GPU run's "
        "fallback (VLLM_USE_V2_MODEL_RUNNER=0); v2 needs Triton (a GPU build), refused at the engine's start "
        "without it.",
    )
    sleep: Literal["auto", "off", 1, 2] = Field(
        default="auto",
        description="Colocated memory time-sharing: after generating, the engine sleeps (vLLM sleep level 1 keeps "
        "its weights in CPU memory, 2 drops them: the next push reloads them) and wakes for the push, then its KV "
        "cache. auto = 2 (1 with sync.lora=adapter) for a colocated run on a GPU under train.schedule=sync; off "
        "otherwise (vLLM's CPU platform has no sleep mode; overlapped schedules generate while training).",
    )
    tensor_parallel: int = Field(
        default=1,
        ge=1,
        description="vLLM ranks per engine replica (T): each rank holds 1/T of every layer's heads; needs vLLM, "
        "T dividing the attention heads, and a core or GPU per rank (under ray an unset placement.engine_cpus "
        "becomes T; engine bundles reserve T GPUs).",
    )

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _a_share(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 < float(value) <= 1:
            raise ValueError(f"rollout.gpu_memory_utilization={value}: a share of the GPU in (0, 1], or auto")
        return value
