"""Reconcile a job directory with its HA store: list it, ask the deletion policy about
every file, delete the orphans (DESIGN invariant 7; the decisions live in
`statehold.policy`).

Run inside the attempt (at start and every so many checkpoints) and from outside as
`gc`. An outside gc re-checks, before every delete batch, that what it planned under is
still true: the HA store's epoch is unchanged (no failover), and an attempt it found not
running has not come back (a resumed pause). Otherwise it stops, having deleted nothing
live, and says to run it again. The running attempt, for its part, completes a
checkpoint only if its lease stayed fresh the whole time since the checkpoint began
(`lease.Lease.unbroken_since`), so a gc that saw the lease lapse can never delete the
files of a checkpoint that is then published.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from statehold import layout
from statehold.async_cleaner import AsyncCleaner
from statehold.bulk_delete import BulkDeleter, OnDeleted
from statehold.cleaner import Cleaner, Discard, Guard
from statehold.errors import StateholdError
from statehold.ha.base import FencedError, HAState
from statehold.jobdir import JobDirectory
from statehold.jobresult import read_result
from statehold.lease import read_lease
from statehold.metadata import referenced_keys
from statehold.policy import LiveAttempt, View
from statehold.storage import open_storage
from statehold.storage.base import FileInfo
from statehold.sweep import SAMPLE, OnListed, OnNames, ReconcilePlan, sweep

#: Files per listing page: what a plan holds of the listing at a time.
PAGE_SIZE = 1000
#: Orphans handed to a cleaner and not yet deleted before the listing waits for it.
MAX_IN_FLIGHT = 20_000
#: Parallel existence checks of the referenced files.
_STAT_THREADS = 16

#: Called with each page's deletable files, in listing order.
OnOrphans = Callable[[list[FileInfo]], None]


class ReconcileError(StateholdError):
    """The job directory does not match its HA store; nothing was deleted."""


class GcInterruptedError(StateholdError):
    """The job changed while gc ran (a failover, a resumed attempt); gc stopped, having
    deleted nothing live. Run it again."""


def live_attempt(job: JobDirectory, state: HAState, now: float | None = None) -> LiveAttempt | None:
    """For a reconcile run from outside the job: the current attempt, if its lease is
    fresh and the job has not ended."""
    result = read_result(job.storage)
    if result is not None and result.state == "dirty":
        return None  # the job ended: nothing of it is in flight any more
    lease = read_lease(job.storage, state.epoch)
    if lease is None or not lease.alive(now):
        return None
    latest = state.latest.checkpoint_id if state.latest else -1
    return LiveAttempt(state.epoch, latest)


def view_for(
    job: JobDirectory, state: HAState, live: LiveAttempt | None, **options: float
) -> View:
    """The policy's view of the job: its holders (verified and quarantined) and the
    savepoints whose `_metadata` is present (listing ``savepoints/`` only, which is
    small, so the whole listing need not be held)."""
    holders = job.holders(state)
    return View.of(state.epoch, holders, live, job.storage.list(layout.SAVEPOINTS_DIR), **options)


def check_complete(job: JobDirectory, state: HAState, view: View) -> None:
    """ReconcileError, before anything is deleted, if a file a checkpoint retained before
    and after this check references is missing: a directory in that state is not one to
    delete by. Existence is asked per referenced file (in parallel), not of the whole
    listing, so the orphans can be streamed and deleted as they are listed."""
    wanted = sorted(
        {
            key
            for mkey, meta in view.holders.documents.items()
            if any(p.metadata == mkey for p in state.retained)
            for key in [mkey, *referenced_keys(meta, mkey)]
        }
    )
    if not wanted:
        return
    with ThreadPoolExecutor(min(_STAT_THREADS, len(wanted))) as pool:
        present = list(pool.map(job.storage.exists, wanted))
    absent = {k for k, ok in zip(wanted, present, strict=True) if not ok}
    if not absent:
        return
    still_retained = set(job.retained_keys())
    missing = sorted(
        key
        for mkey, meta in view.holders.documents.items()
        if mkey in still_retained and any(p.metadata == mkey for p in state.retained)
        for key in [mkey, *referenced_keys(meta, mkey)]
        if key in absent
    )
    if missing:
        raise ReconcileError(
            f"{job.uri}: {len(missing)} file(s) a retained checkpoint references are "
            f"missing (first: {missing[0]}); nothing deleted — see `statehold verify`"
        )


def plan(
    job: JobDirectory,
    live: LiveAttempt | None,
    *,
    state: HAState | None = None,
    on_orphans: OnOrphans | None = None,
    on_names: OnNames | None = None,
    on_listed: OnListed | None = None,
    page_size: int = PAGE_SIZE,
    sizes_from_listing: bool = False,
    **options: float,
) -> ReconcilePlan:
    """List the job directory page by page and ask the policy about every file; each
    page's deletable files go to `on_names` (by name, where the store lists names: see
    `sweep`) or `on_orphans` as they come (nothing of the listing is kept beyond the
    counts and samples). `options`: `now`, `temp_grace`, `bookkeeping_grace` (see
    `policy.View`)."""
    state = state or job.state()
    view = view_for(job, state, live, **options)
    check_complete(job, state, view)
    result = ReconcilePlan(quarantined=dict(view.holders.quarantined), live=live, state=state)
    sweep(
        job.storage, view, result, page_size=page_size, on_names=on_names,
        on_infos=on_orphans, on_listed=on_listed, sizes_from_listing=sizes_from_listing,
    )
    return result


def feed(cleaner: Cleaner, reason: str = "reconcile", timeout: float = 600.0) -> OnOrphans:
    """Hand each page's orphans to `cleaner`, waiting while it holds `MAX_IN_FLIGHT`
    undeleted (so a listing of millions never queues millions), at most `timeout` for
    one page. A cleaner that was fenced stops the listing with FencedError."""
    wait = _waiter(cleaner, timeout)

    def take(files: list[FileInfo]) -> None:
        wait()
        cleaner.discard(Discard(keys=tuple(f.key for f in files), reason=reason))

    return take


def feed_names(cleaner: Cleaner, timeout: float = 600.0) -> OnNames:
    """`feed` for the orphans a listing gave by name: whole batches of one directory to
    a `BulkDeleter`, keys to any other cleaner."""
    wait = _waiter(cleaner, timeout)

    def take(directory: str, names: list[str]) -> None:
        wait()
        if isinstance(cleaner, BulkDeleter):
            cleaner.discard_names(directory, names)
        else:
            base = f"{directory}/" if directory else ""
            cleaner.discard(Discard(keys=tuple(base + n for n in names), reason="gc"))

    return take


def _waiter(cleaner: Cleaner, timeout: float) -> Callable[[], None]:
    def wait() -> None:
        if isinstance(cleaner, AsyncCleaner | BulkDeleter) and not cleaner.wait_below(
            MAX_IN_FLIGHT, timeout
        ):
            raise ReconcileError(
                f"deletes made no progress for {timeout:.0f}s: "
                f"{'; '.join(cleaner.status().last_errors[-1:]) or 'no error seen'}"
            )
        if cleaner.status().fenced:
            raise FencedError("the cleaner was fenced; the listing stops")

    return wait


def reconcile(
    job: JobDirectory, cleaner: Cleaner, live: LiveAttempt | None, *, dry_run: bool = False
) -> ReconcilePlan:
    """Plan, handing the orphans to the cleaner as they are listed (unless `dry_run`)."""
    return plan(job, live, on_orphans=None if dry_run else feed(cleaner))


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


class GcReport(BaseModel):
    """What `statehold gc` found and did. The key lists are samples of at most
    `SAMPLE` keys; the `*_count` fields count every file."""

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
class GcProgress:
    """What a progress display hands to `gc`: `listed(files)` after each judged page
    (in the listing's thread), `deleted(files, bytes)` after each delete batch (in a
    deleting thread; bytes where the store tells, else 0)."""

    listed: OnListed | None = None
    deleted: OnDeleted | None = None


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
    """The outside gc's default cleaner: batches of names, retried, guarded before every
    batch (`bulk_delete`); `count_bytes`: the deleter learns the bytes (a stat per file
    on a local disk)."""
    return BulkDeleter(
        job.storage, guard=guard, workers=gc_tuning(job).workers, on_deleted=on_deleted,
        count_bytes=count_bytes,
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
    progress: GcProgress | None = None,
) -> GcReport:
    """Reconcile a job directory from outside the job; safe while the job runs (see the
    module docstring for the protocol). The listing is streamed: each page's orphans go
    to the cleaner as they are listed, and the guard runs before every delete batch.
    `cleaner` makes the cleaner from the re-check (its guard); default `gc_cleaner`."""
    progress = progress or GcProgress()
    state = job.state()
    live = live_attempt(job, state)
    if dry_run:
        planned = plan(
            job, live, state=state, page_size=page_size or PAGE_SIZE, on_listed=progress.listed
        )
        return GcReport.of(job.uri, planned, dry_run=True, deleted=0)
    guard = outside_guard(job, state, live)
    tuning = gc_tuning(job)
    page_size = page_size or tuning.page_size
    # The default deleter takes its bytes from the listing, where a listing has them.
    sized = cleaner is None and tuning.count_bytes
    deleting = (
        cleaner(guard) if cleaner is not None
        else gc_cleaner(job, guard, progress.deleted, count_bytes=False)
    )
    result: ReconcilePlan | None = None
    try:
        with contextlib.suppress(FencedError):  # the cleaner was fenced: `settle` says so
            result = plan(
                job, live, state=state, on_orphans=feed(deleting, timeout=timeout),
                on_names=feed_names(deleting, timeout), on_listed=progress.listed,
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


def referenced_by_job(job: JobDirectory) -> set[str]:
    """Every key a retained checkpoint or a savepoint needs, its `_metadata` included."""
    return job.holders(job.state()).referenced()


__all__ = [
    "GcAllReport",
    "GcInterruptedError",
    "GcProgress",
    "GcReport",
    "LiveAttempt",
    "ReconcileError",
    "ReconcilePlan",
    "SAMPLE",
    "check_complete",
    "feed",
    "feed_names",
    "gc",
    "gc_cleaner",
    "job_locations",
    "live_attempt",
    "outside_guard",
    "plan",
    "reconcile",
    "referenced_by_job",
    "settle",
    "view_for",
]
