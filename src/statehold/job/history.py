"""Checkpoint history: one small record per completed or aborted checkpoint, kept in the
job directory (``_job/history/``) so it travels with it and outlives the driver.

Each record is its own file, created with create-if-absent under a name that sorts by
checkpoint id, then epoch (``c<id>-e<epoch>-<outcome>-<hash of the content>.json``): a
zombie attempt and the current one never write the same file, and no object store needs
compare-and-set. Records are the `signed` format (JSON with a checksum, read within
bounds; never pickle). The newest `keep` records are kept; after every ``keep // 10``
writes the writer lists the folder and deletes what its pruning rule names, so at most
about ``keep * 1.1`` records exist. The rule is the deletion policy's
(`cleanup.policy.history_to_prune`), given by the writer's owner: what is deleted is
decided in one place, and this module knows only what a record's key looks like. A
failure to write history is logged, never fails a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field

from statehold import clock
from statehold.errors import StateholdError
from statehold.format import layout, signed
from statehold.format.metadata import KeyGroupState
from statehold.storage.base import AlreadyExistsError, Storage

log = logging.getLogger("statehold.job.history")

HISTORY_DIR: Final = f"{layout.JOB_DIR}/history"
DEFAULT_KEEP: Final = 100
FORMAT: Final = "statehold.job.history"
VERSION: Final = 1
#: Bytes of one record (a real one is under 1 KiB).
MAX_RECORD_BYTES: Final = 64 << 10

Count = Annotated[int, Field(ge=0, le=signed.MAX_ID)]
Seconds = Annotated[float, Field(ge=0, le=signed.MAX_TIMESTAMP, allow_inf_nan=False)]
Outcome = Literal["completed", "aborted"]
#: The history records among some keys beyond the newest `keep` (keys, keep -> doomed).
PruneRule = Callable[[Iterable[str], int], list[str]]

_RECORD_KEY = re.compile(
    rf"^{re.escape(HISTORY_DIR)}/c\d{{16}}-e\d{{16}}-[a-z]+-[0-9a-f]{{8}}\.json$"
)


class HistoryError(StateholdError):
    """A history record cannot be read."""


class HistoryRecord(BaseModel):
    """What one checkpoint did. Durations in seconds, sizes in bytes."""

    format: Literal["statehold.job.history"] = FORMAT
    version: signed.Version = VERSION
    job_id: signed.Name
    checkpoint_id: signed.Id
    epoch: signed.Id
    outcome: Outcome
    started_at: signed.Timestamp
    ended_at: signed.Timestamp
    #: begin to complete (or abort), on the driver
    duration: Seconds = 0.0
    #: the tasks' snapshots, summed over tasks (0 where the caller did not report it)
    snapshot_seconds: Seconds = 0.0
    #: the driver's `_metadata` and HA publish
    complete_seconds: Seconds = 0.0
    bytes_uploaded: signed.Size = 0
    files_uploaded: Count = 0
    bytes_reused: signed.Size = 0
    files_reused: Count = 0
    state_size: signed.Size = 0
    #: restored from the previous checkpoint by the tasks (not found on local disk)
    bytes_downloaded: signed.Size = 0
    files_downloaded: Count = 0
    keys: Count = 0
    rows: Count = 0
    #: the cleaner's files and folders not yet deleted, and its failed attempts so far
    cleanup_backlog: Count = 0
    cleanup_failures: Count = 0
    reason: Annotated[str, Field(max_length=1000)] | None = None


def record_key(record: HistoryRecord, data: bytes) -> str:
    """The record's file name; its unique part is a hash of its content (`data`), so
    the name is reproducible (a deterministic simulation replays it) and two writers
    of the same record write the same file."""
    unique = hashlib.sha256(data).hexdigest()[:8]
    return (
        f"{HISTORY_DIR}/c{record.checkpoint_id:016d}-e{record.epoch:016d}-"
        f"{record.outcome}-{unique}.json"
    )


def decode(data: bytes, key: str) -> HistoryRecord:
    return signed.decode(
        data, HistoryRecord, where=key, format_name=FORMAT, version=VERSION,
        what="history", error=HistoryError, max_bytes=MAX_RECORD_BYTES,
    )


def is_history_record(key: str) -> bool:
    """Is `key` a history record's (as `record_key` names them; not an interrupted write)?"""
    return _RECORD_KEY.match(key) is not None


def record_keys(storage: Storage) -> list[str]:
    """The history records' keys, oldest first (interrupted writes left out)."""
    return sorted(i.key for i in storage.list(HISTORY_DIR + "/") if is_history_record(i.key))


def read_history(storage: Storage, limit: int | None = DEFAULT_KEEP) -> list[HistoryRecord]:
    """The newest `limit` records (None: all), oldest first. A record that does not
    verify is skipped with a warning: history is for people, never load-bearing."""
    keys = record_keys(storage)
    if limit is not None:
        keys = keys[-limit:] if limit > 0 else []
    records = []
    for key in keys:
        try:
            records.append(decode(storage.read(key), key))
        except FileNotFoundError:
            continue  # pruned meanwhile
        except HistoryError as e:
            log.warning("%s", e)
    return records


def _figure(info: Mapping[str, Any], name: str) -> int:
    value = info.get(name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class Recorder:
    """Writes one attempt's records and keeps the folder bounded, deleting what `prune`
    (the deletion policy's rule) names. The caller (the Spark job) may add figures only it
    knows with `note` before the checkpoint ends."""

    def __init__(
        self,
        storage: Storage,
        job_id: str,
        epoch: int,
        keep: int = DEFAULT_KEEP,
        *,
        prune: PruneRule,
    ) -> None:
        self.storage = storage
        self.prune = prune
        self.job_id = job_id
        self.epoch = epoch
        #: records kept (0: write none)
        self.keep = keep
        self._notes: dict[int, dict[str, float]] = {}
        self._since_prune: int | None = None
        #: the last record written, for metrics
        self.last: HistoryRecord | None = None

    def note(self, checkpoint_id: int, **figures: float) -> None:
        """Figures for checkpoint N: rows, keys, snapshot_seconds, bytes_downloaded,
        files_downloaded."""
        self._notes.setdefault(checkpoint_id, {}).update(figures)

    def record(
        self,
        checkpoint_id: int,
        outcome: Outcome,
        started_at: float,
        acks: Mapping[str, Iterable[KeyGroupState]],
        cleaner: Any = None,
        *,
        complete_seconds: float = 0.0,
        reason: str | None = None,
    ) -> HistoryRecord | None:
        """Write the record of checkpoint N from its tasks' reports (operator -> states)
        and the cleaner's status. Never raises: history must not fail a checkpoint."""
        notes = self._notes.pop(checkpoint_id, {})
        for stale in [n for n in self._notes if n < checkpoint_id]:
            del self._notes[stale]
        try:
            ended = clock.now()
            infos = [s.info for states in acks.values() for s in states]
            figures: dict[str, Any] = {
                name: sum(_figure(i, name) for i in infos)
                for name in ("bytes_uploaded", "files_uploaded", "bytes_reused",
                             "files_reused", "state_size")
            }
            figures.update({k: v for k, v in notes.items() if k in HistoryRecord.model_fields})
            for name in ("rows", "keys", "bytes_downloaded", "files_downloaded"):
                figures[name] = int(figures.get(name, 0))
            record = HistoryRecord(
                job_id=self.job_id,
                checkpoint_id=checkpoint_id,
                epoch=self.epoch,
                outcome=outcome,
                started_at=started_at,
                ended_at=max(ended, started_at),
                duration=max(0.0, ended - started_at),
                complete_seconds=max(0.0, complete_seconds),
                cleanup_backlog=(cleaner.pending_keys + cleaner.pending_dirs) if cleaner else 0,
                cleanup_failures=cleaner.failures if cleaner else 0,
                reason=signed.one_line(reason, 1000) if reason else None,
                **figures,
            )
            self.last = record
            if self.keep > 0:
                data = signed.encode(record)
                with contextlib.suppress(AlreadyExistsError):  # the same record, written
                    self.storage.create_if_absent(record_key(record, data), data)
                self._prune()
            return record
        except Exception as e:  # history is for people: never fail the checkpoint
            log.warning("job %s: history of checkpoint %d not written: %s",
                        self.job_id, checkpoint_id, e)
            return None

    def _prune(self) -> None:
        if self._since_prune is not None and self._since_prune < max(1, self.keep // 10):
            self._since_prune += 1
            return
        self._since_prune = 1
        doomed = self.prune(record_keys(self.storage), self.keep)
        if doomed:
            self.storage.delete_many(doomed)


__all__ = [
    "DEFAULT_KEEP",
    "HISTORY_DIR",
    "HistoryError",
    "HistoryRecord",
    "PruneRule",
    "Recorder",
    "is_history_record",
    "read_history",
    "record_keys",
]
