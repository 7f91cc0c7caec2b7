"""A verifiers taskset's tasks as prompt rows: `data.train: verifiers:TASKSET?key=value&...` (and `data.eval`,
`relayrl data check`: anywhere a prompt file goes; relayrl/envs/verifiers_env.py runs the environment itself).

The options are the taskset config's fields (each value read as YAML, as reasoning_gym's are), validated by the
taskset's own pydantic config: an unknown one fails naming it. A row carries its task's wire data
(`verifiers_task`, from which a `verifiers:TASKSET` trajectory rebuilds the `Task`), the prompt (`prompt`, or
`messages` with the task's system prompt) and the task's other non-default fields as columns (`answer`...), so a
`reward.fn` can read them too. Left out: infinite tasksets (a dataset here is materialised once).
"""

from __future__ import annotations

from typing import Any

from relayrl.errors import DataError

PREFIX = "verifiers:"
INSTALL = "pip install --no-deps -r requirements/cpu.lock (or the `verifiers` extra: pip install 'relayrl[verifiers]')"


def is_spec(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def one_line(err: BaseException) -> str:
    """`Type: message` on one line (pydantic's and verifiers' messages span several)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {' '.join(line.strip() for line in text)}" if text else type(err).__name__


class VerifiersRows:
    """A taskset's tasks as prompt rows, in the shape relayrl/data/rows.py's readers have (`len`, `read`, `path`)."""

    def __init__(self, spec: str):
        from relayrl.data.reasoning_gym import parse_spec

        try:
            import verifiers.v1  # noqa: F401 - its loaders below
        except ImportError:
            raise DataError(f"{spec!r} needs the verifiers package, which is not installed: {INSTALL}") from None
        self.path = spec
        name, options = parse_spec(spec, PREFIX)
        try:
            from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

            taskset = load_taskset(taskset_config_type(name).model_validate({**options, "id": name}))
            if not taskset.bounded:
                raise DataError(f"{spec!r}: the taskset is infinite (INFINITE); give a finite one as data")
            self.tasks = list(taskset)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - no such taskset, options its config refuses, its load() raising
            raise DataError(f"{spec!r}: {one_line(err)}") from None

    def __len__(self) -> int:
        return len(self.tasks)

    def read(self, i: int) -> tuple[str, dict[str, Any]]:
        data = self.tasks[int(i)].data
        wire = data.model_dump(mode="json", exclude_none=True)
        row: dict[str, Any] = {"verifiers_task": wire}
        if isinstance(data.prompt, str) and not data.system_prompt:
            row["prompt"] = data.prompt
        else:
            system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
            prompt = wire.get("prompt", [])
            row["messages"] = system + ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)
        for key, value in data.model_dump(mode="json", exclude_defaults=True).items():  # answer, ...: columns
            if key not in ("prompt", "system_prompt", "idx"):
                row.setdefault(key, value)
        return f"{self.path}:row {i}", row
