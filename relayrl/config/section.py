"""`Section`: the base of every config section: strict keys, validated assignment, and YAML's bare on/off read back
as the words they are; and the rule for relative input paths that the `model` and `data` keys state."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

INPUT_PATH_RULE = (
    "A relative path is taken against the config file's directory, else the working directory (an "
    "override's: the working directory); the saved config.yaml holds it absolute."
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_off(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare `on` / `off` as a boolean: a key whose values are the words `on`/`off` takes it back
        as the word (`rollout.prefix_caching: off`, `rollout.sleep: off`)."""
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if isinstance(value, bool) and field is not None and "off" in typing.get_args(field.annotation):
                data = {**data, name: "on" if value else "off"}
        return data
