"""The start of an attempt of a job, before its coordinator exists and just after.

`claim` claims a higher epoch first, so every older attempt is fenced before this one
reads anything; it trusts only the HA store for which checkpoints are retained and builds
the registry from their documents and the savepoints'. Once the coordinator holds its
lease, `finish_earlier_end` finishes the cleanup of a job that ended dirty.
`CheckpointCoordinator.start` runs both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from statehold import clock
from statehold.cleanup.holders import Holders, read_holders
from statehold.cleanup.registry import SharedStateRegistry
from statehold.errors import CheckpointError
from statehold.format.metadata import (
    NEW_JOB_KEY_HASH,
    CheckpointMetadata,
    KeyHash,
    Lineage,
    MetadataError,
)
from statehold.ha.base import HAState
from statehold.job.directory import JobDirectory
from statehold.job.result import JobOutcome, RetentionPolicy, clear_result, read_result
from statehold.storage.base import Storage, StorageError

#: The coordinator's logger: an attempt's start is part of its story.
log = logging.getLogger("statehold.checkpoint.coordinator")

#: A retained checkpoint: its metadata key and document.
Retained = tuple[str, CheckpointMetadata]


@dataclass(frozen=True)
class CheckpointSettings:
    """How an attempt checkpoints (`CheckpointCoordinator.start`'s arguments)."""

    max_parallelism: int
    #: Completed checkpoints kept; older ones are subsumed.
    retain: int = 3
    #: Also keep every completed checkpoint younger than this many seconds (None: count
    #: only; `statehold.cleanup.policy.retention_split`).
    retain_for: float | None = None
    #: A checkpoint pending longer is aborted when the next one begins.
    checkpoint_timeout: float = 600.0
    #: The longest a new checkpoint waits for the cleaner's backlog to drain.
    backlog_wait: float = 60.0
    #: Also reconcile in the background after every this many completed checkpoints (0:
    #: only at start), for what no discard names.
    reconcile_every: int = 50
    #: How a new job maps keys to key groups (a job with checkpoints keeps its own).
    key_hash: KeyHash = NEW_JOB_KEY_HASH


@dataclass(frozen=True)
class ClaimedAttempt:
    """What a new attempt starts from, read after it claimed its epoch."""

    epoch: int
    #: The retained checkpoints the HA store names, oldest first.
    retained: list[Retained]
    registry: SharedStateRegistry
    #: A quarantined document named no readable path: no data file is discarded.
    spare_all_data: bool

    @property
    def lineage(self) -> Lineage | None:
        return self.retained[-1][1].lineage if self.retained else None

    @property
    def key_hash(self) -> KeyHash | None:
        """The job's key hash (`_retained` checked they agree); None: a new job."""
        return self.retained[-1][1].key_hash if self.retained else None


def claim(job: JobDirectory, max_parallelism: int) -> ClaimedAttempt:
    """Claim a higher epoch (fencing every older attempt), then read the retained
    checkpoints named by the HA store alone and the registry of their documents and the
    savepoints' (a damaged savepoint is quarantined, not fatal)."""
    state = job.ha.claim_epoch()
    holders = read_holders(job, state)
    retained = _retained(job, state, holders, max_parallelism)
    for key, why in holders.quarantined.items():
        log.error("job %s: %s quarantined (its files are spared): %s", job.job_id, key, why)
    log.info(
        "job %s: attempt with epoch %d restores from %s",
        job.job_id,
        state.epoch,
        retained[-1][0] if retained else "nothing (new job)",
    )
    return ClaimedAttempt(state.epoch, retained, holders.registry(), holders.spare_all_data)


def _retained(
    job: JobDirectory, state: HAState, holders: Holders, max_parallelism: int
) -> list[Retained]:
    """The documents of the checkpoints `state` retains, each checked against its pointer
    and this job."""
    retained: list[Retained] = []
    for ptr in state.retained:
        meta = holders.documents.get(ptr.metadata)
        if meta is None:
            why = holders.quarantined.get(ptr.metadata, "unreadable")
            raise MetadataError(f"retained checkpoint {ptr.metadata}: {why}")
        if ptr.checksum and meta.checksum != ptr.checksum:
            raise MetadataError(
                f"{job.uri}/{ptr.metadata}: does not match the HA store's pointer "
                "(the document was replaced after it was published)"
            )
        if meta.job_id != job.job_id:
            raise CheckpointError(
                f"{job.uri}/{ptr.metadata} belongs to job {meta.job_id!r}, not {job.job_id!r}"
            )
        if meta.max_parallelism != max_parallelism:
            raise CheckpointError(
                f"job {job.job_id!r} was created with max parallelism {meta.max_parallelism}; "
                f"it cannot change (asked for {max_parallelism})"
            )
        if retained and meta.key_hash != retained[0][1].key_hash:
            raise MetadataError(
                f"{job.uri}/{ptr.metadata}: key hash {meta.key_hash} differs from "
                f"{retained[0][1].key_hash} in {retained[0][0]}: the documents are not of "
                "one job"
            )
        retained.append((ptr.metadata, meta))
    return retained


def finish_earlier_end(
    storage: Storage,
    job_id: str,
    end: Callable[[JobOutcome, RetentionPolicy], bool],
    close: Callable[[], None],
) -> None:
    """Finish the cleanup of a job that ended dirty with this attempt's `end` (on failure
    `close` it and raise CheckpointError), then clear the job result: it runs once more."""
    ended = read_result(storage)
    if ended is None:
        return
    if ended.state == "dirty":
        log.info("job %s ended dirty (%s): finishing its cleanup", job_id, ended.outcome)
        if not end(ended.outcome, ended.policy):
            close()
            raise CheckpointError(
                f"job {job_id}: the cleanup of its earlier end could not finish "
                "(see the cleaner's errors); start again once storage is healthy"
            )
    _clear_result(storage)


def _clear_result(storage: Storage, attempts: int = 6) -> None:
    """Remove the job result entry, retrying transient failures a few times (a queued
    asynchronous delete could remove the entry this attempt writes when it ends)."""
    for attempt in range(attempts):
        try:
            clear_result(storage)
            return
        except StorageError:
            if attempt == attempts - 1:
                raise
            clock.sleep(0.05 * 2**attempt)
