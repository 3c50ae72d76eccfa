"""`BulkDeleter`: the outside gc's cleaner, for millions of files.

The attempt's `AsyncCleaner` keeps a record per pending path (for its status, retries
and backlog bound); at a million files that bookkeeping costs more than the deletes.
This cleaner queues whole batches of one directory's file names instead: each batch is
checked by the deletion policy when it is handed over (`policy.check_discardable_names`,
in the caller), re-checked against the job by the guard just before it is deleted
(`gc.outside_guard`), and deleted with one `Storage.delete_names` call (unlinks
relative to the directory on a local disk, DeleteObjects on S3). `workers` batches are
in flight at once on an object store. With `workers=0` (a local disk) each batch is
deleted in the caller's thread as it is handed over, between two pages of the listing,
as `find -delete` does: a directory's lock serialises a listing and unlinks, and a
listing thread and a deleting thread were measured contending for it (each unlink
twice as slow). A failing batch is retried on backoff with only its failed names (with
no worker, when the caller hands over or waits); a guard that says FencedError stops
everything, as `AsyncCleaner`'s does. The retry engine is the one they share (`retry.py`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from statehold.cleanup.cleaner import CleanerStatus, Guard
from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import check_discard, check_discardable_names
from statehold.cleanup.retry import Backoff, RetryingCleaner, RetrySchedule, failures_of
from statehold.errors import InvalidArgumentError
from statehold.ha.base import FencedError
from statehold.storage.base import Storage

#: Called from a worker thread after each deleted batch: (files deleted, bytes freed).
OnDeleted = Callable[[int, int], None]


@dataclass(eq=False, slots=True)
class _Batch:
    directory: str
    names: list[str]
    attempts: int = 0
    due: float = 0.0


class BulkDeleter(RetryingCleaner[_Batch]):
    """Deletes batches of one directory's files in `workers` background threads, or in
    the caller's thread (`workers=0`)."""

    def __init__(
        self,
        storage: Storage,
        guard: Guard | None = None,
        *,
        workers: int = 1,
        max_attempts: int = 20,
        initial_delay: float = 0.05,
        max_delay: float = 5.0,
        max_errors: int = 20,
        on_deleted: OnDeleted | None = None,
        count_bytes: bool = True,
    ) -> None:
        if workers < 0 or max_attempts < 1:
            raise InvalidArgumentError("workers must be >= 0 and max_attempts >= 1")
        backoff = Backoff(initial_delay, max_delay, jitter=0.0)
        super().__init__(
            storage, guard, backoff, max_attempts=max_attempts, max_errors=max_errors
        )
        self.on_deleted = on_deleted
        #: False: the caller knows the bytes from its listing; no stat per file here.
        self.count_bytes = count_bytes
        self._queue: deque[_Batch] = deque()
        self._retries: RetrySchedule[_Batch] = RetrySchedule()
        self._pending = 0  # files queued, in flight or waiting for a retry
        self._freed = 0
        self._start_workers([f"statehold-gc-delete-{i}" for i in range(workers)])

    # -- caller side ---------------------------------------------------------------------
    def discard(self, discard: Discard) -> None:
        """Files of any directories (grouped here by directory); whole directories are
        not this cleaner's (the gc judges files)."""
        keys, dirs = check_discard(discard)
        if dirs:
            raise InvalidArgumentError("BulkDeleter deletes files, not directories")
        groups: dict[str, list[str]] = {}
        for key in keys:
            parent, _, name = key.rpartition("/")
            groups.setdefault(parent, []).append(name)
        for directory, names in groups.items():
            self._put(directory, names)

    def discard_names(self, directory: str, names: list[str]) -> None:
        """Files `names` of `directory`, each one the policy may delete (else raises here,
        before anything is queued)."""
        self._put(directory, check_discardable_names(directory, names))

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
        prefix = f"{batch.directory}/" if batch.directory else ""
        freed = 0

        def delete() -> None:
            nonlocal freed
            if self.guard is not None:
                self.guard()
            freed = self.storage.delete_names(
                batch.directory, batch.names, count_bytes=self.count_bytes
            )

        try:
            failed = failures_of(delete, [prefix + n for n in batch.names])
        except FencedError as e:
            with self._cond:
                self._fence(e)
            return
        left = [n for n in batch.names if prefix + n in failed]
        done = len(batch.names) - len(left)
        with self._cond:
            if self._fenced:
                return
            self._deleted += done
            self._freed += freed
            self._pending -= done
            if left:
                batch.names = left
                error = f"{prefix}{left[0]}: {failed[prefix + left[0]]}"
                if self._failed(batch, len(left), error, time.monotonic()):
                    self._retries.push(batch)
                else:
                    self._pending -= len(left)
            self._cond.notify_all()
        if done and self.on_deleted is not None:
            self.on_deleted(done, freed)
