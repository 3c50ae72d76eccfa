"""An attempt's background reconcile: what no discard names (uploads of failed or duplicate
task attempts, checkpoints whose abort could not tell whether they were published) is
found and deleted without delaying processing.

It runs at the attempt's start and again after every so many completed checkpoints, with a
cleaner of its own: a reconcile's backlog (100,000 orphans, say) must never count against
the bound that may delay checkpoints.
"""

from __future__ import annotations

import logging
import threading

from statehold.cleanup.async_cleaner import AsyncCleaner
from statehold.cleanup.cleaner import Guard
from statehold.cleanup.policy import LiveAttempt
from statehold.cleanup.reconcile import ReconcilePlan, reconcile
from statehold.ha.base import FencedError
from statehold.job.directory import JobDirectory

#: The coordinator's logger: an attempt's reconcile is part of its story.
log = logging.getLogger("statehold.checkpoint.coordinator")


class Reconciler:
    """Reconciles one attempt's job directory with the HA store in a background thread,
    one run at a time, its deletes fenced by `guard` (the attempt's epoch check)."""

    def __init__(self, job: JobDirectory, epoch: int, guard: Guard, every: int) -> None:
        self.job = job
        self.epoch = epoch
        self.guard = guard
        #: Also reconcile after every this many completed checkpoints (0: only when asked).
        self.every = every
        #: The plan of the last reconcile that finished, for callers and tests to inspect.
        self.last: ReconcilePlan | None = None
        self._thread: threading.Thread | None = None
        self._completed = 0

    def start(self, latest_checkpoint_id: int) -> None:
        """Reconcile in the background, unless a reconcile is still running; the live
        attempt's files up to `latest_checkpoint_id` are spared."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._completed = 0
        live = LiveAttempt(self.epoch, latest_checkpoint_id)
        cleaner = AsyncCleaner(self.job.storage, guard=self.guard)
        self._thread = threading.Thread(
            target=self._run, args=(cleaner, live), name="statehold-reconcile", daemon=True
        )
        self._thread.start()

    def checkpoint_completed(self, latest_checkpoint_id: int) -> None:
        """Count one more completed checkpoint; reconcile again once `every` are."""
        self._completed += 1
        if self.every and self._completed >= self.every:
            self.start(latest_checkpoint_id)

    def wait(self, timeout: float | None) -> bool:
        """Wait for a running reconcile and the deletes it handed to its cleaner; False
        if it still runs after `timeout`."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self, cleaner: AsyncCleaner, live: LiveAttempt) -> None:
        job_id = self.job.job_id
        try:
            self.last = reconcile(self.job, cleaner, live)
            cleaner.wait_idle()
            log.info(
                "job %s: reconcile found %d orphan(s), %d bytes",
                job_id,
                self.last.orphan_count,
                self.last.orphan_bytes,
            )
        except FencedError:
            log.warning("job %s: reconcile stopped: epoch %d fenced", job_id, self.epoch)
        except Exception:
            log.exception("job %s: reconcile failed; the next attempt retries", job_id)
        finally:
            cleaner.close()
