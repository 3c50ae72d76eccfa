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

Steps 3 and 5 ask the HA store alone whether N is published (`published.py`). The attempt
around the lifecycle (`start`: claiming the epoch, loading the retained checkpoints, the
lease; the background reconcile; `close`) is in `attempt.py`, savepoints and the job end in
`jobend.py`; the methods here delegate to them, so callers hold one object.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statehold import clock
from statehold.checkpoint import attempt, published
from statehold.checkpoint import job_end as jobend
from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.cleaner import Cleaner, Discard, Guard
from statehold.cleanup.policy import history_to_prune
from statehold.cleanup.reconcile import ReconcilePlan
from statehold.cleanup.registry import SharedStateRegistry
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    EventTime,
    KeyGroupState,
    Lineage,
    OperatorSchemas,
    OperatorState,
    decode,
    encode,
)
from statehold.ha.base import CheckpointPointer, FencedError, HAStore
from statehold.job import history
from statehold.job.directory import JobDirectory
from statehold.job.lease import DEFAULT_TTL, Lease
from statehold.job.result import JobOutcome, RetentionPolicy
from statehold.storage.base import Storage

log = logging.getLogger("statehold.checkpoint.coordinator")


class CheckpointError(StateholdError):
    """A checkpoint cannot be begun or completed as asked."""


@dataclass
class _Pending:
    checkpoint_id: int
    started_at: float
    acks: dict[str, list[KeyGroupState]] = field(default_factory=dict)
    #: complete() got as far as writing ``chk-N/_metadata``.
    metadata_written: bool = False


def _scopes(files: Mapping[str, Any]) -> dict[str, Scope]:
    return {key: f.scope for key, f in files.items()}


class CheckpointCoordinator:
    def __init__(
        self,
        job: JobDirectory,
        *,
        job_id: str,
        max_parallelism: int,
        epoch: int,
        retained: list[tuple[str, CheckpointMetadata]],
        registry: SharedStateRegistry,
        retain: int = 3,
        cleaner: Cleaner | Callable[[Guard], Cleaner] | None = None,
        checkpoint_timeout: float = 600.0,
        backlog_wait: float = 60.0,
        lineage: Lineage | None = None,
        reconcile_every: int = 50,
    ) -> None:
        if retain < 1:
            raise ValueError("retain must be at least 1")
        self.job = job
        self.storage = job.storage
        self.ha = job.ha
        self.job_id = job_id
        self.max_parallelism = max_parallelism
        self.epoch = epoch
        self.retain = retain
        self.registry = registry
        self.checkpoint_timeout = checkpoint_timeout
        #: Also reconcile in the background after every this many completed checkpoints
        #: (0: only at start), for what no discard names: uploads of failed or duplicate
        #: task attempts, checkpoints whose abort could not tell whether they were
        #: published.
        self.reconcile_every = reconcile_every
        self.lineage = lineage
        #: Discards run in the background: processing and recovery never wait on them.
        #: A factory given instead is called with this attempt's fence as the guard.
        if cleaner is None:
            cleaner = AsyncCleaner(job.storage, guard=self.check_epoch)
        elif not isinstance(cleaner, Cleaner):
            cleaner = cleaner(self.check_epoch)
        self.cleaner: Cleaner = cleaner
        self.backlog_wait = backlog_wait
        self._retained = list(retained)
        self.history = history.Recorder(job.storage, job_id, epoch, prune=history_to_prune)
        self._pending: dict[int, _Pending] = {}
        self._aborted: set[int] = set()
        self.lease: Lease | None = None
        self._reconciler: threading.Thread | None = None
        self._completed_since_reconcile = 0
        self.last_reconcile: ReconcilePlan | None = None
        #: A quarantined document named no readable path: no data file is discarded.
        self.spare_all_data = False

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
    ) -> CheckpointCoordinator:
        """Begin a new attempt of the job (a JobDirectory, or a Storage and HA store to
        open one with): claim a higher epoch (fencing every older attempt), read the
        retained checkpoints named by the HA store alone, build the registry from their
        documents and the savepoints' (a damaged savepoint is quarantined, not fatal),
        finish the cleanup of a job that ended dirty, then reconcile the job directory
        in the background while the caller starts processing.

        `cleaner`: a Cleaner, or a factory called with this attempt's fence
        (`check_epoch`) as its guard; default an AsyncCleaner so fenced. With
        `renew_lease_in_background` False nobody renews the lease but the caller
        (``coordinator.lease.renew()``), e.g. a deterministic simulation."""
        return attempt.start(
            cls, job, ha, job_id=job_id, max_parallelism=max_parallelism, retain=retain,
            cleaner=cleaner, checkpoint_timeout=checkpoint_timeout, lease_ttl=lease_ttl,
            reconcile_in_background=reconcile_in_background, reconcile_every=reconcile_every,
            renew_lease_in_background=renew_lease_in_background,
        )

    # -- queries ---------------------------------------------------------------------------
    def retained(self) -> list[tuple[str, CheckpointMetadata]]:
        """Retained completed checkpoints as (metadata key, metadata), oldest first."""
        return list(self._retained)

    def latest(self) -> tuple[str, CheckpointMetadata] | None:
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
        self._pending[checkpoint_id] = _Pending(checkpoint_id, clock.now())

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
        self.registry.register_checkpoint(checkpoint_id, _scopes(files), pending=True)
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
        operators = [
            OperatorState(
                operator=name, ranges=sorted(states, key=lambda s: s.key_groups.start)
            )
            for name, states in sorted(pending.acks.items())
        ]
        for op in operators:
            self._check_coverage(op)
        meta = CheckpointMetadata(
            job_id=self.job_id,
            checkpoint_id=checkpoint_id,
            epoch=self.epoch,
            created_at=pending.started_at,
            completed_at=clock.now(),
            source_position=dict(source_position or {}),
            max_parallelism=self.max_parallelism,
            operators=operators,
            lineage=self.lineage,
            event_time=event_time,
            state_schemas=state_schemas,
        )
        data = encode(meta, metadata_key)
        meta = decode(data, metadata_key)  # carries the checksum now
        if self.lease is not None and not self.lease.unbroken_since(pending.started_at):
            raise CheckpointError(
                f"checkpoint {checkpoint_id}: this attempt's lease lapsed since it began "
                "(paused or storage unreachable); an outside gc may have deleted its files"
            )
        pending.metadata_written = True
        self._write_metadata_once(metadata_key, data)
        retained = [*self._retained, (metadata_key, meta)]
        subsumed, retained = retained[: -self.retain], retained[-self.retain :]
        pointers = [self._pointer(key, m) for key, m in retained]
        try:
            self.ha.publish(self.epoch, pointers)  # FencedError: nothing completed or deleted
        except FencedError:
            raise
        except Exception:
            if not published.listed(self.ha, self.epoch, checkpoint_id, meta.checksum):
                raise  # not (known to be) published: the caller aborts N
            log.warning("job %s: publish of %d failed but landed", self.job_id, checkpoint_id)
        # N is completed from here on.
        del self._pending[checkpoint_id]
        self._retained = retained
        self.registry.complete(checkpoint_id)
        for _key, old in subsumed:
            self._discard(self.registry.release_checkpoint(old.checkpoint_id))
        log.info("job %s: completed checkpoint %d", self.job_id, checkpoint_id)
        self.history.record(checkpoint_id, "completed", pending.started_at, pending.acks,
                            self.cleaner.status(), complete_seconds=clock.now() - meta.completed_at)
        self._completed_since_reconcile += 1
        if self.reconcile_every and self._completed_since_reconcile >= self.reconcile_every:
            self.start_reconcile()
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
        if pending.metadata_written:
            # complete() got to the HA publish. Unless the HA store says N is not listed
            # (and this epoch is current), N may be retained: delete nothing of it and
            # leave it to the reconcile, which trusts only the HA store.
            try:
                listed = published.listed(self.ha, self.epoch, checkpoint_id, None)
            except Exception:
                listed = True
            if listed:
                log.warning("job %s: checkpoint %d may be published; kept", self.job_id,
                            checkpoint_id)
                return
            # Its _metadata is left in place, not deleted: by the time a delete landed, a
            # newer attempt may have written and published its own document for N (a
            # replayed batch; simulation, seed 10129). A retry of N replaces it only if
            # unchanged (`published.write_metadata_once`); the job moving past N, or its
            # end, removes it.
        # chk-N/ never goes to the cleaner: a retry of N writes the very same keys, which
        # a lagging delete would remove.
        chk = layout.checkpoint_dir(checkpoint_id)
        self._discard(
            Discard(
                keys=tuple(k for k in discard.keys if not k.startswith(chk + "/")),
                reason=discard.reason,
            )
        )

    # -- attempt and job end (attempt.py, jobend.py) --------------------------------------
    def savepoint(self, name: str) -> CheckpointMetadata:
        """A named, never-subsumed, self-contained copy of the latest checkpoint: the
        metadata and the checkpoint's shared and exclusive files are copied into
        ``savepoints/<name>/`` (hard links or server-side copies), so nothing the job
        deletes can break it."""
        return jobend.savepoint(self, name)

    def start_reconcile(self) -> None:
        """Reconcile the job directory with the HA store in a background thread (unless
        one is still running)."""
        attempt.start_reconcile(self)

    def wait_reconciled(self, timeout: float | None = None) -> bool:
        """Wait for the background reconcile and the discards it handed over."""
        return attempt.wait_reconciled(self, timeout)

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
        return jobend.end(self, outcome, policy, savepoint=savepoint, timeout=timeout)

    def close(self, drain_timeout: float = 30.0) -> None:
        """Give pending discards a bounded chance to finish; what remains is not lost,
        the next attempt's reconcile deletes it."""
        attempt.close(self, drain_timeout)

    # -- internals -------------------------------------------------------------------------
    @staticmethod
    def _pointer(key: str, meta: CheckpointMetadata) -> CheckpointPointer:
        return CheckpointPointer(meta.checkpoint_id, key, meta.epoch, meta.checksum)

    def _latest_id(self) -> int:
        latest = self.latest()
        return latest[1].checkpoint_id if latest else -1

    def _check_coverage(self, op: OperatorState) -> None:
        """The ranges of one operator must cover 0..max_parallelism-1 exactly once."""
        expected = 0
        for kg in op.ranges:
            if kg.key_groups.start != expected:
                raise CheckpointError(
                    f"operator {op.operator!r}: key groups {expected}..{kg.key_groups.start - 1} "
                    "missing or reported twice"
                )
            expected = kg.key_groups.end + 1
        if expected != self.max_parallelism:
            raise CheckpointError(
                f"operator {op.operator!r}: key groups {expected}..{self.max_parallelism - 1} "
                "missing"
            )

    def _write_metadata_once(self, metadata_key: str, data: bytes) -> None:
        """Create ``chk-N/_metadata``, never over a newer attempt's or a published one."""
        published.write_metadata_once(self.storage, self.ha, self.epoch, metadata_key, data)

    def _wait_for_backlog(self) -> None:
        """The one place cleanup may delay processing: when the cleaner's backlog passed
        its bound, a new checkpoint waits (at most `backlog_wait` seconds) for it to drain."""
        backlogged = getattr(self.cleaner, "backlogged", None)
        if backlogged is not None and backlogged():
            log.warning(
                "job %s: cleanup backlog over its bound; delaying the next checkpoint up to %.0fs",
                self.job_id,
                self.backlog_wait,
            )
            self.cleaner.wait_idle(self.backlog_wait)

    def _abort_timed_out(self) -> None:
        now = clock.now()
        for pending in list(self._pending.values()):
            if now - pending.started_at > self.checkpoint_timeout:
                self.abort(pending.checkpoint_id, "timed out")

    def _discard_unreferenced(self, files: Mapping[str, Any], reason: str) -> None:
        keep = self.registry.referenced()
        keys = tuple(
            k for k, f in files.items() if k not in keep and f.scope is not Scope.TASKOWNED
        )
        self._discard(Discard(keys=keys, reason=reason))

    def _discard(self, discard: Discard) -> None:
        if self.spare_all_data:
            # A quarantined document may name any data file: spare them all until a person
            # disposes of it; folders of released checkpoints still go.
            kept = (layout.Kind.SHARED, layout.Kind.EXCLUSIVE, layout.Kind.TASKOWNED)
            keys = tuple(k for k in discard.keys if layout.parse(k).kind not in kept)
            discard = Discard(keys, discard.dirs, discard.reason)
        if discard:
            self.cleaner.discard(discard)


__all__ = ["CheckpointCoordinator", "CheckpointError", "FencedError"]
