"""The mark of a rollback under way: ``_statehold_rollback`` at the location's top.

A rollback deletes many files, one at a time; a process killed or a storage error in
the middle leaves a location between two timelines. The mark is written before the
first delete and removed after the last, so whatever stops a rollback is seen
afterwards: `verify` reports it, `list` names it, savepoint, gc and relocate refuse, and
the same rollback run again finishes it (with the savepoint it kept the first time).
Spark ignores the file (it reads only ``metadata``, ``offsets/``, ``commits/``,
``sources/`` and ``state/``). So a query may be started again before the rollback is
finished, and run on: once a batch above the mark's target is committed after the mark
was written (by the storage's own clock, both mtimes from one listing), the mark is
*left behind*: nothing refuses because of it any more, `verify` says so, and any
rollback removes it (to the newest batch: nothing else changes).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from statehold.format.signed import load_json
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import ROLLBACK_MARKER
from statehold.spark_checkpoints.scan import Scan
from statehold.storage import Storage, StorageError

#: The newest version of the mark statehold writes and reads.
MARKER_VERSION = 1


class RollbackMarker(BaseModel):
    """What a rollback under way is doing, for the run that finishes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = MARKER_VERSION
    to_batch: int
    #: The newest committed batch before the rollback began.
    from_batch: int | None
    #: The savepoint of what was there before (None: nothing was removed from the logs).
    kept: str | None
    kept_batch: int | None
    #: The file sink whose log is rolled back too.
    sink: str | None = None
    started_at: float


def write_marker(storage: Storage, marker: RollbackMarker) -> None:
    try:
        storage.write(ROLLBACK_MARKER, marker.model_dump_json().encode())
    except StorageError as e:
        raise SparkCheckpointError(f"{ROLLBACK_MARKER}: cannot be written ({e})") from None


def read_marker(storage: Storage, present: bool) -> RollbackMarker | None:
    """The mark, where the listing has one (`present`); refused when unreadable or of a
    newer version (a rollback it cannot finish is not guessed at)."""
    if not present:
        return None
    try:
        doc = load_json(storage.read(ROLLBACK_MARKER), where=ROLLBACK_MARKER,
                        error=SparkCheckpointError)
    except StorageError as e:
        raise SparkCheckpointError(f"{ROLLBACK_MARKER}: cannot be read ({e})") from None
    version = doc.get("version") if isinstance(doc, dict) else None
    if isinstance(version, int) and version > MARKER_VERSION:
        raise SparkCheckpointError(
            f"{ROLLBACK_MARKER}: version {version}, statehold reads up to "
            f"{MARKER_VERSION} (written by a newer statehold? upgrade it)"
        )
    try:
        return RollbackMarker.model_validate(doc)
    except ValidationError as e:
        raise SparkCheckpointError(
            f"{ROLLBACK_MARKER}: not a rollback mark ({e.errors()[0]['msg']})"
        ) from None


def unfinished(marker: RollbackMarker, uri: str) -> str:
    """The one line that says a rollback is unfinished and how to finish it."""
    return (
        f"{ROLLBACK_MARKER}: a rollback to batch {marker.to_batch} was interrupted; finish "
        f"it by running it again (statehold rollback {uri} {marker.to_batch})"
    )


def left_behind(marker: RollbackMarker, found: Scan) -> bool:
    """Whether the query ran on after the mark: a batch above its target committed after
    the mark was written."""
    info = found.files.get(ROLLBACK_MARKER)
    return info is not None and any(
        batch > marker.to_batch and found.files[key].mtime > info.mtime
        for batch, key in found.commits.items()
    )


def unfinished_marker(storage: Storage, found: Scan) -> RollbackMarker | None:
    """The mark of a rollback still unfinished in the listing `found` (None: no mark, or
    one left behind)."""
    marker = read_marker(storage, ROLLBACK_MARKER in found.files)
    return None if marker is None or left_behind(marker, found) else marker


def refuse_unfinished(storage: Storage, found: Scan, what: str) -> None:
    """Refuse `what` while a rollback is unfinished (SparkCheckpointError)."""
    marker = unfinished_marker(storage, found)
    if marker is not None:
        raise SparkCheckpointError(f"cannot {what}: {unfinished(marker, storage.uri)}")
