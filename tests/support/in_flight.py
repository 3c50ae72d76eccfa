"""Jobs caught in the middle of their work, as gc and reconcile find them: a coordinator
of simulated tasks (tests.support.simulated_tasks) on an embedded HA store, the files a
driver that crashed mid-checkpoint leaves behind, orphaned data files, and a running
attempt with a checkpoint in flight."""

from __future__ import annotations

import random

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage
from tests.support.simulated_tasks import RANGES, SimulatedTask, listing, run_checkpoint


def start(storage: Storage, **kwargs: object) -> CheckpointCoordinator:
    """An attempt of job-1 (max parallelism 8, two checkpoints retained), embedded HA."""
    return CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id="job-1", max_parallelism=8, retain=2,
        **kwargs,  # type: ignore[arg-type]
    )


def leave_in_flight_mess(storage: Storage, coord: CheckpointCoordinator,
                         tasks: list[SimulatedTask], n: int) -> set[str]:
    """What a driver crash in the middle of checkpoint `n` leaves behind: uploads,
    a written-but-unpublished `_metadata`, an interrupted atomic write."""
    before = listing(storage)
    coord.begin(n)
    for task in tasks:
        coord.acknowledge(n, "agg", task.snapshot(coord.epoch, n))
    storage.write(layout.checkpoint_metadata_key(n), b"{}")
    storage.write(f"shared/.e{coord.epoch}-c{n}-x.tmp-0123", b"partial")
    return listing(storage) - before


def ours(files: set[str]) -> set[str]:
    return {k for k in files if layout.parse(k).kind not in (Kind.HA, Kind.JOB)}


def add_orphans(storage: Storage, epoch: int, count: int) -> None:
    keys = [f"{layout.SHARED_DIR}/e{epoch}-c{1 + i % 3}-{i:016x}" for i in range(count)]
    root = getattr(storage, "root", None)
    if root is not None:
        (root / layout.SHARED_DIR).mkdir(parents=True, exist_ok=True)
        for key in keys:
            (root / key).write_bytes(b"")
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: storage.write(k, b""), keys))


def running_with_checkpoint_in_flight(storage: Storage, seed: int) -> CheckpointCoordinator:
    """A running attempt: checkpoints 1-3 completed and cleaned up, 4 begun with every
    task's files uploaded and acknowledged."""
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(seed)) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    coord.cleaner.wait_idle(60)
    coord.begin(4)
    for task in tasks:
        coord.acknowledge(4, "agg", task.snapshot(coord.epoch, 4))
    return coord
