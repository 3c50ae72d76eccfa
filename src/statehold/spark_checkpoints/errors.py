"""The errors of Spark checkpoint locations (one family with all of statehold's)."""

from __future__ import annotations

from statehold.errors import StateholdError


class SparkCheckpointError(StateholdError):
    """A Spark checkpoint location cannot be read, or the operation cannot be done on it
    as asked; the message says which file and why, in one line."""


class NotASparkCheckpointError(SparkCheckpointError):
    """The location holds no Spark checkpoint (no ``metadata``, ``offsets/`` or
    ``commits/``)."""
