"""Config warnings (`ConfigWarning`): a setting that cannot take effect, a path found in no directory, ...

While a config loads, `warn` only gathers: the rules that warn run at various depths (inside pydantic's
validators, in the resolution and effect checks), so `load_config` issues what was gathered once it is done, at
the line of its own caller (`stacklevel`). Outside a load, `warn` issues at once, `stacklevel` frames up from
its caller as `warnings.warn` counts them (2, the default: the line that called the function calling `warn`).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

from relayrl.errors import ConfigWarning

_gathering: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("config_warnings", default=None)


def warn(message: str, stacklevel: int = 2) -> None:
    """A ConfigWarning: gathered during a load (see the module docstring), else issued `stacklevel` frames up."""
    gathered = _gathering.get()
    if gathered is not None:
        gathered.append(message)
    else:
        warnings.warn(message, ConfigWarning, stacklevel=stacklevel + 1)


@contextlib.contextmanager
def gathered(stacklevel: int) -> Iterator[None]:
    """Gather the warnings of the block and issue them when it ends (raising or not), each once, at the frame
    `stacklevel` above the function that holds the `with` (1: that function's caller)."""
    token = _gathering.set([])
    try:
        yield
    finally:
        messages = _gathering.get() or []
        _gathering.reset(token)
        for message in dict.fromkeys(messages):
            warnings.warn(message, ConfigWarning, stacklevel=stacklevel + 3)  # this frame, contextlib's, the holder
