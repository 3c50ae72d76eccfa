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
everything, as `AsyncCleaner`'s does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from statehold.cleanup.cleaner import Cleaner, CleanerStatus, Guard
from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import check_discard, check_discardable_names
from statehold.cleanup.retry import Backoff
from statehold.ha.base import FencedError
from statehold.storage.base import DeleteError, Storage

#: Called from a worker thread after each deleted batch: (files deleted, bytes freed).
OnDeleted = Callable[[int, int], None]


@dataclass(eq=False, slots=True)
class _Batch:
    directory: str
    names: list[str]
    attempts: int = 0
    due: float = 0.0


class BulkDeleter(Cleaner):
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
        super().__init__(storage, guard)
        if workers < 0 or max_attempts < 1:
            raise ValueError("workers must be >= 0 and max_attempts >= 1")
        self.max_attempts = max_attempts
        self.backoff = Backoff(initial_delay, max_delay, jitter=0.0)
        self.on_deleted = on_deleted
        #: False: the caller knows the bytes from its listing; no stat per file here.
        self.count_bytes = count_bytes
        self._cond = threading.Condition()
        self._queue: deque[_Batch] = deque()
        self._pending = 0  # files queued, in flight or waiting for a retry
        self._busy = 0
        self._deleted = 0
        self._freed = 0
        self._failures = 0
        self._gave_up = 0
        self._fenced = False
        self._stopping = False
        self._errors: deque[str] = deque(maxlen=max_errors)
        self._threads = [
            threading.Thread(target=self._run, name=f"statehold-gc-delete-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # -- caller side ---------------------------------------------------------------------
    def discard(self, discard: Discard) -> None:
        """Files of any directories (grouped here by directory); whole directories are
        not this cleaner's (the gc judges files)."""
        keys, dirs = check_discard(discard)
        if dirs:
            raise ValueError("BulkDeleter deletes files, not directories")
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
                if done() or not self._queue or self._fenced or self._stopping:
                    return
                now = time.monotonic()
                batch = self._take_due(now)
                if batch is None:
                    if not wait or (deadline is not None and now >= deadline):
                        return
                    wake = min(b.due for b in self._queue)
                    self._cond.wait(min(wake, deadline or wake) - now)
                    continue
            self._run_batch(batch)

    def wait_below(self, limit: int, timeout: float | None = None) -> bool:
        """Wait until fewer than `limit` files are pending (or fenced, or closed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._threads:
            self._run_due(lambda: self._pending < limit, deadline)
        with self._cond:
            while self._pending >= limit and not (self._fenced or self._stopping):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._threads:
            self._run_due(lambda: False, deadline)
        with self._cond:
            while (self._pending or self._busy) and not self._fenced:
                if self._stopping:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def status(self) -> CleanerStatus:
        with self._cond:
            retrying = sum(len(b.names) for b in self._queue if b.attempts)
            return CleanerStatus(
                pending_keys=self._pending - retrying,
                deleted=self._deleted,
                failures=self._failures,
                last_errors=list(self._errors),
                retrying_count=retrying,
                gave_up=self._gave_up,
                fenced=self._fenced,
            )

    @property
    def freed(self) -> int:
        """Bytes the deleted files held, where the store told (a local disk)."""
        with self._cond:
            return self._freed

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- workers -------------------------------------------------------------------------
    def _next(self) -> _Batch | None:
        """Must hold the lock: the next due batch, or None when the workers must stop."""
        while True:
            if self._stopping or self._fenced:
                return None
            now = time.monotonic()
            batch = self._take_due(now)
            if batch is not None:
                return batch
            wake = min((b.due for b in self._queue), default=None)
            self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _take_due(self, now: float) -> _Batch | None:
        """Must hold the lock: the first due batch, off the queue and counted busy."""
        for i, batch in enumerate(self._queue):
            if batch.due <= now:
                del self._queue[i]
                self._busy += 1
                return batch
        return None

    def _run_batch(self, batch: _Batch) -> None:
        """Delete a batch `_take_due` gave (a worker's, or the caller's without workers)."""
        try:
            self._delete(batch)
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._next()
            if batch is None:
                return
            self._run_batch(batch)

    def _delete(self, batch: _Batch) -> None:
        failed: dict[str, BaseException] = {}
        freed = 0
        try:
            if self.guard is not None:
                self.guard()
            freed = self.storage.delete_names(
                batch.directory, batch.names, count_bytes=self.count_bytes
            )
        except FencedError as e:
            with self._cond:
                self._fenced = True
                self._errors.append(f"fenced: {e}")
                self._queue.clear()
                self._pending = 0
            return
        except DeleteError as e:
            failed = e.failed
        except Exception as e:  # the guard could not tell, or the whole request failed
            failed = {"": e}
        prefix = f"{batch.directory}/" if batch.directory else ""
        if "" in failed:
            left = batch.names
        else:
            left = [n for n in batch.names if prefix + n in failed] if failed else []
        done = len(batch.names) - len(left)
        with self._cond:
            if self._fenced:
                return
            self._deleted += done
            self._freed += freed
            self._pending -= done
            if left:
                self._failures += len(left)
                self._errors.append(f"{prefix}{left[0]}: {next(iter(failed.values()))}")
                batch.names, batch.attempts = left, batch.attempts + 1
                if batch.attempts >= self.max_attempts:
                    self._gave_up += len(left)
                    self._pending -= len(left)
                else:
                    batch.due = time.monotonic() + self.backoff.delay(batch.attempts)
                    self._queue.append(batch)
        if done and self.on_deleted is not None:
            self.on_deleted(done, freed)
