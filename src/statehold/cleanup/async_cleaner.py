"""`AsyncCleaner`: the cleaner the driver runs, so deletes never delay processing or recovery.

Callers only enqueue; one background thread deletes in bulk, retries each failing path on
its own backoff schedule, and stops deleting as soon as its guard reports the attempt
fenced. The cleaner interface and its guard are in `cleaner.py`, the retry engine it
shares with `BulkDeleter` in `retry.py`; the policy check every path passes is
`policy.check_discard`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass

from statehold.cleanup.cleaner import CleanerStatus, Guard
from statehold.cleanup.discard import Discard
from statehold.cleanup.policy import check_discard
from statehold.cleanup.retry import Backoff, RetryingCleaner, RetrySchedule, failures_of
from statehold.errors import InvalidArgumentError
from statehold.ha.base import FencedError
from statehold.storage.base import Storage

#: The one cleaner logger, whichever module logs: operators filter on it.
logger = logging.getLogger("statehold.cleanup.cleaner")


@dataclass(eq=False, slots=True)
class _Item:
    """One file or directory waiting to be deleted."""

    path: str
    is_dir: bool
    attempts: int = 0
    due: float = 0.0


def _fmt(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class AsyncCleaner(RetryingCleaner[list[_Item]]):
    """Deletes in one background thread; `discard()` only enqueues.

    The worker takes up to `batch_size` queued files per bulk `delete_many` call, and
    removes each queued directory with one `delete_prefix` call. Deletes are idempotent (a
    missing file is success). A file or directory that fails is retried on its own
    schedule with exponential backoff (`initial_delay` * `multiplier` ** (attempt - 1),
    capped at `max_delay`, spread by +-`jitter` as a fraction), so a file that keeps
    failing never holds up the others. Retries are unlimited unless `max_attempts` is
    set; a path given up on is left for the reconcile, which finds every orphan anyway.

    The `guard` runs before every batch. If it raises FencedError a newer attempt owns the
    job: this cleaner deletes nothing any more, drops its queue (the new attempt's
    reconcile takes over) and reports ``fenced`` in `status()`. Any other guard error
    means "cannot tell right now": nothing is deleted and the batch waits (with backoff).

    Backlog bound: when the number of pending paths reaches `max_backlog`, a warning is
    logged and `backlogged()` turns True. Nothing is refused — a discard is never lost —
    but the coordinator should not begin new checkpoints while `backlogged()` is True, so
    that storage which cannot keep up with deletes slows checkpointing instead of filling
    up. `close()` stops the worker without draining (call `wait_idle()` first to drain);
    whatever is still pending is found by the next reconcile.
    """

    #: How many retrying paths `status()` lists by name.
    STATUS_SAMPLE = 100

    def __init__(
        self,
        storage: Storage,
        guard: Guard | None = None,
        *,
        batch_size: int = 1000,
        initial_delay: float = 0.1,
        max_delay: float = 60.0,
        multiplier: float = 2.0,
        jitter: float = 0.2,
        max_attempts: int | None = None,
        max_backlog: int = 100_000,
        max_errors: int = 20,
        seed: int | None = None,
        name: str = "statehold-cleaner",
    ) -> None:
        if batch_size < 1 or max_backlog < 1 or max_errors < 1:
            raise InvalidArgumentError("batch_size, max_backlog and max_errors must be >= 1")
        if max_attempts is not None and max_attempts < 1:
            raise InvalidArgumentError("max_attempts must be >= 1 or None")
        backoff = Backoff(initial_delay, max_delay, multiplier, jitter)
        super().__init__(
            storage, guard, backoff, max_attempts=max_attempts, max_errors=max_errors, seed=seed
        )
        self.batch_size = batch_size
        self.max_backlog = max_backlog
        self._items: dict[tuple[bool, str], _Item] = {}  # everything pending, by identity
        self._ready_keys: deque[_Item] = deque()
        self._ready_dirs: deque[_Item] = deque()
        self._waiting: RetrySchedule[_Item] = RetrySchedule()
        self._retrying: dict[tuple[bool, str], _Item] = {}
        self._dirs_turn = False
        self._above_bound = False
        self._hold_until = 0.0  # a failing (non-fencing) guard pauses all deletes
        self._guard_failures = 0
        self._start_workers([name])

    def __enter__(self) -> AsyncCleaner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- caller side (never does I/O) ----------------------------------------------------
    def discard(self, discard: Discard) -> None:
        """Enqueue and return. Paths are validated here, so a bad one raises in the
        caller. After fencing or close() the discard is dropped (the reconcile of the
        attempt that owns the job will find the files)."""
        keys, dirs = check_discard(discard)
        with self._cond:
            if self._fenced or self._stopping:
                logger.debug("dropping discard (%s): cleaner is fenced or closed", discard.reason)
                return
            for path, is_dir in itertools.chain(
                ((k, False) for k in keys), ((d, True) for d in dirs)
            ):
                ident = (is_dir, path)
                if ident in self._items:
                    continue  # already pending: deleting twice is the same as once
                item = _Item(path, is_dir)
                self._items[ident] = item
                (self._ready_dirs if is_dir else self._ready_keys).append(item)
            self._check_bound()
            self._cond.notify_all()

    def backlogged(self) -> bool:
        """True while at least `max_backlog` paths are pending: the coordinator should
        hold back new checkpoints until the cleaner catches up."""
        with self._cond:
            return len(self._items) >= self.max_backlog

    def wait_below(self, limit: int, timeout: float | None = None) -> bool:
        """Wait until fewer than `limit` paths are pending (or the cleaner is fenced or
        closed): how a caller that streams millions of discards keeps the queue bounded.
        False on timeout."""
        return self._wait(
            lambda: True
            if len(self._items) < limit or self._fenced or self._stopping
            else None,
            timeout,
        )

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or in flight. False on timeout, or at once if
        the cleaner is closed with work left."""

        def outcome() -> bool | None:
            if not (self._items or self._busy):
                return True
            return False if self._stopping and not self._threads[0].is_alive() else None

        return self._wait(outcome, timeout)

    def status(self) -> CleanerStatus:
        with self._cond:
            dirs = sum(1 for is_dir, _ in self._items if is_dir)
            return self._status(
                len(self._items) - dirs,
                dirs,
                retrying=[
                    i.path for i in itertools.islice(self._retrying.values(), self.STATUS_SAMPLE)
                ],
                retrying_count=len(self._retrying),
                backlogged=len(self._items) >= self.max_backlog,
            )

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker (after its current batch) and wait up to `timeout` for it."""
        with self._cond:
            pending = len(self._items)
        super().close(timeout)
        if pending:
            logger.info("cleaner closed with %d path(s) pending; the reconcile finds them", pending)

    # -- worker side ---------------------------------------------------------------------
    def _check_bound(self) -> None:
        """Must hold the lock. Log when the backlog crosses `max_backlog` either way."""
        above = len(self._items) >= self.max_backlog
        if above and not self._above_bound:
            logger.warning(
                "cleaner backlog reached %d path(s) (max_backlog=%d): deletes are not keeping "
                "up; new checkpoints should wait",
                len(self._items),
                self.max_backlog,
            )
        elif not above and self._above_bound:
            logger.info("cleaner backlog back below %d path(s)", self.max_backlog)
        self._above_bound = above

    def _next_work(self) -> list[_Item] | None:
        """Must hold the lock. Wait for the next batch: up to `batch_size` files, or one
        directory. None when the worker must stop."""
        while True:
            if self._stopping or self._fenced:
                return None
            now = time.monotonic()
            for item in self._waiting.pop_due(now):
                (self._ready_dirs if item.is_dir else self._ready_keys).append(item)
            ready = bool(self._ready_keys or self._ready_dirs)
            if ready and now >= self._hold_until:
                self._dirs_turn = not self._dirs_turn
                if self._ready_dirs and (self._dirs_turn or not self._ready_keys):
                    return [self._ready_dirs.popleft()]
                n = min(self.batch_size, len(self._ready_keys))
                return [self._ready_keys.popleft() for _ in range(n)]
            wake = [self._hold_until] if ready else []
            if self._waiting.next_due is not None:
                wake.append(self._waiting.next_due)
            self._cond.wait(max(0.0, min(wake) - now) if wake else None)

    def _attempt(self, batch: list[_Item]) -> None:
        try:
            self._process(batch)
        except Exception as e:  # a bug must not kill the worker: retry the batch
            logger.exception("cleaner batch failed unexpectedly")
            self._record([], [(item, e) for item in batch], 0)

    def _process(self, batch: list[_Item]) -> None:
        if self.guard is not None:
            try:
                self.guard()
            except FencedError as e:
                self._fenced_now(e)
                return
            except Exception as e:
                self._guard_failed(batch, e)
                return
            with self._cond:
                self._guard_failures = 0
        if batch[0].is_dir:
            item = batch[0]
            deleted = 0

            def delete_dir() -> None:
                nonlocal deleted
                deleted = self.storage.delete_prefix(item.path + "/")

            errors = failures_of(delete_dir, [item.path])
        else:
            keys = [item.path for item in batch]
            errors = failures_of(lambda: self.storage.delete_many(keys), keys)
        failed = [(item, errors[item.path]) for item in batch if item.path in errors]
        done = [item for item in batch if item.path not in errors]
        if not batch[0].is_dir:
            deleted = len(done)
        self._record(done, failed, deleted)

    def _record(
        self, done: list[_Item], failed: list[tuple[_Item, BaseException]], deleted: int
    ) -> None:
        retry_msgs: list[str] = []
        given_up: list[str] = []
        with self._cond:
            if self._fenced:
                return
            now = time.monotonic()
            self._deleted += deleted
            for item in done:
                ident = (item.is_dir, item.path)
                self._items.pop(ident, None)
                self._retrying.pop(ident, None)
            for item, err in failed:
                ident = (item.is_dir, item.path)
                msg = f"{item.path}{'/' if item.is_dir else ''}: {_fmt(err)}"
                if not self._failed(item, 1, msg, now):
                    self._items.pop(ident, None)
                    self._retrying.pop(ident, None)
                    given_up.append(msg)
                    continue
                self._retrying[ident] = item
                self._waiting.push(item)
                # log the 1st, 2nd, 4th, 8th... failure of a path: visible, not flooding
                if item.attempts & (item.attempts - 1) == 0:
                    retry_msgs.append(f"{msg} (attempt {item.attempts})")
            self._check_bound()
            self._cond.notify_all()
        if retry_msgs:
            logger.warning(
                "%d delete(s) failed, will retry: %s", len(retry_msgs), "; ".join(retry_msgs[:10])
            )
        if given_up:
            logger.error(
                "gave up on %d path(s) after %s attempts (left for the reconcile): %s",
                len(given_up),
                self.max_attempts,
                "; ".join(given_up[:10]),
            )

    def _guard_failed(self, batch: list[_Item], err: BaseException) -> None:
        """The guard could not confirm we may delete: put the batch back and pause."""
        with self._cond:
            self._guard_failures += 1
            self._hold_until = time.monotonic() + self.backoff.delay(
                self._guard_failures, self._rng
            )
            for item in reversed(batch):
                (self._ready_dirs if item.is_dir else self._ready_keys).appendleft(item)
            self._errors.append(f"guard: {_fmt(err)}")
            self._cond.notify_all()
        logger.warning("cleaner guard failed, deletes paused: %s", _fmt(err))

    def _drop_pending(self) -> int:
        dropped = len(self._items)
        self._items.clear()
        self._ready_keys.clear()
        self._ready_dirs.clear()
        self._waiting.clear()
        self._retrying.clear()
        self._check_bound()
        return dropped

    def _fenced_now(self, err: FencedError) -> None:
        with self._cond:
            dropped = self._fence(err)
        logger.error(
            "cleaner fenced (%s): deleting nothing any more, dropped %d pending path(s); "
            "the current attempt's reconcile takes over",
            err,
            dropped,
        )
