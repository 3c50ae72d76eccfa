"""A keyed running-sum pipeline without Spark: the real coordinator and the real RocksDB
task backend, tasks run in this process. For tests that need exact results quickly."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

from statehold.backend import TaskStateBackend, key_group_of, sources_from_metadata, task_range
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.ha.base import HAStore
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage

OPERATOR = "totals"
Batch = dict[str, list[int]]


def make_batch(batch_id: int, seed: int = 0, keys: int = 50, rows: int = 80) -> Batch:
    rng = random.Random(seed * 100_003 + batch_id)
    batch: Batch = defaultdict(list)
    for _ in range(rows):
        batch[f"k{rng.randrange(keys)}"].append(rng.randrange(-50, 100))
    return dict(batch)


def reference(batches: list[Batch]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for batch in batches:
        for key, values in batch.items():
            count, total = totals.get(key, (0, 0))
            totals[key] = (count + len(values), total + sum(values))
    return totals


class MiniPipeline:
    def __init__(
        self,
        storage: Storage,
        local_dir: Path,
        *,
        job_id: str = "mini",
        max_parallelism: int = 16,
        parallelism: int = 2,
        retain: int = 2,
        ha: HAStore | None = None,
        changelog: bool = False,
    ) -> None:
        self.storage = storage
        self.changelog = changelog
        self.local_dir = local_dir
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self.coord = CheckpointCoordinator.start(
            storage, ha or EmbeddedHAStore(storage), job_id=job_id,
            max_parallelism=max_parallelism, retain=retain,
        )

    def next_batch_id(self) -> int:
        latest = self.coord.latest()
        return latest[1].checkpoint_id + 1 if latest else 0

    def _open(self, task: int) -> TaskStateBackend:
        latest = self.coord.latest()
        restore = None
        if latest is not None:
            key, meta = latest
            restore = sources_from_metadata(self.storage, key, meta, OPERATOR)
        return TaskStateBackend.open(
            self.local_dir, OPERATOR, task_range(task, self.parallelism, self.max_parallelism),
            self.max_parallelism, restore, changelog=self.changelog,
        )

    def run_batch(self, batch: Batch) -> int:
        n = self.next_batch_id()
        self.coord.begin(n)
        try:
            for task in range(self.parallelism):
                with self._open(task) as backend:
                    for key, values in batch.items():
                        if key_group_of(key, self.max_parallelism) not in backend.key_groups:
                            continue
                        state = backend.for_key(key)
                        count, total = state.value("count"), state.value("sum")
                        count.update((count.get() or 0) + len(values))
                        total.update((total.get() or 0) + sum(values))
                    handle = backend.snapshot(
                        self.storage, self.coord.epoch, n, f"chk-{n}/_metadata"
                    )
                self.coord.acknowledge(n, OPERATOR, handle)
            self.coord.complete(n, {"batch_id": n})
        except BaseException:
            self.coord.abort(n, "batch failed")
            raise
        return n

    def state(self) -> dict[str, tuple[int, int]]:
        result: dict[str, tuple[int, int]] = {}
        for task in range(self.parallelism):
            with self._open(task) as backend:
                for key, values in backend.items():
                    result[str(key)] = (values["count"], values["sum"])
        return result

    def close(self) -> None:
        self.coord.close()
