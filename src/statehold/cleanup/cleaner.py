"""The one way statehold discards files.

Every discard — subsumed and aborted checkpoints, reconcile orphans, job-end cleanup —
goes through a `Cleaner`, so batching, idempotence, retries and fencing live in one place,
and every cleaner passes each path through the policy's `check_discard` first (the
outside gc's, through the rule it is handed: the policy's, or a Spark location's).
`AsyncCleaner` (`async_cleaner.py`) is the one the driver runs (deletes never delay
processing or recovery); `BulkDeleter` (`bulk_delete.py`) the outside gc's, both
worlds'; `SyncCleaner` deletes in the caller's thread, for tools and tests.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import check_discard
from statehold.ha.base import FencedError
from statehold.storage.base import Storage


@dataclass
class CleanerStatus:
    #: Files / directories handed over and not yet deleted (queued, in flight, retrying).
    pending_keys: int = 0
    pending_dirs: int = 0
    #: Files deleted (a key that was already missing counts as deleted).
    deleted: int = 0
    #: Failed delete attempts, counted per file or directory.
    failures: int = 0
    #: The most recent failures, newest last, as "path: error" (bounded).
    last_errors: list[str] = field(default_factory=list)
    #: Paths waiting for a retry after a failure (a bounded sample) and how many there are.
    retrying: list[str] = field(default_factory=list)
    retrying_count: int = 0
    #: Paths dropped after `max_attempts` failures (the reconcile will find them).
    gave_up: int = 0
    #: The guard raised FencedError: this cleaner deletes nothing any more.
    fenced: bool = False
    #: The backlog is at or above the cleaner's `max_backlog`.
    backlogged: bool = False


#: Called before each delete batch; raises (e.g. FencedError) to forbid deleting.
Guard = Callable[[], None]


class Cleaner(abc.ABC):
    def __init__(self, storage: Storage, guard: Guard | None = None) -> None:
        self.storage = storage
        self.guard = guard

    @abc.abstractmethod
    def discard(self, discard: Discard) -> None:
        """Hand files over for deletion. Never blocks on the deletion itself in
        asynchronous cleaners."""

    @abc.abstractmethod
    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending; False on timeout."""

    @abc.abstractmethod
    def status(self) -> CleanerStatus: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work (pending work is not lost: the reconcile finds it)."""

    def _delete_now(self, keys: Iterable[str], dirs: Iterable[str]) -> int:
        """One attempt: bulk-delete files, remove directories. Idempotent."""
        if self.guard is not None:
            self.guard()
        keys = list(keys)
        deleted = 0
        if keys:
            self.storage.delete_many(keys)
            deleted += len(keys)
        for d in dirs:
            deleted += self.storage.delete_prefix(d)
        return deleted


class SyncCleaner(Cleaner):
    """Deletes in the caller's thread; for tools and tests. Errors propagate."""

    def __init__(self, storage: Storage, guard: Guard | None = None) -> None:
        super().__init__(storage, guard)
        self._status = CleanerStatus()

    def discard(self, discard: Discard) -> None:
        if discard:
            try:
                self._status.deleted += self._delete_now(*check_discard(discard))
            except FencedError:
                self._status.fenced = True  # reported like AsyncCleaner's (gc reads it)
                raise

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True

    def status(self) -> CleanerStatus:
        return self._status


__all__ = ["Cleaner", "CleanerStatus", "Discard", "Guard", "SyncCleaner"]
