"""What a run writes: `log` (the run directory, the progress bar, trackers, `log.samples`) and `checkpoint`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from relayrl.config.section import Section


class SamplesConfig(Section):
    every: int = Field(
        default=10,
        ge=0,
        description="Write some samples of every N-th step (and of the last) to "
        "<dir>/samples.jsonl: text, reward, advantage, versions, and the turns with each sampled token's "
        "learner-vs-engine log-prob gap (0 = never).",
    )
    max_per_step: int = Field(
        default=16, ge=1, description="Samples written per logged step: the step's first ones, whole groups first."
    )


class LogConfig(Section):
    dir: str = Field(
        default="runs/default",
        description="Run directory: config.yaml (resolved: input paths absolute), "
        "metrics.jsonl, model/. Relative to the working directory (saved absolute; one leading outside it warns).",
    )
    progress: bool = Field(default=True, description="Show a rich progress bar on the console.")
    save_model: bool = Field(default=True, description="Save the final policy with save_pretrained into <dir>/model.")
    samples: SamplesConfig = Field(default_factory=SamplesConfig, description="Per-sample logs (samples.jsonl).")
    backends: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="Extra trackers besides metrics.jsonl and the progress bar: tensorboard (<dir>/tensorboard), "
        "mlflow (sqlite store <dir>/mlflow/mlflow.db), wandb (offline run under <dir>/wandb).",
    )

    @model_validator(mode="after")
    def _check_backends_installed(self) -> LogConfig:
        """A backend's package is an optional extra: a missing one fails here, before any work is done."""
        import importlib.util

        modules = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic"), "wandb": ("wandb",)}
        for backend in self.backends:
            missing = [module for module in modules[backend] if importlib.util.find_spec(module) is None]
            if missing:
                raise ValueError(
                    f"log.backends={backend} needs {', '.join(missing)}, which is not installed: "
                    "pip install 'relayrl[track]' (or pip install --no-deps -r requirements/cpu.lock)"
                )
        return self


class CheckpointConfig(Section):
    every: int = Field(
        default=0, ge=0, description="Write a checkpoint every N steps into <log.dir>/checkpoints (0 = never)."
    )
    keep: int = Field(default=2, ge=1, description="How many of the newest checkpoints to keep.")
