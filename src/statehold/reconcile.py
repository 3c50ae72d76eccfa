"""Reconcile a job directory with its HA store: find and delete the orphans.

DESIGN invariant 7, stated once here. A file in the job directory is deleted exactly
when all of these hold:
- no retained checkpoint (named by the HA store) and no savepoint references it;
- it is ours: a data file, a checkpoint folder or an interrupted temp file (never the HA
  store's, the job entries, Spark's own `_spark/`, task-owned files, or files whose names
  statehold did not make — those are reported as foreign and left alone);
- it cannot belong to a live pending checkpoint: files of older epochs are never live;
  files of the live attempt's epoch written for a checkpoint after the newest retained
  one are live while that attempt runs (while its lease is fresh, see lease.py); so are
  young temp files and savepoint folders being written.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from pydantic import BaseModel

from statehold import layout
from statehold.cleaner import AsyncCleaner, Cleaner, Discard
from statehold.errors import StateholdError
from statehold.ha.base import HAStore
from statehold.jobresult import read_result
from statehold.layout import Kind
from statehold.lease import read_lease
from statehold.metadata import read_metadata, referenced_keys
from statehold.storage.base import FileInfo, Storage, StorageError, UnsafePathError

#: An interrupted write in ``_ha/`` or ``_job/`` younger than this may be a starting
#: attempt's claim, made before it has a lease to show.
BOOKKEEPING_TEMP_GRACE_SECONDS = 300.0
#: Temp files younger than this may be an atomic write still under way.
TEMP_GRACE_SECONDS = 3600.0

_NEVER_OURS_TO_DELETE = {Kind.HA, Kind.JOB, Kind.SPARK, Kind.TASKOWNED}
_LEASE = re.compile(rf"^{re.escape(layout.JOB_DIR)}/lease-e(?P<epoch>\d+)\.json$")


@dataclass(frozen=True, slots=True)
class LiveAttempt:
    """The running attempt: its epoch and the newest checkpoint id completed when the
    reconcile started; its files for later checkpoints may still be in flight."""

    epoch: int
    after_checkpoint: int


@dataclass
class ReconcilePlan:
    scanned: int = 0
    referenced: int = 0
    orphans: list[FileInfo] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    live: LiveAttempt | None = None

    @property
    def orphan_bytes(self) -> int:
        return sum(f.size for f in self.orphans)

    def discard(self) -> Discard:
        return Discard(keys=tuple(sorted(f.key for f in self.orphans)), reason="reconcile")


class ReconcileError(StateholdError):
    """The job directory does not match its HA store; nothing was deleted."""


def references(storage: Storage, ha: HAStore) -> tuple[int, dict[str, set[str]]]:
    """The HA store's epoch and, for each retained checkpoint's and savepoint's
    `_metadata`, every key it needs (itself included). A document that cannot be read
    raises MetadataError: nothing may be deleted on a guess."""
    state = ha.read()
    metadata_keys = [p.metadata for p in state.retained]
    metadata_keys += [
        info.key
        for info in storage.list(layout.SAVEPOINTS_DIR)
        if _parse(info.key).kind is Kind.SAVEPOINT_METADATA
    ]
    return state.epoch, {
        key: {key, *referenced_keys(read_metadata(storage, key), key)} for key in metadata_keys
    }


def referenced_by_job(storage: Storage, ha: HAStore) -> set[str]:
    """Every key a retained checkpoint or a savepoint needs, its `_metadata` included."""
    return set().union(*references(storage, ha)[1].values())


def _parse(key: str) -> layout.PathInfo:
    """A listed key statehold cannot even address is foreign, not an error."""
    try:
        return layout.parse(key)
    except UnsafePathError:
        return layout.PathInfo(key, Kind.UNKNOWN)


def live_attempt_from_lease(
    storage: Storage, ha: HAStore, now: float | None = None
) -> LiveAttempt | None:
    """For a reconcile run from outside the job: the current attempt, if its lease is
    fresh and the job has not ended."""
    state = ha.read()
    result = read_result(storage)
    if result is not None and result.state == "dirty":
        return None  # the job ended: nothing of it is in flight any more
    lease = read_lease(storage, state.epoch)
    if lease is None or not lease.alive(now):
        return None
    latest = state.latest.checkpoint_id if state.latest else -1
    return LiveAttempt(state.epoch, latest)


def plan(
    storage: Storage,
    ha: HAStore,
    live: LiveAttempt | None,
    *,
    now: float | None = None,
    temp_grace: float = TEMP_GRACE_SECONDS,
    bookkeeping_grace: float = BOOKKEEPING_TEMP_GRACE_SECONDS,
) -> ReconcilePlan:
    """List the job directory and decide, file by file (see the module docstring)."""
    now = time.time() if now is None else now
    epoch, refs = references(storage, ha)
    referenced: set[str] = set().union(*refs.values())
    result = ReconcilePlan(live=live)
    savepoints_with_metadata: set[str] = set()
    listed: list[tuple[FileInfo, layout.PathInfo]] = []
    for info in storage.list():
        parsed = _parse(info.key)
        listed.append((info, parsed))
        if parsed.kind is Kind.SAVEPOINT_METADATA and parsed.savepoint is not None:
            savepoints_with_metadata.add(parsed.savepoint)
    # A listing that lacks a file some checkpoint needs (one retained before and after
    # the listing, so not subsumed meanwhile) is not a listing to delete by.
    still_retained = {p.metadata for p in ha.read().retained}
    needed = set().union(*(keys for key, keys in refs.items() if key in still_retained))
    missing = sorted(needed - {info.key for info, _ in listed})
    if missing:
        raise ReconcileError(
            f"{storage.uri}: {len(missing)} file(s) a retained checkpoint references are "
            f"missing (first: {missing[0]}); nothing deleted — see `statehold verify`"
        )
    for info, parsed in listed:
        result.scanned += 1
        if info.key in referenced:
            result.referenced += 1
        elif parsed.kind in _NEVER_OURS_TO_DELETE:
            if _dead_bookkeeping(info, parsed.kind, epoch, live, now - bookkeeping_grace):
                result.orphans.append(info)
            continue
        elif parsed.kind is Kind.UNKNOWN:
            result.foreign.append(info.key)
        elif _is_live(parsed, info, live, savepoints_with_metadata, now, temp_grace):
            result.protected.append(info.key)
        else:
            result.orphans.append(info)
    return result


def _dead_bookkeeping(
    info: FileInfo, kind: Kind, epoch: int, live: LiveAttempt | None, written_before: float
) -> bool:
    """Leftovers of the HA store's and the job entries' own writes that nobody can use:
    the lease of an epoch older than the job's (it vouches for nothing; a failed delete
    in `Lease.start` leaves it), and, when no attempt is live, an interrupted atomic
    write in ``_ha/`` or ``_job/`` (a driver killed mid-write) once it is old enough
    not to be a starting attempt's claim. The current epoch's lease renewal is never
    touched: its thread may still be writing at job end."""
    if kind not in (Kind.HA, Kind.JOB):
        return False
    lease = _LEASE.match(info.key)
    if lease:
        return int(lease["epoch"]) < epoch
    name = info.key.rsplit("/", 1)[-1]
    return (
        live is None
        and layout.TEMP_MARKER in name
        and not name.startswith(f".lease-e{epoch}.json")
        and info.mtime < written_before
    )


def _is_live(
    parsed: layout.PathInfo,
    info: FileInfo,
    live: LiveAttempt | None,
    savepoints_with_metadata: set[str],
    now: float,
    temp_grace: float,
) -> bool:
    if parsed.kind is Kind.SAVEPOINT_METADATA:
        return True  # a savepoint is deleted only by an explicit dispose
    if parsed.kind is Kind.SAVEPOINT_OTHER and parsed.savepoint in savepoints_with_metadata:
        return False  # a completed savepoint's own unreferenced leftover
    if live is None:
        return False
    if parsed.kind is Kind.TEMP and parsed.epoch is not None:
        pass  # an interrupted write of a data file: judged by its epoch like the file
    elif parsed.kind is Kind.TEMP and parsed.checkpoint_id is None or (
        parsed.kind is Kind.SAVEPOINT_OTHER
    ):
        return now - info.mtime < temp_grace
    if parsed.kind in (Kind.CHECKPOINT_METADATA, Kind.CHECKPOINT_OTHER) or parsed.epoch is None:
        # chk-N/ names no epoch: any folder after the newest retained may be in flight
        return parsed.checkpoint_id is not None and parsed.checkpoint_id > live.after_checkpoint
    return (
        parsed.epoch == live.epoch
        and parsed.checkpoint_id is not None
        and parsed.checkpoint_id > live.after_checkpoint
    )


def reconcile(
    storage: Storage,
    ha: HAStore,
    cleaner: Cleaner,
    live: LiveAttempt | None,
    *,
    dry_run: bool = False,
) -> ReconcilePlan:
    """Plan, then hand the orphans to the cleaner (unless `dry_run`)."""
    result = plan(storage, ha, live)
    if not dry_run:
        cleaner.discard(result.discard())
    return result


class GcReport(BaseModel):
    """What `statehold gc` found and did."""

    job_uri: str
    dry_run: bool
    live_epoch: int | None
    scanned: int
    referenced: int
    orphans: list[str]
    orphan_bytes: int
    protected: list[str]
    foreign: list[str]
    deleted: int


def gc(job: Storage, ha: HAStore, *, dry_run: bool = False, timeout: float = 600.0) -> GcReport:
    """Reconcile a job directory from outside the job; safe while the job runs (the
    running attempt's in-flight files are protected while its lease is fresh)."""
    live = live_attempt_from_lease(job, ha)
    cleaner = AsyncCleaner(job, max_attempts=20, initial_delay=0.05, max_delay=5.0)
    try:
        result = reconcile(job, ha, cleaner, live, dry_run=dry_run)
        cleaner.wait_idle(timeout)
        failed = cleaner.status().retrying_count + cleaner.status().gave_up
    finally:
        cleaner.close()
    if failed:
        raise StorageError(f"{job.uri}: {failed} orphan(s) could not be deleted; run gc again")
    return GcReport(
        job_uri=job.uri,
        dry_run=dry_run,
        live_epoch=live.epoch if live else None,
        scanned=result.scanned,
        referenced=result.referenced,
        orphans=sorted(f.key for f in result.orphans),
        orphan_bytes=result.orphan_bytes,
        protected=sorted(result.protected),
        foreign=sorted(result.foreign),
        deleted=0 if dry_run else len(result.orphans),
    )
