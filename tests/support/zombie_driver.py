"""A small driver without Spark for the zombie and session-loss tests: the coordinator loop
over deterministic batches, with real keyed state (TaskStateBackend, RocksDB) so the final
state can be compared exactly with a reference computation.

Run as a program (one driver process of a job)::

    PYTHONPATH=. python tests/support/zombie_driver.py --root DIR --job-id J --ha URI \
        --batches N --local-dir DIR --events FILE [--pause POINT:CHECKPOINT] [--batch-delay S]

It resumes from the HA store (the batch after the latest retained checkpoint), processes
the remaining batches and appends one JSON event per line to `--events`. With `--pause`
it stops itself with SIGSTOP at that point (`mid-upload`, `before-complete`,
`after-complete` of the given checkpoint), so a test can start a second driver meanwhile
and SIGCONT this one later. A driver that finds itself fenced does what a real one does:
aborts its pending checkpoint (its cleaner must refuse: the guard fails), closes and exits
with FENCED_EXIT, reporting what its cleaner deleted after it resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from statehold.backend import TaskStateBackend, all_ranges, sources_from_metadata, task_of_key
from statehold.checkpoint.coordinator import CheckpointCoordinator, CheckpointError
from statehold.format import layout
from statehold.ha.base import FencedError, HAStore
from statehold.ha.open import open_ha_store
from statehold.storage import Storage, open_storage

OPERATOR = "totals"
MAX_PARALLELISM = 16
PARALLELISM = 2
RETAIN = 3
FENCED_EXIT = 3


def batch(n: int) -> list[tuple[str, int]]:
    """The records of batch n: the same on every run and in every driver."""
    rng = random.Random(n)
    return [(f"k{rng.randrange(40)}", rng.randrange(1, 100)) for _ in range(30)]


def reference(batches: int) -> dict[str, int]:
    """Exact running totals after batches 1..`batches`, computed without statehold."""
    totals: dict[str, int] = {}
    for n in range(1, batches + 1):
        for key, value in batch(n):
            totals[key] = totals.get(key, 0) + value
    return totals


def open_tasks(
    storage: Storage, coord: CheckpointCoordinator, local_dir: Path
) -> list[TaskStateBackend]:
    """One state backend per task, restored from the latest retained checkpoint."""
    latest = coord.latest()
    restore = sources_from_metadata(storage, *latest, OPERATOR) if latest else None
    return [
        TaskStateBackend.open(local_dir, OPERATOR, kg, MAX_PARALLELISM, restore)
        for kg in all_ranges(PARALLELISM, MAX_PARALLELISM)
    ]


def apply(tasks: list[TaskStateBackend], n: int) -> None:
    for key, value in batch(n):
        state = tasks[task_of_key(key, PARALLELISM, MAX_PARALLELISM)].value_state("total", key)
        state.update(state.get(0) + value)


def snapshot_all(
    storage: Storage, coord: CheckpointCoordinator, tasks: list[TaskStateBackend], n: int,
    between: Any = None,
) -> None:
    """begin(n), snapshot and acknowledge every task; `between()` runs after the first."""
    coord.begin(n)
    metadata_key = layout.checkpoint_metadata_key(n)
    for i, task in enumerate(tasks):
        coord.acknowledge(n, OPERATOR, task.snapshot(storage, coord.epoch, n, metadata_key))
        if i == 0 and between is not None:
            between()


def totals_of(tasks: list[TaskStateBackend]) -> dict[str, int]:
    out: dict[str, int] = {}
    for task in tasks:
        for key, states in task.items():
            out[str(key)] = int(states["total"])
    return out


def restored_totals(storage: Storage, ha: HAStore, local_dir: Path) -> dict[str, int]:
    """The state of the HA store's latest checkpoint, restored from storage alone."""
    from statehold.format.metadata import read_metadata

    latest = ha.read().latest
    if latest is None:
        return {}
    meta = read_metadata(storage, latest.metadata)
    restore = sources_from_metadata(storage, latest.metadata, meta, OPERATOR)
    out: dict[str, int] = {}
    for kg in all_ranges(PARALLELISM, MAX_PARALLELISM):
        with TaskStateBackend.open(local_dir, OPERATOR, kg, MAX_PARALLELISM, restore) as task:
            for key, states in task.items():
                out[str(key)] = int(states["total"])
    return out


class Events:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def emit(self, event: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
        self.stream.flush()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        if line.strip():
            yield json.loads(line)


def run(args: argparse.Namespace, events: Events) -> int:
    storage = open_storage(args.root).child(args.job_id)
    ha = open_ha_store(args.ha, storage, args.job_id)
    coord = CheckpointCoordinator.start(
        storage, ha, job_id=args.job_id, max_parallelism=MAX_PARALLELISM, retain=RETAIN
    )
    latest = coord.latest()
    first = latest[1].checkpoint_id + 1 if latest else 1
    events.emit("started", epoch=coord.epoch, first_batch=first)
    tasks = open_tasks(storage, coord, Path(args.local_dir))
    point, _, at = (args.pause or "none:0").partition(":")
    pause_at = int(at)
    deleted_at_pause: list[int] = []

    def pause(where: str, n: int) -> None:
        if (where, n) != (point, pause_at):
            return
        if where == "after-complete":
            coord.cleaner.wait_idle(30)  # so the deleted count below is stable
        deleted_at_pause.append(coord.cleaner.status().deleted)
        events.emit("pausing", at=where, checkpoint=n)
        os.kill(os.getpid(), signal.SIGSTOP)
        events.emit("resumed", at=where, checkpoint=n)

    n = first
    try:
        for n in range(first, args.batches + 1):
            apply(tasks, n)
            snapshot_all(storage, coord, tasks, n, lambda n=n: pause("mid-upload", n))
            pause("before-complete", n)
            coord.complete(n, {"batch_id": n})
            for task in tasks:
                task.commit_local(n)
            events.emit("completed", checkpoint=n, epoch=coord.epoch)
            pause("after-complete", n)
            time.sleep(args.batch_delay)
    except (FencedError, CheckpointError) as exc:
        # A zombie: give up the checkpoint the way any driver would. Its files go to the
        # cleaner, whose guard must refuse (the checkpoint's directory may be the new
        # attempt's chk-N).
        coord.abort(n, f"{type(exc).__name__}: {exc}")
        try:
            coord.check_epoch()
            still_current = True
        except FencedError:
            still_current = False
        coord.close(drain_timeout=30)
        status = coord.cleaner.status()
        for task in tasks:
            task.close()
        ha.close()
        events.emit(
            "fenced",
            checkpoint=n,
            error=type(exc).__name__,
            message=str(exc),
            still_current=still_current,
            cleaner_fenced=status.fenced,
            deleted_at_pause=deleted_at_pause[0] if deleted_at_pause else None,
            deleted_total=status.deleted,
        )
        return FENCED_EXIT
    totals = totals_of(tasks)
    coord.close(drain_timeout=60)
    for task in tasks:
        task.close()
    ha.close()
    events.emit("done", epoch=coord.epoch, last=args.batches, totals=totals)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--ha", default="embedded")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--local-dir", required=True)
    p.add_argument("--events", type=Path, required=True)
    p.add_argument("--pause", default=None)
    p.add_argument("--batch-delay", type=float, default=0.0)
    args = p.parse_args(argv)
    with args.events.open("a", buffering=1) as stream:
        return run(args, Events(stream))


if __name__ == "__main__":
    sys.exit(main())
