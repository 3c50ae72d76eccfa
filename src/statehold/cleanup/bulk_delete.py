"""`BulkDeleter`: the one guarded batch deleter, both worlds' outside gc: a job
directory's (`cleanup.gc`) and a Spark checkpoint location's (`spark_checkpoints.gc`),
for millions of files.

Each world hands it its rule (`rule.DeletionRule`: `policy.JobDirectoryRule`, or the
Spark location's `SparkGcRule`) and batches of one directory's file names. Every batch
is checked by the rule's last line when it is handed over (`check_names`); just before
it is deleted (and before each retry) the rule re-checks what the listing relied on
(`recheck`: a job's HA epoch and lease, a Spark location's commit log and rollback
mark) and which files are still as listed (`unchanged`: the others are kept); then one
`Storage.delete_names` call deletes it (unlinks relative to the directory on a local
disk, DeleteObjects on S3). A re-check that says stop (`FencedError`,
`DeletionInterrupted`) stops everything, as `AsyncCleaner`'s guard does.

The attempt's `AsyncCleaner` keeps a record per pending path (for its status, retries
and backlog bound); at a million files that bookkeeping costs more than the deletes.
This cleaner queues whole batches instead. `workers` batches are in flight at once on
an object store. With `workers=0` (a local disk; every Spark gc) each batch is deleted
in the caller's thread as it is handed over, between two pages of the listing, as
`find -delete` does: a directory's lock serialises a listing and unlinks, and a listing
thread and a deleting thread were measured contending for it (each unlink twice as
slow). A failing batch is retried on backoff with only its failed names (with no
worker, when the caller hands over or waits) up to `max_attempts` (a Spark gc: once,
its report names the failure). The retry engine is the one the cleaners share
(`retry.py`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from statehold.cleanup.cleaner import CleanerStatus, Guard
from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import JobDirectoryRule
from statehold.cleanup.retry import Backoff, RetryingCleaner, RetrySchedule
from statehold.cleanup.rule import DeletionInterrupted, DeletionRule
from statehold.errors import InvalidArgumentError
from statehold.ha.base import FencedError
from statehold.storage.base import DeleteError, Storage, check_key

#: Called from a worker thread after each deleted batch: (files deleted, bytes freed).
OnDeleted = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class BatchTry:
    """One try of a batch, as the deleter tells it (`on_batch`) after the try."""

    directory: str
    #: The names it deleted.
    deleted: list[str]
    #: Bytes they held, where the store told (`count_bytes`), else 0.
    freed: int
    #: Why the rest failed (a `DeleteError` names each failed key); None: none failed.
    #: The failed names are retried, or given up after `max_attempts`.
    error: Exception | None = None


#: Called after each try of a batch (not after a stop), in the thread that tried it.
OnBatch = Callable[[BatchTry], None]


@dataclass(eq=False, slots=True)
class _Batch:
    directory: str
    names: list[str]
    attempts: int = 0
    due: float = 0.0


class BulkDeleter(RetryingCleaner[_Batch]):
    """Deletes batches of one directory's files in `workers` background threads, or in
    the caller's thread (`workers=0`), as `rule` allows (default: the job directory's,
    re-checked by `guard`)."""

    def __init__(
        self,
        storage: Storage,
        guard: Guard | None = None,
        *,
        rule: DeletionRule | None = None,
        workers: int = 1,
        max_attempts: int = 20,
        initial_delay: float = 0.05,
        max_delay: float = 5.0,
        max_errors: int = 20,
        on_deleted: OnDeleted | None = None,
        on_batch: OnBatch | None = None,
        count_bytes: bool = True,
    ) -> None:
        if workers < 0 or max_attempts < 1:
            raise InvalidArgumentError("workers must be >= 0 and max_attempts >= 1")
        if rule is not None and guard is not None:
            raise InvalidArgumentError("a rule re-checks itself: give a rule or a guard")
        self.rule: DeletionRule = rule if rule is not None else JobDirectoryRule(guard)
        backoff = Backoff(initial_delay, max_delay, jitter=0.0)
        super().__init__(
            storage, self.rule.recheck, backoff, max_attempts=max_attempts,
            max_errors=max_errors,
        )
        self.on_deleted = on_deleted
        self.on_batch = on_batch
        #: What stopped it (`FencedError`, `DeletionInterrupted`), for its caller to raise.
        self.stopped: Exception | None = None
        #: False: the caller knows the bytes from its listing; no stat per file here.
        self.count_bytes = count_bytes
        self._queue: deque[_Batch] = deque()
        self._retries: RetrySchedule[_Batch] = RetrySchedule()
        self._pending = 0  # files queued, in flight or waiting for a retry
        self._freed = 0
        self._start_workers([f"statehold-gc-delete-{i}" for i in range(workers)])

    # -- caller side ---------------------------------------------------------------------
    def discard(self, discard: Discard) -> None:
        """Files of any directories (grouped here by directory, every group checked by
        the rule before any is queued); whole directories are not this cleaner's (the gc
        judges files)."""
        if discard.dirs:
            raise InvalidArgumentError("BulkDeleter deletes files, not directories")
        groups: dict[str, list[str]] = {}
        for key in discard.keys:
            parent, _, name = check_key(key).rpartition("/")
            groups.setdefault(parent, []).append(name)
        checked = {d: self.rule.check_names(d, names) for d, names in groups.items()}
        for directory, names in checked.items():
            self._put(directory, names)

    def discard_names(self, directory: str, names: list[str]) -> None:
        """Files `names` of `directory`, each one the rule may delete (else raises here,
        before anything is queued)."""
        self._put(directory, self.rule.check_names(directory, names))

    def _put(self, directory: str, names: list[str]) -> None:
        if not names:
            return
        with self._cond:
            if self._fenced or self._stopping:
                return  # the next gc finds them
            self._queue.append(_Batch(directory, list(names)))
            self._pending += len(names)
            self._cond.notify_all()
        if not self._threads:
            self._run_due(lambda: False, None, wait=False)

    def _run_due(
        self, done: Callable[[], bool], deadline: float | None, *, wait: bool = True
    ) -> None:
        """Without workers: delete the due batches in this thread and (`wait`) wait for a
        retry's due time, until `done()` (under the lock), nothing is queued, the
        deadline, or fenced or closed."""
        while True:
            with self._cond:
                queued = self._queue or self._retries
                if done() or not queued or self._fenced or self._stopping:
                    return
                now = time.monotonic()
                batch = self._take_due(now)
                if batch is None:
                    if not wait or (deadline is not None and now >= deadline):
                        return
                    wake = self._retries.next_due or now
                    self._cond.wait(min(wake, deadline or wake) - now)
                    continue
                self._busy += 1
            self._run(batch)

    def wait_below(self, limit: int, timeout: float | None = None) -> bool:
        """Wait until fewer than `limit` files are pending (or fenced, or closed)."""
        if not self._threads:
            deadline = None if timeout is None else time.monotonic() + timeout
            self._run_due(lambda: self._pending < limit, deadline)
            timeout = None if deadline is None else deadline - time.monotonic()
        return self._wait(
            lambda: True if self._pending < limit or self._fenced or self._stopping else None,
            timeout,
        )

    def wait_idle(self, timeout: float | None = None) -> bool:
        if not self._threads:
            deadline = None if timeout is None else time.monotonic() + timeout
            self._run_due(lambda: False, deadline)
            timeout = None if deadline is None else deadline - time.monotonic()

        def outcome() -> bool | None:
            if not (self._pending or self._busy) or self._fenced:
                return True
            return False if self._stopping else None

        return self._wait(outcome, timeout)

    def status(self) -> CleanerStatus:
        with self._cond:
            retrying = sum(len(b.names) for b in (*self._queue, *self._retries) if b.attempts)
            return self._status(self._pending - retrying, retrying_count=retrying)

    @property
    def freed(self) -> int:
        """Bytes the deleted files held, where the store told (a local disk)."""
        with self._cond:
            return self._freed

    # -- workers -------------------------------------------------------------------------
    def _next_work(self) -> _Batch | None:
        """Must hold the lock: the next due batch, or None when the workers must stop."""
        while True:
            if self._stopping or self._fenced:
                return None
            now = time.monotonic()
            batch = self._take_due(now)
            if batch is not None:
                return batch
            wake = self._retries.next_due
            self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _take_due(self, now: float) -> _Batch | None:
        """Must hold the lock: the first due batch, off the queue."""
        self._queue.extend(self._retries.pop_due(now))
        return self._queue.popleft() if self._queue else None

    def _drop_pending(self) -> int:
        dropped = self._pending
        self._queue.clear()
        self._retries.clear()
        self._pending = 0
        return dropped

    def _attempt(self, batch: _Batch) -> None:
        """One try: the rule's re-checks, then one delete of the names still as listed."""
        prefix = f"{batch.directory}/" if batch.directory else ""
        names, freed = batch.names, 0
        failed: dict[str, BaseException] | None = {}  # None: every name failed
        error: Exception | None = None
        try:
            self.rule.recheck()
            names = self.rule.unchanged(batch.directory, batch.names)
            freed = self.storage.delete_names(
                batch.directory, names, count_bytes=self.count_bytes
            )
        except (FencedError, DeletionInterrupted) as e:
            with self._cond:
                self.stopped = self.stopped or e
                self._fence(e)
            return
        except DeleteError as e:
            error, failed = e, e.failed
        except Exception as e:
            error, failed = e, None
        left = [n for n in names if failed is None or prefix + n in failed]
        done = len(names) - len(left)
        with self._cond:
            if self._fenced:
                return
            self._deleted += done
            self._freed += freed
            self._pending -= len(batch.names) - len(left)  # deleted, or kept as changed
            if left:
                batch.names = left
                why = error if failed is None else failed[prefix + left[0]]
                if self._failed(batch, len(left), f"{prefix}{left[0]}: {why}", time.monotonic()):
                    self._retries.push(batch)
                else:
                    self._pending -= len(left)
            self._cond.notify_all()
        if self.on_batch is not None:
            gone = set(left)
            deleted = [n for n in names if n not in gone] if left else list(names)
            self.on_batch(BatchTry(batch.directory, deleted, freed, error))
        if done and self.on_deleted is not None:
            self.on_deleted(done, freed)


__all__ = ["BatchTry", "BulkDeleter", "OnBatch", "OnDeleted"]
