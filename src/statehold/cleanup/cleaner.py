"""The one way statehold discards files.

Every discard — subsumed and aborted checkpoints, reconcile orphans, job-end cleanup —
goes through a `Cleaner`, so batching, idempotence, retries and fencing live in one place.
`AsyncCleaner` (in `async_cleaner.py`, re-exported here) is the one the driver runs
(deletes never delay processing or recovery); `SyncCleaner` deletes in the caller's
thread, for tools and tests.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statehold.ha.base import FencedError
from statehold.storage.base import Storage, check_key

if TYPE_CHECKING:
    from statehold.cleanup.async_cleaner import AsyncCleaner


@dataclass(frozen=True, slots=True)
class Backoff:
    """When a failed delete is tried again: `initial` * `multiplier` ** (attempt - 1),
    capped at `cap`, spread by +-`jitter` (a fraction) so that retries of many files do
    not arrive together. The background cleaners share it."""

    initial: float = 0.1
    cap: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial < 0 or self.cap < self.initial or self.multiplier < 1:
            raise ValueError("need 0 <= initial_delay <= max_delay and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """The wait before try `attempts` + 1; `rng` for the jitter (none: no jitter)."""
        delay = min(self.initial * self.multiplier ** min(attempts - 1, 100), self.cap)
        if self.jitter and rng is not None:
            delay *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, min(delay, self.cap))


@dataclass(frozen=True, slots=True)
class Discard:
    """Files and whole directories (e.g. ``chk-7``) that may be deleted."""

    keys: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.keys or self.dirs)


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


def _checked(discard: Discard) -> tuple[list[str], list[str]]:
    """The discard's paths, each one the deletion policy may have chosen (else raises in
    the caller, before anything is deleted)."""
    from statehold.cleanup.policy import check_discardable

    return (
        [check_discardable(check_key(k)) for k in discard.keys],
        [check_discardable(check_key(d.rstrip("/")), is_dir=True) for d in discard.dirs],
    )


class SyncCleaner(Cleaner):
    """Deletes in the caller's thread; for tools and tests. Errors propagate."""

    def __init__(self, storage: Storage, guard: Guard | None = None) -> None:
        super().__init__(storage, guard)
        self._status = CleanerStatus()

    def discard(self, discard: Discard) -> None:
        if discard:
            try:
                self._status.deleted += self._delete_now(*_checked(discard))
            except FencedError:
                self._status.fenced = True  # reported like AsyncCleaner's (gc reads it)
                raise

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True

    def status(self) -> CleanerStatus:
        return self._status


def __getattr__(name: str) -> object:
    """`AsyncCleaner` for ``from statehold.cleanup.cleaner import AsyncCleaner``, imported on first
    use: its module subclasses `Cleaner`, so importing it here eagerly would be circular."""
    if name == "AsyncCleaner":
        from statehold.cleanup.async_cleaner import AsyncCleaner

        return AsyncCleaner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsyncCleaner", "Cleaner", "CleanerStatus", "Discard", "Guard", "SyncCleaner"]
