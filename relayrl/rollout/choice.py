"""`rollout.engine: auto`: which rollout engine a run gets, and why, decided once when the config is resolved
(`relayrl.build.resolve`, before the run is built).

HF `generate` for a model under the measured CPU crossover (HF_BELOW_PARAMS), vLLM otherwise: on a GPU, under
`placement.mode=ray` (its engine actors run vLLM), and when the model's size cannot be read. The size is config
arithmetic on the model directory's config.json (`relayrl/models/shape.py`); no weights are read. The reason is
one line that the resolved config prints beside `engine: auto` (`relayrl.config.dump_config`).
Leaves out: choosing by the rollout's length or batch (the crossover was measured on the demo's short answers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

# The CPU crossover. Below it vLLM's per-step Python work (scheduling, per-request output processing, ~15 ms a
# step) outweighs the model's compute. Measured by the benchmark suite (`make bench`, benchmarks/README.md,
# "Figures", 2-core CPU, 2026-11-29): regime (a), a 0.6M-param model writing 3-6 tokens, steps in 0.139 s with
# HF generate in the learner's process vs 0.199 s with vLLM (0.58x vs 0.81x of TRL's step; rollout 64 vs ~100 ms).
# On the same machine a 107M model generates ~5x faster on vLLM (320 vs 62 tok/s, 64 prompts x 8 x 128 tokens).
# 5M sits between the two measured points, as the planner's advice does (relayrl/planner/report.py).
HF_BELOW_PARAMS = 5_000_000


@dataclass(frozen=True)
class EngineChoice:
    engine: Literal["vllm", "hf"]  # what `rollout.engine` becomes
    reason: str  # one line: the model's size (or what decided) against the rule

    def as_asked(self, engine: str | None) -> str | None:
        """What a dump writes for `rollout.engine`: `auto` while it still holds this choice."""
        return "auto" if engine == self.engine else engine

    def noted(self, dumped_yaml: str) -> str:
        """`dump_config`'s text with the choice and its reason beside `engine: auto` (the section's first key)."""
        line = "\nrollout:\n  engine: auto\n"
        return dumped_yaml.replace(line, f"{line[:-1]}  # auto chose {self.engine}: {self.reason}\n", 1)


def choose_engine(model_path: str, placement: str, cuda: Callable[[], bool] | None = None) -> EngineChoice:
    """The engine for `rollout.engine: auto`. `cuda`: whether a GPU is usable (default torch.cuda.is_available,
    asked only for a model under the crossover)."""
    if placement == "ray":
        return EngineChoice("vllm", "placement.mode=ray runs vLLM engine actors")
    params, unknown = count_params(model_path)
    if params is None:
        return EngineChoice("vllm", f"model size unknown ({unknown}); vLLM is the engine for a model of any size")
    size = f"{_millions(params)} params ({Path(model_path) / 'config.json'})"
    if params >= HF_BELOW_PARAMS:
        return EngineChoice("vllm", f"{size}, at or over the {_millions(HF_BELOW_PARAMS)}-param crossover")
    if (cuda or _cuda_available)():
        return EngineChoice("vllm", f"{size}, but a GPU is available: vLLM at every size there")
    return EngineChoice(
        "hf", f"{size}, under the {_millions(HF_BELOW_PARAMS)}-param crossover on CPU, where HF generate is faster"
    )


def count_params(model_path: str) -> tuple[int | None, str]:
    """(parameters, "") from `model_path`/config.json, or (None, why not)."""
    path = Path(model_path) / "config.json" if model_path else None
    if path is None or not path.is_file():
        return None, f"no config.json in model.path={model_path!r}"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return None, f"{path} is not readable JSON: {err}"
    from relayrl.errors import ModelError
    from relayrl.models.shape import count_params as count  # Llama-family arithmetic, as `relayrl plan` counts

    if "vision_config" in raw:  # a vision-language model: counted built on the meta device, as the planner does
        from transformers import AutoConfig

        from relayrl.models.shape import count_vision_language_params

        return count_vision_language_params(AutoConfig.from_pretrained(model_path)).total, ""
    config = SimpleNamespace(**{"tie_word_embeddings": False, "model_type": None, **raw})
    try:
        return count(config), ""
    except ModelError:
        return None, f"cannot count the parameters of model_type={config.model_type!r}"
    except (AttributeError, TypeError) as err:
        return None, f"{path} lacks a size field ({err})"


def _millions(params: float) -> str:
    return f"{params / 1e9:.3g}B" if params >= 1e9 else f"{params / 1e6:.3g}M"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
