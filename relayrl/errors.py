"""User-facing errors: one class per kind of user mistake, each message naming the file, row, key or sample.

The CLI prints these as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""

import contextlib


class RelayError(Exception):
    """Base of every error a user can cause and fix."""


class ConfigError(RelayError):
    """A config key is unknown, mistyped or out of range."""


class DataError(RelayError):
    """A dataset file or row is malformed."""


class RewardError(RelayError):
    """A reward function raised or returned something that is not a finite number."""


class ModelError(RelayError):
    """A model path or checkpoint cannot be used."""


class SyncError(RelayError):
    """Weights did not reach an engine intact (checksum mismatch, layout change, transport failure)."""


class EnvError(RelayError):
    """An environment (env.fn) cannot be loaded, or returned something that is not an observation or a Step."""


class PlacementError(RelayError):
    """The roles cannot be placed on the cluster, or a role's actor died or missed its deadline."""


class RoleFailure(PlacementError):
    """A role's actor died or missed its deadline (engines and the learner may be restarted). `died`: the actor is
    gone; `hung`: it missed its deadline, or its collective failed because a peer did; neither: it raised (an error
    a restart would meet again)."""

    def __init__(self, message: str, role: str, died: bool, hung: bool = False):
        super().__init__(message)
        self.role, self.died, self.hung = role, died, hung


class RelayWarning(UserWarning):
    """A setting or input that works but probably not as meant (printed as `relayrl: warning: ...`)."""


class ConfigWarning(RelayWarning):
    """A config setting that has no effect in the chosen mode, or a path that exists nowhere it was looked for."""


class DataWarning(RelayWarning):
    """Input data that loads but loses something (characters the tokenizer cannot write)."""


def install_warning_format() -> None:
    """Print relayrl's warnings as one line, `relayrl: warning: MESSAGE`, on stderr (other warnings unchanged).

    The CLI calls this once; a library user keeps Python's own format unless they call it too. Filters
    (`-W error`, `warnings.catch_warnings`) still apply first: this only changes how a shown warning looks.
    """
    import sys
    import warnings

    shown = warnings.showwarning
    if getattr(shown, "_relayrl", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, RelayWarning):
            return shown(message, category, filename, lineno, file, line)
        with contextlib.suppress(OSError):  # as warnings' own: a closed stderr must not turn a warning into a crash
            print(f"relayrl: warning: {message}", file=file or sys.stderr)

    show._relayrl = True
    warnings.showwarning = show
