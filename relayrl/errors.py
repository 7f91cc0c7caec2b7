"""User-facing errors: one class per kind of user mistake, each message naming the file, row, key or sample.

The CLI prints these as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


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


class PlacementError(RelayError):
    """The roles cannot be placed on the cluster, or a role's actor died or missed its deadline."""
