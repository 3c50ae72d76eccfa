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

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from statehold.async_cleaner import AsyncCleaner
from statehold.cleaner import Cleaner, Discard, Guard
from statehold.errors import StateholdError
from statehold.ha.base import FencedError, HAState
from statehold.jobdir import JobDirectory
from statehold.jobresult import read_result
from statehold.lease import read_lease
from statehold.metadata import referenced_keys
from statehold.policy import LiveAttempt, Verdict, View, judge
from statehold.storage.base import FileInfo


@dataclass
class ReconcilePlan:
    scanned: int = 0
    referenced: int = 0
    orphans: list[FileInfo] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    #: Documents that cannot be verified (key -> why): their files are spared.
    quarantined: dict[str, str] = field(default_factory=dict)
    live: LiveAttempt | None = None
    #: The HA state the plan was made under.
    state: HAState | None = None

    @property
    def orphan_bytes(self) -> int:
        return sum(f.size for f in self.orphans)

    def discard(self) -> Discard:
        return Discard(keys=tuple(sorted(f.key for f in self.orphans)), reason="reconcile")


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


def plan(
    job: JobDirectory,
    live: LiveAttempt | None,
    *,
    state: HAState | None = None,
    **options: float,
) -> ReconcilePlan:
    """List the job directory and ask the policy about every file. `options`: `now`,
    `temp_grace`, `bookkeeping_grace` (see `policy.View`)."""
    state = state or job.state()
    holders = job.holders(state)
    listing = list(job.storage.list())
    view = View.of(state.epoch, holders, live, listing, **options)
    # A listing that lacks a file some checkpoint needs (one retained before and after
    # the listing, so not subsumed meanwhile) is not a listing to delete by.
    still_retained = set(job.retained_keys())
    listed = {info.key for info in listing}
    missing = sorted(
        key
        for mkey, meta in holders.documents.items()
        if mkey in still_retained and any(p.metadata == mkey for p in state.retained)
        for key in [mkey, *referenced_keys(meta, mkey)]
        if key not in listed
    )
    if missing:
        raise ReconcileError(
            f"{job.uri}: {len(missing)} file(s) a retained checkpoint references are "
            f"missing (first: {missing[0]}); nothing deleted — see `statehold verify`"
        )
    result = ReconcilePlan(quarantined=dict(holders.quarantined), live=live, state=state)
    for info in listing:
        result.scanned += 1
        verdict = judge(info, view)
        if verdict is Verdict.REFERENCED:
            result.referenced += 1
        elif verdict is Verdict.FOREIGN:
            result.foreign.append(info.key)
        elif verdict is Verdict.PROTECTED:
            result.protected.append(info.key)
        elif verdict is Verdict.DELETABLE:
            result.orphans.append(info)
    return result


def reconcile(
    job: JobDirectory, cleaner: Cleaner, live: LiveAttempt | None, *, dry_run: bool = False
) -> ReconcilePlan:
    """Plan, then hand the orphans to the cleaner (unless `dry_run`)."""
    result = plan(job, live)
    if not dry_run:
        cleaner.discard(result.discard())
    return result


def outside_guard(
    job: JobDirectory, planned: HAState, live: LiveAttempt | None
) -> Callable[[], None]:
    """The re-check an outside writer runs before each delete batch: FencedError (which
    stops its cleaner) once the job is no longer as it planned under."""

    def guard() -> None:
        state = job.state()
        if state.epoch != planned.epoch:
            raise FencedError(
                f"a new attempt (epoch {state.epoch}) started during the operation "
                f"(planned under epoch {planned.epoch})"
            )
        if live is None:
            lease = read_lease(job.storage, state.epoch)
            if lease is not None and lease.alive():
                raise FencedError(f"the attempt of epoch {state.epoch} is running again")

    return guard


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
    quarantined: dict[str, str]
    deleted: int


def gc(
    job: JobDirectory,
    *,
    dry_run: bool = False,
    timeout: float = 600.0,
    cleaner: Callable[[Guard], Cleaner] | None = None,
) -> GcReport:
    """Reconcile a job directory from outside the job; safe while the job runs (see the
    module docstring for the protocol). `cleaner` makes the cleaner from the re-check
    (its guard); default an AsyncCleaner with retries."""
    state = job.state()
    live = live_attempt(job, state)
    result = plan(job, live, state=state)
    deleted = 0
    if not dry_run and result.orphans:
        guard = outside_guard(job, state, live)
        deleting = (
            cleaner(guard)
            if cleaner is not None
            else AsyncCleaner(
                job.storage,
                guard=guard,
                max_attempts=20,
                initial_delay=0.05,
                max_delay=5.0,
                name="statehold-gc",
            )
        )
        try:
            deleting.discard(result.discard())
            deleting.wait_idle(timeout)
            status = deleting.status()
        finally:
            deleting.close()
        deleted = status.deleted
        if status.fenced:
            raise GcInterruptedError(
                f"{job.uri}: gc stopped after deleting {deleted} orphan(s): "
                f"{status.last_errors[-1] if status.last_errors else 'the job changed'}; "
                "nothing live was deleted, run gc again"
            )
        failed = status.retrying_count + status.gave_up + status.pending_keys
        if failed:
            raise ReconcileError(
                f"{job.uri}: {failed} orphan(s) could not be deleted; run gc again"
            )
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
        quarantined=result.quarantined,
        deleted=deleted,
    )


def referenced_by_job(job: JobDirectory) -> set[str]:
    """Every key a retained checkpoint or a savepoint needs, its `_metadata` included."""
    return job.holders(job.state()).referenced()


__all__ = [
    "GcInterruptedError",
    "GcReport",
    "LiveAttempt",
    "ReconcileError",
    "ReconcilePlan",
    "gc",
    "live_attempt",
    "outside_guard",
    "plan",
    "reconcile",
    "referenced_by_job",
]
