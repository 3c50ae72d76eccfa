"""What a location holds, decided in one place from its top level (one listing of one
level): a statehold job directory or a Spark checkpoint location. `statehold.open` and the
Spark location's own checks ask here; nothing else looks for these names to tell the two
kinds apart (tests/test_structure.py checks it).
"""

from __future__ import annotations

import re
from typing import Literal

from statehold.errors import StateholdError
from statehold.storage import Storage

LocationKind = Literal["job", "spark"]

#: A job directory's top level: its job records and HA store, checkpoints, savepoints.
_JOB_DIRS = ("_job", "_ha", "savepoints")
_CHK = re.compile(r"^chk-\d+$", re.ASCII)
#: A Spark checkpoint location's: the offsets and commit logs, the query's metadata.
_SPARK_DIRS = ("offsets", "commits")
_SPARK_FILE = "metadata"

#: What `UnknownLocationError` says each kind needs.
JOB_NEEDS = "not a statehold job directory (no _job/owner.json, _ha/, chk-*/ or savepoints/)"
SPARK_NEEDS = "not a Spark checkpoint location (no metadata, offsets/ or commits/)"


class AmbiguousLocationError(StateholdError):
    """The location's top level has both a job directory's names and a Spark checkpoint
    location's: statehold does not guess which it is."""


def location_kind(storage: Storage) -> LocationKind | None:
    """``"job"``, ``"spark"``, or None when the location holds neither (empty, absent, or
    something else); AmbiguousLocationError when it has the marks of both."""
    dirs, files = storage.list_top("")
    names = {d.rsplit("/", 1)[-1] for d in dirs}
    job = any(n in _JOB_DIRS or _CHK.match(n) for n in names)
    spark = any(n in _SPARK_DIRS for n in names) or any(f.key == _SPARK_FILE for f in files)
    if job and spark:
        raise AmbiguousLocationError(
            f"{storage.uri.rstrip('/')}: both a statehold job directory (_job/, _ha/, chk-*/ "
            "or savepoints/) and a Spark checkpoint location (metadata, offsets/, commits/) "
            "at its top level: refusing to guess which it is"
        )
    return "job" if job else "spark" if spark else None


__all__ = [
    "JOB_NEEDS",
    "SPARK_NEEDS",
    "AmbiguousLocationError",
    "LocationKind",
    "location_kind",
]
