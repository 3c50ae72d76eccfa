"""Savepoints and the job end: what outlives the checkpoint lifecycle.

A savepoint is never subsumed, so it copies the checkpoint's exclusive files (which the
checkpoint's subsumption would delete) and only references the shared ones, which the
registry then holds until the savepoint is disposed. The job end writes a dirty job
result entry before it deletes anything and the clean one only once nothing is left to
delete, so a driver that dies during the cleanup leaves the next one an entry to finish.

`CheckpointCoordinator.savepoint` and `CheckpointCoordinator.end` delegate here; the end
drives the attempt through its public methods (`EndingAttempt`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from statehold import clock
from statehold.cleanup.cleaner import Cleaner, Discard, Guard
from statehold.cleanup.reconcile import plan
from statehold.errors import CheckpointError, StateholdError
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    OperatorState,
    decode,
    encode,
    referenced_keys,
)
from statehold.job.directory import JobDirectory
from statehold.job.result import JobOutcome, RetentionPolicy, write_result
from statehold.storage.base import AlreadyExistsError, Storage

#: The coordinator's logger: the job end is part of its story.
#: Existence checks of a savepoint's copies in flight at once.
_STAT_THREADS = 16

log = logging.getLogger("statehold.checkpoint.coordinator")


class EndingAttempt(Protocol):
    """What the job end uses of the attempt it ends (`CheckpointCoordinator`)."""

    @property
    def job(self) -> JobDirectory: ...
    @property
    def job_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def cleaner(self) -> Cleaner: ...
    def check_epoch(self) -> None: ...
    def savepoint(self, name: str) -> CheckpointMetadata: ...
    def pending_ids(self) -> list[int]: ...
    def abort(self, checkpoint_id: int, reason: str) -> None: ...
    def retain_only(self, count: int) -> None: ...
    def wait_reconciled(self, timeout: float | None = None) -> bool: ...
    def discard(self, discard: Discard) -> None: ...


def savepoint(
    storage: Storage,
    latest: tuple[str, CheckpointMetadata] | None,
    name: str,
    guard: Guard,
) -> CheckpointMetadata:
    """`CheckpointCoordinator.savepoint` of its `latest` checkpoint, kept only if `guard`
    (the attempt's epoch check) still passes once it is written."""
    if latest is None:
        raise CheckpointError("no completed checkpoint to take a savepoint of")
    source_key, source = latest
    target_key = layout.savepoint_metadata_key(name)
    if storage.exists(target_key):
        raise CheckpointError(f"savepoint {name!r} already exists")
    meta = source.model_copy(
        update={
            "kind": "savepoint",
            "savepoint_name": name,
            "operators": _copied_operators(storage, source_key, source, name),
            "completed_at": clock.now(),
        }
    )
    data = encode(meta, target_key)
    try:
        storage.create_if_absent(target_key, data)
    except AlreadyExistsError:
        raise CheckpointError(f"savepoint {name!r} already exists") from None
    try:
        # Kept only if this attempt is still current (a fenced one publishes nothing;
        # simulation, seed 10125) and every copy is still there: copies older than the
        # policy's grace, of a writer paused that long, may have gone to a gc as an
        # abandoned savepoint's leftovers before this document existed.
        guard()
        missing = copies_missing(storage, meta, target_key, name)
        if missing:
            raise CheckpointError(
                f"savepoint {name!r}: {len(missing)} of its copies went missing while it was "
                f"being written (first: {missing[0]}); take it again"
            )
    except StateholdError:
        storage.delete_many([target_key])  # its copies are left to the reconcile
        raise
    return decode(data, target_key)


def copies_missing(
    storage: Storage, meta: CheckpointMetadata, metadata_key: str, name: str
) -> list[str]:
    """The copies in ``savepoints/<name>/`` that savepoint `meta` names and the storage
    no longer has. Asked per copy (in parallel), never from a listing: on a store whose
    listings lag behind its writes, a listing misses the copies just made (every savepoint
    was refused) and still shows ones deleted a moment ago (simulation, list lag)."""
    directory = layout.savepoint_dir(name) + "/"
    copies = sorted(k for k in referenced_keys(meta, metadata_key) if k.startswith(directory))
    if not copies:
        return []
    with ThreadPoolExecutor(min(_STAT_THREADS, len(copies))) as pool:
        present = list(pool.map(storage.exists, copies))
    return [k for k, ok in zip(copies, present, strict=True) if not ok]


def _copied_operators(
    storage: Storage, source_key: str, source: CheckpointMetadata, name: str
) -> list[OperatorState]:
    """The source checkpoint's operators, its shared and exclusive files copied into
    savepoint `name` and every path relative to the savepoint's `_metadata`."""
    target_key = layout.savepoint_metadata_key(name)
    operators = []
    for op in source.operators:
        ranges = []
        for kg in op.ranges:
            files = []
            for f in kg.files:
                if f.external:
                    files.append(f)
                    continue
                key = layout.resolve(source_key, f.path)
                # Shared files too: a savepoint that named them in place depended on
                # files a dispose or gc may delete while a paused writer resumes and
                # publishes it (simulation, seed 30016). A copy is a hard link on local
                # disk and a server-side copy on object stores; task-owned files are never
                # deleted by statehold and stay where they are.
                if f.scope in (Scope.EXCLUSIVE, Scope.SHARED):
                    copy_key = f"{layout.savepoint_dir(name)}/{key.rsplit('/', 1)[-1]}"
                    storage.copy(key, copy_key)
                    key = copy_key
                files.append(f.model_copy(update={"path": layout.relativize(target_key, key)}))
            ranges.append(kg.model_copy(update={"files": files}))
        operators.append(op.model_copy(update={"ranges": ranges}))
    return operators


def end(
    attempt: EndingAttempt,
    outcome: JobOutcome,
    policy: RetentionPolicy,
    *,
    savepoint: str | None,
    timeout: float | None,
) -> bool:
    """`CheckpointCoordinator.end`."""
    c = attempt
    storage = c.job.storage
    c.check_epoch()
    if savepoint is not None and not storage.exists(layout.savepoint_metadata_key(savepoint)):
        c.savepoint(savepoint)
    write_result(storage, job_id=c.job_id, epoch=c.epoch, outcome=outcome,
                 policy=policy, state="dirty")
    for checkpoint_id in c.pending_ids():
        c.abort(checkpoint_id, f"job {outcome}")
    c.retain_only(1 if policy is RetentionPolicy.KEEP_LATEST else 0)
    c.wait_reconciled(timeout)
    # This attempt holds the job's epoch and is ending it: no interrupted HA or job
    # entry write, and no savepoint without its `_metadata` (a killed attempt's copies),
    # can be a live one any more, however young. (A fenced writer resuming after this
    # takes its savepoint back: `savepoint` re-checks its epoch and its copies.)
    plan(
        c.job,
        None,
        bookkeeping_grace=0,
        temp_grace=0,
        spare_next_checkpoints=False,
        on_orphans=lambda files: c.discard(Discard(tuple(f.key for f in files), reason="job end")),
    )
    if policy is RetentionPolicy.DELETE_ALL:
        c.discard(Discard(dirs=(layout.SPARK_DIR,), reason="job ended: delete-all"))
    if not c.cleaner.wait_idle(timeout) or plan(
        c.job, None, bookkeeping_grace=0, temp_grace=0, spare_next_checkpoints=False
    ).orphan_count:
        log.warning("job %s: cleanup unfinished; the entry stays dirty", c.job_id)
        return False
    write_result(storage, job_id=c.job_id, epoch=c.epoch, outcome=outcome,
                 policy=policy, state="clean")
    return True
