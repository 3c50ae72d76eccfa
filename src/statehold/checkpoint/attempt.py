"""One attempt of a job, from its start to its close, beside the checkpoint lifecycle.

`start` claims a higher epoch first, so every older attempt is fenced before this one
reads anything; it trusts only the HA store for which checkpoints are retained, builds the
registry from their documents and the savepoints', takes the lease that makes an offline
`gc` spare its in-flight files, and finishes the cleanup of a job that ended dirty.
The background reconcile then removes what no discard names (uploads of failed task
attempts, checkpoints whose abort could not tell whether they were published) without
delaying processing. `close` gives pending discards a bounded chance and releases the lease.

`CheckpointCoordinator.start`, `start_reconcile`, `wait_reconciled` and `close` delegate here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from statehold import clock
from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.cleaner import Cleaner, Discard, Guard
from statehold.cleanup.holders import read_holders
from statehold.cleanup.policy import LiveAttempt
from statehold.cleanup.reconcile import reconcile
from statehold.format.metadata import CheckpointMetadata, MetadataError
from statehold.ha.base import FencedError, HAStore
from statehold.job.directory import JobDirectory, open_job
from statehold.job.lease import Lease, lease_key
from statehold.job.result import clear_result, read_result
from statehold.storage.base import Storage, StorageError

if TYPE_CHECKING:
    from statehold.checkpoint.coordinator import CheckpointCoordinator

#: The coordinator's logger: an attempt's start and reconcile are part of its story.
log = logging.getLogger("statehold.checkpoint.coordinator")


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


def start(
    cls: type[CheckpointCoordinator],
    job: JobDirectory | Storage,
    ha: HAStore | None,
    *,
    job_id: str | None,
    max_parallelism: int,
    retain: int,
    cleaner: Cleaner | Callable[[Guard], Cleaner] | None,
    checkpoint_timeout: float,
    lease_ttl: float,
    reconcile_in_background: bool,
    reconcile_every: int,
    renew_lease_in_background: bool = True,
) -> CheckpointCoordinator:
    """`CheckpointCoordinator.start`: a coordinator of type `cls` for a new attempt."""
    from statehold.checkpoint.coordinator import CheckpointError  # that module imports this one

    if not isinstance(job, JobDirectory):
        job = open_job(job, ha, job_id=job_id, create=True)
    job_id = job.job_id
    state = job.ha.claim_epoch()
    holders = read_holders(job, state)
    retained: list[tuple[str, CheckpointMetadata]] = []
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
        if meta.job_id != job_id:
            raise CheckpointError(
                f"{job.uri}/{ptr.metadata} belongs to job {meta.job_id!r}, not {job_id!r}"
            )
        if meta.max_parallelism != max_parallelism:
            raise CheckpointError(
                f"job {job_id!r} was created with max parallelism {meta.max_parallelism}; "
                f"it cannot change (asked for {max_parallelism})"
            )
        retained.append((ptr.metadata, meta))
    for key, why in holders.quarantined.items():
        log.error("job %s: %s quarantined (its files are spared): %s", job_id, key, why)
    lineage = retained[-1][1].lineage if retained else None
    log.info(
        "job %s: attempt with epoch %d restores from %s",
        job_id,
        state.epoch,
        retained[-1][0] if retained else "nothing (new job)",
    )
    coordinator = cls(
        job,
        job_id=job_id,
        max_parallelism=max_parallelism,
        epoch=state.epoch,
        retained=retained,
        registry=holders.registry(),
        retain=retain,
        cleaner=cleaner,
        checkpoint_timeout=checkpoint_timeout,
        lineage=lineage,
        reconcile_every=reconcile_every,
    )
    coordinator.spare_all_data = holders.spare_all_data
    coordinator.lease = Lease(
        job.storage, state.epoch, lease_ttl, status=coordinator.status
    ).start(background=renew_lease_in_background)
    ended = read_result(job.storage)
    if ended is not None:
        if ended.state == "dirty":
            log.info("job %s ended dirty (%s): finishing its cleanup", job_id, ended.outcome)
            if not coordinator.end(ended.outcome, ended.policy):
                coordinator.close()
                raise CheckpointError(
                    f"job {job_id}: the cleanup of its earlier end could not finish "
                    "(see the cleaner's errors); start again once storage is healthy"
                )
        _clear_result(job.storage)  # started again: the job runs once more
    if reconcile_in_background:
        coordinator.start_reconcile()
    return coordinator


def start_reconcile(coordinator: CheckpointCoordinator) -> None:
    """`CheckpointCoordinator.start_reconcile`."""
    c = coordinator
    if c._reconciler is not None and c._reconciler.is_alive():
        return
    c._completed_since_reconcile = 0
    live = LiveAttempt(c.epoch, c._latest_id())

    # Its own cleaner: a reconcile's backlog (100,000 orphans, say) must never count
    # against the bound that may delay checkpoints.
    cleaner = AsyncCleaner(c.storage, guard=c.check_epoch)

    def run() -> None:
        try:
            c.last_reconcile = reconcile(c.job, cleaner, live)
            cleaner.wait_idle()
            log.info(
                "job %s: reconcile found %d orphan(s), %d bytes",
                c.job_id,
                c.last_reconcile.orphan_count,
                c.last_reconcile.orphan_bytes,
            )
        except FencedError:
            log.warning("job %s: reconcile stopped: epoch %d fenced", c.job_id, c.epoch)
        except Exception:
            log.exception("job %s: reconcile failed; the next attempt retries", c.job_id)
        finally:
            cleaner.close()

    c._reconciler = threading.Thread(target=run, name="statehold-reconcile", daemon=True)
    c._reconciler.start()


def wait_reconciled(coordinator: CheckpointCoordinator, timeout: float | None) -> bool:
    """`CheckpointCoordinator.wait_reconciled`."""
    if coordinator._reconciler is not None:
        coordinator._reconciler.join(timeout)
        if coordinator._reconciler.is_alive():
            return False
    return coordinator.cleaner.wait_idle(timeout)


def close(coordinator: CheckpointCoordinator, drain_timeout: float) -> None:
    """`CheckpointCoordinator.close`."""
    coordinator.wait_reconciled(drain_timeout)
    if coordinator.lease is not None:
        # Released through the cleaner, so a failed delete is retried like any other
        # (if it still fails, the lease is stale to the next attempt's reconcile).
        coordinator.lease.stop(release=False)
        coordinator._discard(
            Discard(keys=(lease_key(coordinator.epoch),), reason="lease released")
        )
        coordinator.cleaner.wait_idle(drain_timeout)
    coordinator.cleaner.close()
