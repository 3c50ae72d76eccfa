"""Simulated tasks for coordinator-level tests without a state backend: each writes real
files to the job directory for every checkpoint and acknowledges them, as the tasks of a
job with two key-group ranges (max parallelism 8) do."""

from __future__ import annotations

import random

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.cleanup.policy import is_history_record
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    KeyGroupRange,
    KeyGroupState,
    StateFile,
    read_metadata,
    referenced_keys,
)
from statehold.storage import Storage
from tests.support.job_dir_contents import bytes_checksum

MAX_PARALLELISM = 8
RANGES = [KeyGroupRange(start=0, end=3), KeyGroupRange(start=4, end=7)]


class SimulatedTask:
    """Writes one new shared file per checkpoint, keeps reusing up to four older ones
    (incremental), and writes one exclusive file per checkpoint."""

    def __init__(self, storage: Storage, key_groups: KeyGroupRange, rng: random.Random):
        self.storage = storage
        self.key_groups = key_groups
        self.rng = rng
        self.shared: list[tuple[str, StateFile]] = []  # (job key, handle as of creation)

    def restore(self, coord: CheckpointCoordinator) -> SimulatedTask:
        """Forget uploads of unfinished checkpoints: a restored task reuses only files of
        the latest completed checkpoint (like the real state backend)."""
        latest = coord.latest()
        self.shared = []
        if latest is not None:
            metadata_key, meta = latest
            for _op, kg, f in meta.state_files():
                if kg.key_groups == self.key_groups and f.scope is Scope.SHARED:
                    self.shared.append((layout.resolve(metadata_key, f.path), f))
        return self

    def snapshot(self, epoch: int, checkpoint_id: int) -> KeyGroupState:
        metadata_key = layout.checkpoint_metadata_key(checkpoint_id)
        data = self.rng.randbytes(64)
        key = layout.shared_key(epoch, checkpoint_id, f"kg{self.key_groups.start}")
        self.storage.write(key, data)
        handle = StateFile(path="x", scope=Scope.SHARED, size=len(data),
                           checksum=bytes_checksum(data))
        self.shared = ([*self.shared, (key, handle)])[-4:]
        if self.rng.random() < 0.3 and len(self.shared) > 1:
            self.shared.pop(0)  # compaction dropped the oldest file
        ex_data = self.rng.randbytes(16)
        ex_key = layout.exclusive_key(epoch, checkpoint_id, "manifest")
        self.storage.write(ex_key, ex_data)
        files = [h.model_copy(update={"path": layout.relativize(metadata_key, k)})
                 for k, h in self.shared]
        files.append(StateFile(path=layout.relativize(metadata_key, ex_key),
                               scope=Scope.EXCLUSIVE, size=len(ex_data),
                               checksum=bytes_checksum(ex_data)))
        return KeyGroupState(key_groups=self.key_groups, files=files)


def run_checkpoint(coord: CheckpointCoordinator, tasks: list[SimulatedTask], n: int) -> None:
    coord.begin(n)
    for task in tasks:
        coord.acknowledge(n, "agg", task.snapshot(coord.epoch, n))
    coord.complete(n, {"batch_id": n})


def referenced_by_retained(storage: Storage, coord: CheckpointCoordinator) -> set[str]:
    keys: set[str] = set()
    for metadata_key, _ in coord.retained():
        keys.add(metadata_key)
        keys.update(referenced_keys(read_metadata(storage, metadata_key), metadata_key))
    return keys


def listing(storage: Storage) -> set[str]:
    """The job directory's files, the checkpoint history's records left out."""
    return {info.key for info in storage.list() if not is_history_record(info.key)}
