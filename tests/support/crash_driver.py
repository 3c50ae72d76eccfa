"""A real driver process for the crash tests (no Spark: it must start fast enough to be
killed thirty times a minute).

It runs one job the way the Spark driver does: a CheckpointCoordinator with the HA store
named by ``--ha`` (embedded on the job storage by default, or ZooKeeper), P in-process
"tasks" (threads), each owning a key-group range and a RocksDB `TaskStateBackend` restored
from the latest completed checkpoint. Batch b is a pure function of (seed, b); every task
keeps, per key, a running count and sum. Batch b ends in checkpoint b. Some batches fail
on purpose (a task fails after the others uploaded: abort, a late upload after the abort,
roll the state back, retry the batch); some completed checkpoints get a savepoint. After
the last batch the job ends (`end()`: dirty entry, keep-latest cleanup, clean entry). A
restarted driver resumes at batch latest + 1 (or just finishes the job-end cleanup).

Progress goes to stdout as ``PHASE <name> [n]`` lines, flushed at once, so the test can
kill the process (SIGKILL) at a chosen point:
    start, started <epoch> <latest>, reconciled <orphans>, begin <b>, uploaded <b>,
    abort <b>, metadata-written <b>, completed <b>, savepoint <b>, end, done.

Usage: PYTHONPATH=. python tests/support/crash_driver.py JOB_URI LOCAL_DIR [--batches N]
       [--seed S] [--parallelism P] [--delete-fail-rate R] [--ha embedded|zookeeper://host:port/path]
       (S3 settings from AWS_* variables)
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from statehold.backend import TaskStateBackend, sources_from_metadata, task_of_key, task_range
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.cleanup.retry import Backoff
from statehold.format import layout
from statehold.format.metadata import CheckpointMetadata
from statehold.ha.base import CheckpointPointer, HAState, HAStore
from statehold.ha.open import open_ha_store
from statehold.job.result import JobOutcome, RetentionPolicy
from statehold.storage import Storage, StorageError, open_storage
from tests.support.fault_injection_storage import FaultyStorage

JOB_ID = "crash-job"
OPERATOR = "agg"
MAX_PARALLELISM = 16
RETAIN = 2
KEYS = 40
RECORDS = 30
#: A batch whose number is this modulo ABORT_EVERY fails once: abort, roll back, retry.
ABORT_EVERY, ABORT_AT = 5, 3
SAVEPOINT_EVERY = 6
#: Retries of a batch whose checkpoint failed on a storage error (not the planned aborts).
MAX_RETRIES = 20


def phase(*words: object) -> None:
    print("PHASE", *words, flush=True)


def batch(seed: int, b: int) -> list[tuple[str, int]]:
    """The input of batch `b`: a pure function of (seed, b)."""
    rng = random.Random(f"{seed}/{b}")
    return [(f"k{rng.randrange(KEYS)}", rng.randrange(-50, 100)) for _ in range(RECORDS)]


def reference(seed: int, batches: int) -> dict[str, tuple[int, int]]:
    """Plain-Python (count, sum) per key over batches 1..`batches`."""
    out: dict[str, tuple[int, int]] = {}
    for b in range(1, batches + 1):
        for key, value in batch(seed, b):
            count, total = out.get(key, (0, 0))
            out[key] = (count + 1, total + value)
    return out


def read_state(
    storage: Storage, local_dir: Path, metadata_key: str, meta: CheckpointMetadata
) -> dict[str, tuple[int, int]]:
    """The keyed state of a checkpoint, read back with one task over all key groups (so
    it restores across a parallelism change as well)."""
    sources = sources_from_metadata(storage, metadata_key, meta, OPERATOR)
    full = task_range(0, 1, MAX_PARALLELISM)
    out: dict[str, tuple[int, int]] = {}
    with TaskStateBackend.open(local_dir, OPERATOR, full, MAX_PARALLELISM, sources) as be:
        for key, states in be.items():
            out[str(key)] = (int(states["count"]), int(states["sum"]))
    return out


class MarkedHAStore(HAStore):
    """Any HA store, saying when `complete()` has written ``chk-N/_metadata`` and is about
    to publish (a wrapper, so the marker works over the embedded store and ZooKeeper)."""

    def __init__(self, inner: HAStore) -> None:
        self.inner = inner
        self.uri = getattr(inner, "uri", None)  # the job directory records the real store

    def read(self) -> HAState:
        return self.inner.read()

    def claim_epoch(self) -> HAState:
        return self.inner.claim_epoch()

    def publish(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        if retained:
            phase("metadata-written", retained[-1].checkpoint_id)
        return self.inner.publish(epoch, retained)

    def check_epoch(self, epoch: int) -> None:
        self.inner.check_epoch(epoch)

    def close(self) -> None:
        self.inner.close()


class Driver:
    def __init__(
        self, storage: Storage, local_dir: Path, parallelism: int, ha: str = "embedded"
    ) -> None:
        self.storage = storage
        self.local_dir = local_dir
        self.parallelism = parallelism
        self.pool = ThreadPoolExecutor(parallelism, thread_name_prefix="task")
        self.backends: list[TaskStateBackend] = []
        phase("start")
        self.coord = CheckpointCoordinator.start(
            storage, MarkedHAStore(open_ha_store(ha, storage, JOB_ID)), job_id=JOB_ID,
            max_parallelism=MAX_PARALLELISM, retain=RETAIN,
        )
        # Faster retries than the production default, so the suite stays short.
        cleaner = self.coord.cleaner
        if hasattr(cleaner, "backoff"):
            cleaner.backoff = Backoff(0.02, 0.5)
        latest = self.coord.latest()
        phase("started", self.coord.epoch, latest[1].checkpoint_id if latest else 0)
        threading.Thread(target=self._report_reconcile, daemon=True).start()

    def _report_reconcile(self) -> None:
        if self.coord.wait_reconciled(None) and self.coord.last_reconcile is not None:
            phase("reconciled", len(self.coord.last_reconcile.orphans))

    # -- tasks ---------------------------------------------------------------------------
    def open_tasks(self) -> None:
        """(Re)open every task's state from the latest completed checkpoint: the restart
        and the rollback after a failed batch are the same operation."""
        for be in self.backends:
            be.close()
        latest = self.coord.latest()
        sources = (
            sources_from_metadata(self.storage, latest[0], latest[1], OPERATOR) if latest else None
        )

        def open_one(i: int) -> TaskStateBackend:
            kg = task_range(i, self.parallelism, MAX_PARALLELISM)
            return TaskStateBackend.open(
                self.local_dir, OPERATOR, kg, MAX_PARALLELISM, sources, transfer_threads=2
            )

        self.backends = list(self.pool.map(open_one, range(self.parallelism)))

    def process(self, b: int, seed: int) -> None:
        parts: list[list[tuple[str, int]]] = [[] for _ in range(self.parallelism)]
        for key, value in batch(seed, b):
            parts[task_of_key(key, self.parallelism, MAX_PARALLELISM)].append((key, value))

        def run(i: int) -> None:
            be = self.backends[i]
            for key, value in parts[i]:
                st = be.for_key(key)
                st.value("count").update((st.value("count").get() or 0) + 1)
                st.value("sum").update((st.value("sum").get() or 0) + value)

        list(self.pool.map(run, range(self.parallelism)))

    def snapshot(self, b: int, which: Sequence[int]) -> list[object]:
        key = layout.checkpoint_metadata_key(b)
        epoch = self.coord.epoch
        return list(
            self.pool.map(
                lambda i: self.backends[i].snapshot(self.storage, epoch, b, key, 2), which
            )
        )

    # -- one batch = one checkpoint ------------------------------------------------------
    def run_batch(self, b: int, seed: int) -> None:
        fail_once = b % ABORT_EVERY == ABORT_AT
        for attempt in range(MAX_RETRIES):
            phase("begin", b)
            self.coord.begin(b)
            self.process(b, seed)
            everyone = range(self.parallelism)
            try:
                if fail_once and attempt == 0:
                    # The last task fails; the others uploaded. Abort, then the straggler's
                    # late upload arrives and must be discarded too.
                    for state in self.snapshot(b, everyone[:-1]):
                        self.coord.acknowledge(b, OPERATOR, state)  # type: ignore[arg-type]
                    phase("abort", b)
                    self.coord.abort(b, "simulated task failure")
                    for state in self.snapshot(b, everyone[-1:]):
                        self.coord.acknowledge(b, OPERATOR, state)  # type: ignore[arg-type]
                    self.open_tasks()
                    continue
                states = self.snapshot(b, everyone)
                phase("uploaded", b)
                for state in states:
                    self.coord.acknowledge(b, OPERATOR, state)  # type: ignore[arg-type]
                self.coord.complete(b, {"batch_id": b})
            except StorageError as e:  # a failed checkpoint: abort, roll back, retry
                print(f"checkpoint {b} failed: {e}", file=sys.stderr, flush=True)
                self.coord.abort(b, f"storage error: {e}")
                self.open_tasks()
                continue
            for be in self.backends:
                be.commit_local(b)
            phase("completed", b)
            return
        raise RuntimeError(f"batch {b}: gave up after {MAX_RETRIES} attempts")

    def run(self, batches: int, seed: int) -> int:
        latest = self.coord.latest()
        first = latest[1].checkpoint_id + 1 if latest else 1
        self.open_tasks()
        for b in range(first, batches + 1):
            self.run_batch(b, seed)
            if b % SAVEPOINT_EVERY == 0:
                phase("savepoint", b)
                self.coord.savepoint(f"sp-{b}")
        for be in self.backends:
            be.close()
        phase("end")
        ok = self.coord.end(JobOutcome.FINISHED, RetentionPolicy.KEEP_LATEST, timeout=60)
        self.coord.close()
        self.coord.ha.close()
        phase("done" if ok else "end-unfinished")
        return 0 if ok else 3


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("job_uri")
    p.add_argument("local_dir", type=Path)
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--delete-fail-rate", type=float, default=0.0,
                   help="inject transient delete failures (FaultyStorage)")
    p.add_argument("--fault-seed", type=int, default=None)
    p.add_argument("--ha", default="embedded",
                   help="HA store: embedded (default) or zookeeper://host:port/path")
    args = p.parse_args(argv)
    storage: Storage = open_storage(args.job_uri)
    if args.delete_fail_rate:
        storage = FaultyStorage(
            storage, seed=args.fault_seed, delete_fail_rate=args.delete_fail_rate
        )
    return Driver(storage, args.local_dir, args.parallelism, args.ha).run(args.batches, args.seed)


if __name__ == "__main__":
    sys.exit(main())
