"""The background cleaners' one retry engine: when a failed delete is tried again
(`Backoff`, `RetrySchedule`), which paths of a delete call failed (`failures_of`), and
`RetryingCleaner`, what `AsyncCleaner` and `BulkDeleter` share: the worker threads, the
failure counts and recent errors of their status, giving up after `max_attempts`,
fencing, and waiting for the work to drain. Each keeps only how it queues its work."""

from __future__ import annotations

import abc
import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from statehold.cleanup.cleaner import Cleaner, CleanerStatus, Guard
from statehold.errors import InvalidArgumentError
from statehold.ha.base import FencedError
from statehold.storage.base import DeleteError, Storage


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
            raise InvalidArgumentError(
                "need 0 <= initial_delay <= max_delay and multiplier >= 1"
            )
        if not 0 <= self.jitter <= 1:
            raise InvalidArgumentError("jitter must be in [0, 1]")

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """The wait before try `attempts` + 1; `rng` for the jitter (none: no jitter)."""
        delay = min(self.initial * self.multiplier ** min(attempts - 1, 100), self.cap)
        if self.jitter and rng is not None:
            delay *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, min(delay, self.cap))


class Retryable(Protocol):
    """A unit of work tried again on failure: how often it failed, when it is due."""

    attempts: int
    due: float


W = TypeVar("W", bound=Retryable)
#: What a worker takes off the queue at once (one unit, or a batch of them).
B = TypeVar("B")


class RetrySchedule(Generic[W]):
    """Work waiting for its retry, by due time (not thread-safe: under the owner's lock)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, W]] = []
        self._seq = itertools.count()

    def push(self, work: W) -> None:
        heapq.heappush(self._heap, (work.due, next(self._seq), work))

    def pop_due(self, now: float) -> Iterator[W]:
        """The work due by `now`, earliest first, off the schedule."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]

    @property
    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __iter__(self) -> Iterator[W]:
        return (entry[2] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def clear(self) -> None:
        self._heap.clear()


def failures_of(delete: Callable[[], object], keys: Sequence[str]) -> dict[str, BaseException]:
    """Run one delete call of `keys`; the keys that failed, each with its error (every key
    if the whole call failed). A FencedError is no failed delete: it propagates."""
    try:
        delete()
    except FencedError:
        raise
    except DeleteError as e:
        return {k: e.failed[k] for k in keys if k in e.failed}
    except Exception as e:
        return dict.fromkeys(keys, e)
    return {}


class RetryingCleaner(Cleaner, abc.ABC, Generic[B]):
    """A cleaner whose deletes run in worker threads (or the caller's), each unit of work
    retried on `backoff` until it succeeds or has failed `max_attempts` times. Subclasses
    say how work is queued (`_next_work`, `_drop_pending`) and tried (`_attempt`); they
    hold `_cond` while touching any state."""

    def __init__(
        self,
        storage: Storage,
        guard: Guard | None,
        backoff: Backoff,
        *,
        max_attempts: int | None,
        max_errors: int,
        seed: int | None = None,
    ) -> None:
        super().__init__(storage, guard)
        self.backoff = backoff
        self.max_attempts = max_attempts
        self._cond = threading.Condition()
        self._rng = random.Random(seed)
        self._errors: deque[str] = deque(maxlen=max_errors)
        self._busy = 0  # units in flight
        self._deleted = 0
        self._failures = 0
        self._gave_up = 0
        self._fenced = False
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- for subclasses ----------------------------------------------------------------
    def _start_workers(self, names: Sequence[str]) -> None:
        self._threads = [
            threading.Thread(target=self._work_loop, name=name, daemon=True) for name in names
        ]
        for thread in self._threads:
            thread.start()

    @abc.abstractmethod
    def _next_work(self) -> B | None:
        """Must hold the lock. Wait for the next work; None when the workers must stop."""

    @abc.abstractmethod
    def _attempt(self, work: B) -> None:
        """Try the work (without the lock) and record the outcome."""

    @abc.abstractmethod
    def _drop_pending(self) -> int:
        """Must hold the lock. Forget all queued work (fenced); how many paths it held."""

    def _work_loop(self) -> None:
        while True:
            with self._cond:
                work = self._next_work()
                if work is None:
                    return
                self._busy += 1
            self._run(work)

    def _run(self, work: B) -> None:
        """Try work taken off the queue (counted busy), in a worker or the caller."""
        try:
            self._attempt(work)
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def _failed(self, work: Retryable, paths: int, error: str, now: float) -> bool:
        """Must hold the lock. `work` failed for `paths` paths: count it, and set when it
        is tried again (True), or give up on it after `max_attempts` (False)."""
        work.attempts += 1
        self._failures += paths
        self._errors.append(error)
        if self.max_attempts is not None and work.attempts >= self.max_attempts:
            self._gave_up += paths
            return False
        work.due = now + self.backoff.delay(work.attempts, self._rng)
        return True

    def _fence(self, err: Exception) -> int:
        """Must hold the lock. A newer attempt owns the job (or a rule's re-check said
        stop): delete nothing any more and drop what is queued (its reconcile, or the
        next gc, takes over); how many paths were dropped."""
        self._fenced = True
        dropped = self._drop_pending()
        self._errors.append(f"fenced: {err}")
        self._cond.notify_all()
        return dropped

    def _wait(self, outcome: Callable[[], bool | None], timeout: float | None) -> bool:
        """Wait until `outcome()` (asked under the lock) says True (done) or False (it
        cannot be), or the timeout passes (False); None means not yet."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (result := outcome()) is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return result

    def _status(
        self,
        pending_keys: int,
        pending_dirs: int = 0,
        *,
        retrying: list[str] | None = None,
        retrying_count: int = 0,
        backlogged: bool = False,
    ) -> CleanerStatus:
        """Must hold the lock: the status, with the subclass's pending figures."""
        return CleanerStatus(
            pending_keys=pending_keys,
            pending_dirs=pending_dirs,
            deleted=self._deleted,
            failures=self._failures,
            last_errors=list(self._errors),
            retrying=retrying or [],
            retrying_count=retrying_count,
            gave_up=self._gave_up,
            fenced=self._fenced,
            backlogged=backlogged,
        )

    def close(self, timeout: float | None = None) -> None:
        """Stop the workers (after their current unit) and wait up to `timeout` for each."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)


__all__ = [
    "Backoff",
    "Retryable",
    "RetrySchedule",
    "RetryingCleaner",
    "failures_of",
]
