"""statehold: checkpoint storage that owns its files, for stateful PySpark pipelines."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statehold.tools.locations import Location

__version__ = "0.1.0"


def open(uri: str, *, ha: str | None = None, **storage_options: object) -> Location:  # noqa: A001
    """The location at `uri`, of the kind it is: a `statehold.tools.locations.JobLocation`
    (a statehold job directory, or ``.../chk-N`` / ``.../savepoints/NAME`` in one; `ha`:
    its HA store, default the one it records) or a
    `statehold.spark_checkpoints.SparkLocation` (a query's ``checkpointLocation``); an
    `UnknownLocationError` for anything else. `storage_options`: the storage's (S3, Azure
    credentials and endpoints). Both have ``listing``, ``inspect``, ``verify``, ``du``,
    ``history``, ``gc`` and ``copy``, with one result model each."""
    from statehold.tools.locations import open_location

    return open_location(uri, ha=ha, **storage_options)


def __getattr__(name: str) -> object:
    # `statehold.JobLocation`, `.SparkLocation`, `.UnknownLocationError`: imported when
    # asked for, so `import statehold` stays light (an executor imports no tool).
    if name in ("JobLocation", "UnknownLocationError"):
        from statehold.tools import locations

        return getattr(locations, name)
    if name == "SparkLocation":
        from statehold.spark_checkpoints.api import SparkLocation

        return SparkLocation
    raise AttributeError(f"module 'statehold' has no attribute {name!r}")
