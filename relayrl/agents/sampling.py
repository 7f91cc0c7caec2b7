"""The run's sampling against an agent's: the fields an agent sends that would change the distribution sampled from
(temperature, max_tokens, stop, ...) are the run's rollout.* settings' to decide, so that the learner's log-probs
are those of the distribution that sampled; each differing field is warned about once per run."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from relayrl.errors import ConfigWarning


@dataclass
class RunSampling:
    """What the run samples with, to tell an agent's differing sampling fields apart (warned once each)."""

    values: dict[str, Any] = field(default_factory=dict)  # field -> the run's value
    warned: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def warn_overridden(spec: str, run: RunSampling, overridden: dict[str, Any]) -> None:
    """One warning per field per run for an agent's sampling field that differs from the run's (`overridden`: the
    fields a request set that the run's rollout.* settings decide, with the agent's values)."""
    for name, value in overridden.items():
        if name in run.values and _same(run.values[name], value):
            continue
        with run.lock:
            if name in run.warned:
                continue
            run.warned.add(name)
        ours = f"the run's {run.values[name]!r}" if name in run.values else "the run's rollout.* settings"
        warnings.warn(
            f"env.agent={spec!r}: the agent's {name}={value!r} is overridden by {ours}: the tokens are "
            "sampled as rollout.* says, so that the learner's log-probs are those of the distribution that "
            "sampled (warned once per run)",
            ConfigWarning,
            stacklevel=2,
        )


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, tuple | list) or isinstance(theirs, tuple | list):
        return list(ours or ()) == list(theirs if isinstance(theirs, list | tuple) else [theirs])
    return ours == theirs
