"""The errors of Spark checkpoint locations (one family with all of statehold's)."""

from __future__ import annotations

from statehold.errors import StateholdError


class SparkCheckpointError(StateholdError):
    """A Spark checkpoint location cannot be read, or the operation cannot be done on it
    as asked; the message says which file and why, in one line."""


class NotASparkCheckpointError(SparkCheckpointError):
    """The location holds no Spark checkpoint (no ``metadata``, ``offsets/`` or
    ``commits/``)."""


class StateSchemaUnreadable(SparkCheckpointError):
    """A store's key and value schemas cannot be read from the location (no schema file,
    or one statehold cannot read): the caller can give them instead."""
