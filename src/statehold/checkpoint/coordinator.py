"""The driver-side checkpoint coordinator: the lifecycle of DESIGN.md, step by step.

1. `begin(N)` writes nothing to the HA store.
2. Tasks upload their files and report handles (`acknowledge`).
3. `complete(N)` writes ``chk-N/_metadata`` (create-if-absent, so a zombie attempt can
   never overwrite the current attempt's document), then publishes N to the HA store with
   a fenced compare-and-set. Only then is N completed.
4. The same publish drops checkpoints beyond the retention count; only after it succeeded
   are their files handed to the cleaner, as decided by the shared-state registry.
5. `abort(N)` discards what N uploaded and nothing any other checkpoint references.
A fenced attempt (FencedError) completes nothing and deletes nothing.

Steps 3 and 5 ask the HA store alone whether N is published (`published.py`). The
coordinator owns its collaborators and callers hold it alone: a begun checkpoint's reports
(`pending.py`), the start of the attempt (`attempt.py`: claiming the epoch, loading the
retained checkpoints), its background reconcile (`reconciler.py`), and savepoints and the
job end (`job_end.py`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from statehold import clock
from statehold.checkpoint import attempt, job_end, published
from statehold.checkpoint.attempt import CheckpointSettings, ClaimedAttempt, Retained
from statehold.checkpoint.pending import PendingCheckpoint
from statehold.checkpoint.reconciler import Reconciler
from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.cleaner import Cleaner, Discard, Guard
from statehold.cleanup.policy import history_to_prune, retention_split
from statehold.cleanup.reconcile import ReconcilePlan
from statehold.errors import CheckpointError, InvalidArgumentError
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    NEW_JOB_KEY_HASH,
    CheckpointMetadata,
    EventTime,
    KeyGroupState,
    KeyHash,
    OperatorSchemas,
    sealed,
)
from statehold.ha.base import CheckpointPointer, FencedError, HAStore
from statehold.job import history
from statehold.job.directory import JobDirectory, open_job
from statehold.job.lease import DEFAULT_TTL, Lease, lease_key
from statehold.job.result import JobOutcome, RetentionPolicy
from statehold.storage.base import Storage

log = logging.getLogger("statehold.checkpoint.coordinator")


def _pointers(checkpoints: list[Retained]) -> list[CheckpointPointer]:
    return [CheckpointPointer(m.checkpoint_id, key, m.epoch, m.checksum) for key, m in checkpoints]


class CheckpointCoordinator:
    def __init__(
        self,
        job: JobDirectory,
        claimed: ClaimedAttempt,
        settings: CheckpointSettings,
        cleaner: Cleaner | Callable[[Guard], Cleaner] | None = None,
    ) -> None:
        """The coordinator of attempt `claimed` of `job` (`start` claims it)."""
        if settings.retain < 1:
            raise InvalidArgumentError("retain must be at least 1")
        self.job = job
        self.storage = job.storage
        self.ha = job.ha
        self.job_id = job.job_id
        self.max_parallelism = settings.max_parallelism
        #: How keys map to key groups: the job's own, or the setting's for a new job.
        self.key_hash = claimed.key_hash or settings.key_hash
        self.epoch = claimed.epoch
        self.retain = settings.retain
        self.retain_for = settings.retain_for
        self.registry = claimed.registry
        self.checkpoint_timeout = settings.checkpoint_timeout
        self.lineage = claimed.lineage
        #: Discards run in the background: processing and recovery never wait on them.
        #: A factory given instead is called with this attempt's fence as the guard.
        if cleaner is None:
            cleaner = AsyncCleaner(job.storage, guard=self.check_epoch)
        elif not isinstance(cleaner, Cleaner):
            cleaner = cleaner(self.check_epoch)
        self.cleaner: Cleaner = cleaner
        self.backlog_wait = settings.backlog_wait
        self._retained = list(claimed.retained)
        self.history = history.Recorder(
            job.storage, self.job_id, self.epoch, prune=history_to_prune
        )
        self._pending: dict[int, PendingCheckpoint] = {}
        self._aborted: set[int] = set()
        self.lease: Lease | None = None
        self._reconciler = Reconciler(job, self.epoch, self.check_epoch, settings.reconcile_every)
        #: A quarantined document named no readable path: no data file is discarded.
        self.spare_all_data = claimed.spare_all_data

    # -- start -----------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        job: JobDirectory | Storage,
        ha: HAStore | None = None,
        *,
        job_id: str | None = None,
        max_parallelism: int,
        retain: int = 3,
        cleaner: Cleaner | Callable[[Guard], Cleaner] | None = None,
        checkpoint_timeout: float = 600.0,
        lease_ttl: float = DEFAULT_TTL,
        reconcile_in_background: bool = True,
        reconcile_every: int = 50,
        renew_lease_in_background: bool = True,
        retain_for: float | None = None,
        key_hash: KeyHash = NEW_JOB_KEY_HASH,
    ) -> CheckpointCoordinator:
        """Begin a new attempt of the job (a JobDirectory, or a Storage and HA store to
        open one with): claim a higher epoch (fencing every older attempt), read the
        retained checkpoints named by the HA store alone, build the registry from their
        documents and the savepoints' (a damaged savepoint is quarantined, not fatal),
        finish the cleanup of a job that ended dirty, then reconcile the job directory
        in the background while the caller starts processing.

        `cleaner`: a Cleaner, or a factory called with this attempt's fence
        (`check_epoch`) as its guard; default an AsyncCleaner so fenced. `retain`
        newest completed checkpoints are kept, and with `retain_for` (seconds) every one
        younger too (`statehold.cleanup.policy.retention_split`). `key_hash` is for a new
        job; a job with checkpoints keeps the one they record (`coordinator.key_hash`). With
        `renew_lease_in_background` False nobody renews the lease but the caller
        (``coordinator.lease.renew()``), e.g. a deterministic simulation."""
        if not isinstance(job, JobDirectory):
            job = open_job(job, ha, job_id=job_id, create=True)
        claimed = attempt.claim(job, max_parallelism)
        settings = CheckpointSettings(
            max_parallelism, retain, retain_for, checkpoint_timeout,
            reconcile_every=reconcile_every, key_hash=key_hash,
        )
        coordinator = cls(job, claimed, settings, cleaner)
        coordinator.lease = Lease(
            job.storage, claimed.epoch, lease_ttl, status=coordinator.status
        ).start(background=renew_lease_in_background)
        attempt.finish_earlier_end(job.storage, job.job_id, coordinator.end, coordinator.close)
        if reconcile_in_background:
            coordinator.start_reconcile()
        return coordinator

    # -- queries ---------------------------------------------------------------------------
    def retained(self) -> list[Retained]:
        """Retained completed checkpoints as (metadata key, metadata), oldest first."""
        return list(self._retained)

    def latest(self) -> Retained | None:
        return self._retained[-1] if self._retained else None

    def pending_ids(self) -> list[int]:
        return sorted(self._pending)

    def status(self) -> dict[str, Any]:
        """What this attempt reports about itself (published with every lease renewal)."""
        return {
            "job_id": self.job_id,
            "latest_checkpoint": self._latest_id(),
            "pending": self.pending_ids(),
            "cleaner": dataclasses.asdict(self.cleaner.status()),
        }

    def check_epoch(self) -> None:
        """Raise FencedError if a later attempt has taken over (the cleaner's guard)."""
        self.ha.check_epoch(self.epoch)

    @property
    def last_reconcile(self) -> ReconcilePlan | None:
        """The plan of the last background reconcile that finished."""
        return self._reconciler.last

    # -- lifecycle -------------------------------------------------------------------------
    def begin(self, checkpoint_id: int) -> None:
        latest = self.latest()
        if latest is not None and checkpoint_id <= latest[1].checkpoint_id:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} is not after the latest completed checkpoint "
                f"{latest[1].checkpoint_id}"
            )
        if checkpoint_id in self._pending:
            raise CheckpointError(f"checkpoint {checkpoint_id} is already pending")
        self._abort_timed_out()
        self._wait_for_backlog()
        self._aborted.discard(checkpoint_id)
        self._pending[checkpoint_id] = PendingCheckpoint(checkpoint_id, clock.now())

    def acknowledge(self, checkpoint_id: int, operator: str, state: KeyGroupState) -> None:
        """A task's report of the files holding its key-group range. A late report for an
        aborted checkpoint has its new files discarded at once."""
        metadata_key = layout.checkpoint_metadata_key(checkpoint_id)
        files = {
            layout.resolve(metadata_key, f.path): f for f in state.files if not f.external
        }
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            if checkpoint_id in self._aborted:
                self._discard_unreferenced(files, f"late upload for aborted {checkpoint_id}")
                return
            raise CheckpointError(f"checkpoint {checkpoint_id} is not pending")
        scopes = {key: f.scope for key, f in files.items()}
        self.registry.register_checkpoint(checkpoint_id, scopes, pending=True)
        pending.acks.setdefault(operator, []).append(state)

    def complete(
        self,
        checkpoint_id: int,
        source_position: Mapping[str, Any] | None = None,
        event_time: EventTime | None = None,
        state_schemas: dict[str, OperatorSchemas] | None = None,
    ) -> CheckpointMetadata:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            raise CheckpointError(f"checkpoint {checkpoint_id} is not pending")
        metadata_key = layout.checkpoint_metadata_key(checkpoint_id)
        operators = pending.operators(self.max_parallelism)
        meta = CheckpointMetadata(
            job_id=self.job_id,
            checkpoint_id=checkpoint_id,
            epoch=self.epoch,
            created_at=pending.started_at,
            completed_at=clock.now(),
            source_position=dict(source_position or {}),
            max_parallelism=self.max_parallelism,
            key_hash=self.key_hash,
            operators=operators,
            lineage=self.lineage,
            event_time=event_time,
            state_schemas=state_schemas,
        )
        data, meta = sealed(meta, metadata_key)  # meta carries the checksum now
        if self.lease is not None and not self.lease.unbroken_since(pending.started_at):
            raise CheckpointError(
                f"checkpoint {checkpoint_id}: this attempt's lease lapsed since it began "
                "(paused or storage unreachable); an outside gc may have deleted its files"
            )
        pending.metadata_written = True
        # Never over a newer attempt's document or a published one.
        published.write_metadata_once(self.storage, self.ha, self.epoch, metadata_key, data)
        retained = [*self._retained, (metadata_key, meta)]
        # The one retention rule (count, and age with retain_for): the deletion policy's.
        split = retention_split(
            [m.completed_at for _, m in retained], self.retain, self.retain_for
        )
        subsumed, retained = retained[:split], retained[split:]
        # FencedError: nothing completed or deleted; any error: the caller aborts N.
        pointers = _pointers(retained)
        if published.publish_settled(self.ha, self.epoch, pointers, checkpoint_id, meta.checksum):
            log.warning("job %s: publish of %d failed but landed", self.job_id, checkpoint_id)
        # N is completed from here on.
        del self._pending[checkpoint_id]
        self._retained = retained
        self.registry.complete(checkpoint_id)
        self._release(subsumed)
        log.info("job %s: completed checkpoint %d", self.job_id, checkpoint_id)
        self.history.record(checkpoint_id, "completed", pending.started_at, pending.acks,
                            self.cleaner.status(), complete_seconds=clock.now() - meta.completed_at)
        self._reconciler.checkpoint_completed(self._latest_id())
        return meta

    def abort(self, checkpoint_id: int, reason: str) -> None:
        """Discard what checkpoint N uploaded that no other checkpoint references."""
        pending = self._pending.pop(checkpoint_id, None)
        if pending is None:
            return
        self._aborted.add(checkpoint_id)
        log.warning("job %s: aborting checkpoint %d: %s", self.job_id, checkpoint_id, reason)
        self.history.record(checkpoint_id, "aborted", pending.started_at, pending.acks,
                            self.cleaner.status(), reason=reason)
        discard = self.registry.release_checkpoint(checkpoint_id)
        # complete() got to the HA publish: unless the HA store says N is not listed (and
        # this epoch is current), N may be retained; delete nothing of it and leave it to
        # the reconcile, which trusts only the HA store. Its _metadata is left in place
        # even if not listed: by the time a delete landed, a newer attempt may have
        # written and published its own document for N (a replayed batch; simulation,
        # seed 10129). A retry of N replaces it only if unchanged
        # (`published.write_metadata_once`); the job moving past N, or its end, removes it.
        if pending.metadata_written and published.may_be_listed(
            self.ha, self.epoch, checkpoint_id
        ):
            log.warning("job %s: checkpoint %d may be published; kept", self.job_id,
                        checkpoint_id)
            return
        # chk-N/ never goes to the cleaner: a retry of N writes the very same keys, which
        # a lagging delete would remove.
        chk = layout.checkpoint_dir(checkpoint_id)
        self.discard(
            Discard(
                keys=tuple(k for k in discard.keys if not k.startswith(chk + "/")),
                reason=discard.reason,
            )
        )

    # -- attempt and job end (reconciler.py, job_end.py) ----------------------------------
    def savepoint(self, name: str) -> CheckpointMetadata:
        """A named, never-subsumed, self-contained copy of the latest checkpoint: the
        metadata and the checkpoint's shared and exclusive files are copied into
        ``savepoints/<name>/`` (hard links or server-side copies), so nothing the job
        deletes can break it."""
        return job_end.savepoint(self.storage, self.latest(), name, self.check_epoch)

    def start_reconcile(self) -> None:
        """Reconcile the job directory with the HA store in a background thread (unless
        one is still running)."""
        self._reconciler.start(self._latest_id())

    def wait_reconciled(self, timeout: float | None = None) -> bool:
        """Wait for the background reconcile and the discards it handed over."""
        return self._reconciler.wait(timeout) and self.cleaner.wait_idle(timeout)

    def end(
        self,
        outcome: JobOutcome = JobOutcome.FINISHED,
        policy: RetentionPolicy = RetentionPolicy.KEEP_LATEST,
        *,
        savepoint: str | None = None,
        timeout: float | None = 600.0,
    ) -> bool:
        """The job ended: dirty entry first, cleanup per `policy`, then clean entry.
        With `savepoint`, the newest checkpoint is first kept as that savepoint (which
        no policy deletes). Returns False (entry left dirty, for the next driver to
        finish) if the cleanup could not finish within `timeout`."""
        return job_end.end(self, outcome, policy, savepoint=savepoint, timeout=timeout)

    def close(self, drain_timeout: float = 30.0) -> None:
        """Give pending discards a bounded chance to finish; what remains is not lost,
        the next attempt's reconcile deletes it."""
        self.wait_reconciled(drain_timeout)
        if self.lease is not None:
            # Released through the cleaner, so a failed delete is retried like any other
            # (if it still fails, the lease is stale to the next attempt's reconcile).
            self.lease.stop(release=False)
            self.discard(Discard(keys=(lease_key(self.epoch),), reason="lease released"))
            self.cleaner.wait_idle(drain_timeout)
        self.cleaner.close()

    def retain_only(self, count: int) -> None:
        """Publish only the newest `count` retained checkpoints (the job end); the others'
        files are released."""
        keep = self._retained[max(0, len(self._retained) - count) :]
        self.ha.publish(self.epoch, _pointers(keep))
        dropped, self._retained = self._retained[: len(self._retained) - len(keep)], keep
        self._release(dropped)

    def discard(self, discard: Discard) -> None:
        """Hand `discard` to the cleaner; with `spare_all_data`, no data file of it."""
        if self.spare_all_data:
            # A quarantined document may name any data file: spare them all until a person
            # disposes of it; folders of released checkpoints still go.
            kept = (layout.Kind.SHARED, layout.Kind.EXCLUSIVE, layout.Kind.TASKOWNED)
            keys = tuple(k for k in discard.keys if layout.parse(k).kind not in kept)
            discard = Discard(keys, discard.dirs, discard.reason)
        if discard:
            self.cleaner.discard(discard)

    # -- internals -------------------------------------------------------------------------
    def _latest_id(self) -> int:
        latest = self.latest()
        return latest[1].checkpoint_id if latest else -1

    def _wait_for_backlog(self) -> None:
        """The one place cleanup may delay processing: when the cleaner's backlog passed
        its bound, a new checkpoint waits (at most `backlog_wait` seconds) for it to drain."""
        backlogged = getattr(self.cleaner, "backlogged", None)
        if backlogged is not None and backlogged():
            log.warning("job %s: cleanup backlog over its bound; delaying the next "
                        "checkpoint up to %.0fs", self.job_id, self.backlog_wait)
            self.cleaner.wait_idle(self.backlog_wait)

    def _abort_timed_out(self) -> None:
        now = clock.now()
        for pending in list(self._pending.values()):
            if now - pending.started_at > self.checkpoint_timeout:
                self.abort(pending.checkpoint_id, "timed out")

    def _release(self, dropped: list[Retained]) -> None:
        for _key, old in dropped:
            self.discard(self.registry.release_checkpoint(old.checkpoint_id))

    def _discard_unreferenced(self, files: Mapping[str, Any], reason: str) -> None:
        keep = self.registry.referenced()
        keys = tuple(
            k for k, f in files.items() if k not in keep and f.scope is not Scope.TASKOWNED
        )
        self.discard(Discard(keys=keys, reason=reason))


__all__ = ["CheckpointCoordinator", "CheckpointError", "FencedError"]
