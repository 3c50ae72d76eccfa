"""The outside gc (`statehold gc`): the reconcile's plan, run by a person beside a job
that may be running, so every delete batch is guarded.

Before every delete batch it re-checks that what it planned under is still true
(`outside_guard`): the HA store's epoch is unchanged (no failover), and an attempt it
found not running has not come back (a resumed pause). Otherwise it stops, having
deleted nothing live, and says to run it again. The running attempt, for its part,
completes a checkpoint only if its lease stayed fresh the whole time since the
checkpoint began (`lease.Lease.unbroken_since`), so a gc that saw the lease lapse can
never delete the files of a checkpoint that is then published.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from statehold.cleanup.bulk_delete import BulkDeleter, OnDeleted
from statehold.cleanup.cleaner import Cleaner, Guard
from statehold.cleanup.policy import JobDirectoryRule, LiveAttempt
from statehold.cleanup.reconcile import (
    PAGE_SIZE,
    ReconcileError,
    feed,
    feed_names,
    live_attempt,
    plan,
)
from statehold.cleanup.sweep import OnListed, ReconcilePlan
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format import results as shared
from statehold.ha.base import FencedError, HAState
from statehold.job.directory import JobDirectory
from statehold.job.lease import read_lease
from statehold.progress import Advance, NoProgress, Progress
from statehold.storage import open_storage


class GcInterruptedError(StateholdError):
    """The job changed while gc ran (a failover, a resumed attempt); gc stopped, having
    deleted nothing live. Run it again."""


def outside_guard(
    job: JobDirectory, planned: HAState | int, live: LiveAttempt | None
) -> Callable[[], None]:
    """The re-check an outside writer runs before each delete batch: FencedError (which
    stops its cleaner) once the job is no longer as it planned under. `planned` is the
    HA state (or just its epoch) the plan was made under: plain data, so a Spark
    executor can rebuild the same guard."""
    epoch = planned if isinstance(planned, int) else planned.epoch

    def guard() -> None:
        state = job.state()
        if state.epoch != epoch:
            raise FencedError(
                f"a new attempt (epoch {state.epoch}) started during the operation "
                f"(planned under epoch {epoch})"
            )
        if live is None:
            lease = read_lease(job.storage, state.epoch)
            if lease is not None and lease.alive():
                raise FencedError(f"the attempt of epoch {state.epoch} is running again")

    return guard


class GcReport(shared.GcReport):
    """What `statehold gc` found and did in a job directory
    (`statehold.format.results.GcReport`, a job's keys filled). The key lists are samples
    of at most `SAMPLE` keys; the `*_count` fields count every file."""

    location_kind: Literal["job"] = "job"
    job_uri: str
    dry_run: bool
    live_epoch: int | None
    scanned: int
    referenced: int
    orphans: list[str]
    orphan_count: int = 0
    #: None: not counted (a local gc deletes by name, without a stat per file).
    orphan_bytes: int | None
    protected: list[str]
    protected_count: int = 0
    foreign: list[str]
    foreign_count: int = 0
    quarantined: dict[str, str]
    deleted: int

    @classmethod
    def of(
        cls, job_uri: str, result: ReconcilePlan, *, dry_run: bool, deleted: int,
        bytes_counted: bool = True,
    ) -> GcReport:
        return cls(
            job_uri=job_uri,
            dry_run=dry_run,
            live_epoch=result.live.epoch if result.live else None,
            scanned=result.scanned,
            referenced=result.referenced,
            orphans=sorted(f.key for f in result.orphans),
            orphan_count=result.orphan_count,
            orphan_bytes=result.orphan_bytes if bytes_counted else None,
            protected=sorted(result.protected),
            protected_count=result.protected_count,
            foreign=sorted(result.foreign),
            foreign_count=result.foreign_count,
            quarantined=result.quarantined,
            deleted=deleted,
        )


@dataclass(frozen=True)
class GcTuning:
    """How the outside gc lists and deletes on one kind of store."""

    #: Delete batches in flight at once; 0: each batch in the listing's own thread.
    workers: int
    #: Files per listing page, so per delete batch and per guard check.
    page_size: int
    #: Count the orphans' bytes (where a listing gives sizes for free).
    count_bytes: bool


#: A local disk deletes in the listing's thread, as `find -delete` does: a directory's
#: lock serialises the listing and the unlinks, and a listing thread beside a deleting
#: thread made each unlink twice as slow. Pages of 100,000 names (about 10 MB) are
#: unlinked in inode order (see `local_listing`), as find's pages are. The bytes are not
#: counted: an lstat per file cost a fifth of the gc's time (a dry run, or `statehold
#: du`, tells them).
LOCAL_GC = GcTuning(workers=0, page_size=100_000, count_bytes=False)
#: An object store's listing gives the sizes; several delete requests are in flight.
REMOTE_GC = GcTuning(workers=4, page_size=PAGE_SIZE, count_bytes=True)


def gc_tuning(job: JobDirectory) -> GcTuning:
    return LOCAL_GC if job.storage.uri.startswith("file:") else REMOTE_GC


def gc_cleaner(
    job: JobDirectory, guard: Guard, on_deleted: OnDeleted | None = None,
    *, count_bytes: bool = True,
) -> BulkDeleter:
    """The outside gc's default cleaner: the one guarded batch deleter (`bulk_delete`),
    asking the job directory's rule, re-checked by `guard` before every batch;
    `count_bytes`: the deleter learns the bytes (a stat per file on a local disk)."""
    return BulkDeleter(
        job.storage, rule=JobDirectoryRule(guard), workers=gc_tuning(job).workers,
        on_deleted=on_deleted, count_bytes=count_bytes,
    )


def settle(job_uri: str, deleting: Cleaner, timeout: float) -> int:
    """Wait for a gc's cleaner to finish; the number deleted, or GcInterruptedError
    (fenced: the job changed) / ReconcileError (deletes still failing)."""
    deleting.wait_idle(timeout)
    status = deleting.status()
    if status.fenced:
        raise GcInterruptedError(
            f"{job_uri}: gc stopped after deleting {status.deleted} orphan(s): "
            f"{status.last_errors[-1] if status.last_errors else 'the job changed'}; "
            "nothing live was deleted, run gc again"
        )
    failed = status.retrying_count + status.gave_up + status.pending_keys
    if failed:
        raise ReconcileError(f"{job_uri}: {failed} orphan(s) could not be deleted; run gc again")
    return status.deleted


def gc(
    job: JobDirectory,
    *,
    dry_run: bool = False,
    timeout: float = 600.0,
    cleaner: Callable[[Guard], Cleaner] | None = None,
    page_size: int | None = None,
    progress: Progress | None = None,
) -> GcReport:
    """Reconcile a job directory from outside the job; safe while the job runs (see the
    module docstring for the protocol). The listing is streamed: each page's orphans go
    to the cleaner as they are listed, and the guard runs before every delete batch.
    `cleaner` makes the cleaner from the re-check (its guard); default `gc_cleaner`.
    `progress` gets two counters: files listed (after each judged page, in the listing's
    thread) and, unless a dry run, files deleted (after each batch, in a deleting thread;
    the default cleaner's only)."""
    progress = progress or NoProgress()
    listed = progress.counter(f"gc {job.uri}: listed", None, "files")
    state = job.state()
    live = live_attempt(job, state)
    if dry_run:
        planned = plan(
            job, live, state=state, page_size=page_size or PAGE_SIZE, on_listed=listed
        )
        return GcReport.of(job.uri, planned, dry_run=True, deleted=0)
    guard = outside_guard(job, state, live)
    tuning = gc_tuning(job)
    page_size = page_size or tuning.page_size
    # The default deleter takes its bytes from the listing, where a listing has them.
    sized = cleaner is None and tuning.count_bytes
    if cleaner is None:
        on_deleted = progress.counter(f"gc {job.uri}: deleted", None, "files")
        deleting: Cleaner = gc_cleaner(
            job, guard, lambda files, _bytes: on_deleted(files), count_bytes=False
        )
    else:
        deleting = cleaner(guard)
    result: ReconcilePlan | None = None
    try:
        with contextlib.suppress(FencedError):  # the cleaner was fenced: `settle` says so
            result = plan(
                job, live, state=state, on_orphans=feed(deleting, timeout=timeout),
                on_names=feed_names(deleting, timeout), on_listed=listed,
                page_size=page_size, sizes_from_listing=sized,
            )
        deleted = settle(job.uri, deleting, timeout)
    finally:
        deleting.close()
    assert result is not None
    counted = sized or isinstance(deleting, BulkDeleter) and deleting.count_bytes
    if isinstance(deleting, BulkDeleter):
        result.orphan_bytes += deleting.freed  # the files it was given by name
    return GcReport.of(job.uri, result, dry_run=False, deleted=deleted, bytes_counted=counted)


#: Top-level directories that make a directory a job directory.
_JOB_MARKS = (layout.HA_DIR, layout.JOB_DIR, layout.SAVEPOINTS_DIR)


def job_locations(root: str, **storage_options: Any) -> list[str]:
    """The job directories immediately under a checkpoint root (each holds ``_ha/``,
    ``_job/``, ``savepoints/`` or a ``chk-N/``), as locations to open one by one."""
    storage = open_storage(root, **storage_options)
    found: list[str] = []
    for sub in storage.list_top("")[0]:
        dirs, _ = storage.list_top(sub)
        names = {d.rsplit("/", 1)[-1] for d in dirs}
        if names & set(_JOB_MARKS) or any(n.startswith("chk-") for n in names):
            found.append(f"{root.rstrip('/')}/{sub}")
    return found


class GcAllReport(BaseModel):
    """`statehold gc ROOT --all-jobs`: one report per job, and the jobs that failed
    (location -> error); each job was collected with its own recorded HA store."""

    root: str
    jobs: list[GcReport]
    errors: dict[str, str]


# -- deprecated --------------------------------------------------------------------------
@dataclass(frozen=True)
class _GcProgress(NoProgress):
    """What `gc` took before `statehold.progress.Progress` (``GcProgress``, removed in
    the next release): `listed(files)` and `deleted(files, bytes)`, as gc's two counters
    (bytes 0: gc's deleter never counted them)."""

    listed: OnListed | None = None
    deleted: OnDeleted | None = None

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        listed, deleted = self.listed, self.deleted
        if description.endswith(": listed") and listed is not None:
            return listed
        if description.endswith(": deleted") and deleted is not None:
            return lambda files: deleted(files, 0)
        return NoProgress().counter(description)


def __getattr__(name: str) -> Any:
    if name == "GcProgress":
        warnings.warn(
            "statehold.cleanup.gc.GcProgress is replaced by statehold.progress.Progress "
            "(removed in the next release)", DeprecationWarning, stacklevel=2,
        )
        return _GcProgress
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GcAllReport",
    "GcInterruptedError",
    "GcReport",
    "GcTuning",
    "gc",
    "gc_cleaner",
    "gc_tuning",
    "job_locations",
    "outside_guard",
    "settle",
]
