"""Reconcile a job directory with its HA store: list it, ask the deletion policy about
every file, delete the orphans (DESIGN invariant 7; the decisions live in
`statehold.cleanup.policy`). Run inside the attempt (at start and every so many checkpoints);
`statehold.cleanup.gc` runs the same plan from outside, as `statehold gc`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.bulk_delete import BulkDeleter
from statehold.cleanup.cleaner import Cleaner
from statehold.cleanup.discard import Discard
from statehold.cleanup.holders import read_holders
from statehold.cleanup.policy import LiveAttempt, View
from statehold.cleanup.sweep import SAMPLE, OnListed, OnNames, ReconcilePlan, sweep
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.metadata import referenced_keys
from statehold.ha.base import FencedError, HAState
from statehold.job.directory import JobDirectory
from statehold.job.lease import read_lease
from statehold.job.result import read_result
from statehold.storage.base import FileInfo

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
    holders = read_holders(job, state)
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


def referenced_by_job(job: JobDirectory) -> set[str]:
    """Every key a retained checkpoint or a savepoint needs, its `_metadata` included."""
    return read_holders(job, job.state()).referenced()


__all__ = [
    "MAX_IN_FLIGHT",
    "PAGE_SIZE",
    "LiveAttempt",
    "ReconcileError",
    "ReconcilePlan",
    "SAMPLE",
    "check_complete",
    "feed",
    "feed_names",
    "live_attempt",
    "plan",
    "reconcile",
    "referenced_by_job",
    "view_for",
]
