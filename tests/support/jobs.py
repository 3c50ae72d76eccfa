"""Real job directories for the tools and CLI tests, built by the real coordinator with
simulated tasks (two key-group ranges, max parallelism 4): retained checkpoints, a
savepoint and a stale checkpoint, and the helpers that read and rewrite them."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    OperatorState,
    StateFile,
    encode,
    read_metadata,
    referenced_keys,
)
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage
from tests.support.job_dir_contents import bytes_checksum

MAX_PARALLELISM = 4
#: The coordinators `build_job` started: their leases' renewal threads are stopped after
#: each test (`stop_leases`, tests/conftest.py), or they go on writing into a storage root
#: (a bucket other tests list) until the session ends.
_STARTED: list[CheckpointCoordinator] = []
RANGES = [KeyGroupRange(start=0, end=1), KeyGroupRange(start=2, end=3)]


class Task:
    """Uploads one new shared file per checkpoint and reuses up to two older ones
    (incremental), plus one exclusive file per checkpoint."""

    def __init__(self, storage: Storage, key_groups: KeyGroupRange, rng: random.Random):
        self.storage, self.key_groups, self.rng = storage, key_groups, rng
        self.shared: list[tuple[str, StateFile]] = []

    def snapshot(self, epoch: int, n: int) -> KeyGroupState:
        metadata_key = layout.checkpoint_metadata_key(n)
        data = self.rng.randbytes(self.rng.randint(40, 90))
        key = layout.shared_key(epoch, n, f"kg{self.key_groups.start}")
        self.storage.write(key, data)
        handle = StateFile(path="x", scope=Scope.SHARED, size=len(data),
                           checksum=bytes_checksum(data))
        self.shared = [*self.shared, (key, handle)][-3:]
        ex = self.rng.randbytes(16)
        ex_key = layout.exclusive_key(epoch, n, "manifest")
        self.storage.write(ex_key, ex)
        files = [h.model_copy(update={"path": layout.relativize(metadata_key, k)})
                 for k, h in self.shared]
        files.append(StateFile(path=layout.relativize(metadata_key, ex_key),
                               scope=Scope.EXCLUSIVE, size=len(ex),
                               checksum=bytes_checksum(ex)))
        return KeyGroupState(key_groups=self.key_groups, files=files)


@dataclass
class Job:
    storage: Storage
    coord: CheckpointCoordinator
    tasks: list[Task]

    def checkpoint(self, n: int) -> None:
        self.coord.begin(n)
        for task in self.tasks:
            self.coord.acknowledge(n, "agg", task.snapshot(self.coord.epoch, n))
        self.coord.complete(n, {"batch_id": n})
        assert self.coord.cleaner.wait_idle(60)


def build_job(storage: Storage, *, checkpoints: int = 5, savepoint_at: int | None = 2,
              stale: bool = True, seed: int = 1) -> Job:
    """Checkpoints 1..`checkpoints` (3 retained), a savepoint "sp" taken after checkpoint
    `savepoint_at`, and (`stale`) a ``chk-99`` written but never published, as after a
    crash between the metadata write and the HA publish."""
    rng = random.Random(seed)
    coord = CheckpointCoordinator.start(storage, EmbeddedHAStore(storage), job_id="job-1",
                                        max_parallelism=MAX_PARALLELISM, retain=3)
    _STARTED.append(coord)
    job = Job(storage, coord, [Task(storage, r, rng) for r in RANGES])
    for n in range(1, checkpoints + 1):
        job.checkpoint(n)
        if n == savepoint_at:
            coord.savepoint("sp")
    if stale:
        states = [t.snapshot(coord.epoch, 99) for t in job.tasks]
        meta = CheckpointMetadata(job_id="job-1", checkpoint_id=99, epoch=coord.epoch,
                                  max_parallelism=MAX_PARALLELISM,
                                  operators=[OperatorState(operator="agg", ranges=states)])
        storage.write(layout.checkpoint_metadata_key(99),
                      encode(meta, layout.checkpoint_metadata_key(99)))
    present = set(listing(storage))
    for key in retained_keys(storage) + ([] if savepoint_at is None else
                                         ["savepoints/sp/_metadata"]):
        lost = set(refs(storage, key)) - present
        assert not lost, f"the coordinator lost files of {key} while building: {lost}"
    return job


def listing(storage: Storage) -> dict[str, int]:
    return {i.key: i.size for i in storage.list()}


def refs(storage: Storage, metadata_key: str) -> dict[str, StateFile]:
    return referenced_keys(read_metadata(storage, metadata_key), metadata_key)


def retained_keys(storage: Storage) -> list[str]:
    return [p.metadata for p in EmbeddedHAStore(storage).read().retained]


def rewrite_with_valid_checksum(storage: Storage, metadata_key: str, path: str) -> None:
    """Put `path` into the first file entry and re-sign the document exactly as statehold
    does, so only the path check can refuse it."""
    doc = json.loads(storage.read(metadata_key))
    doc["operators"][0]["ranges"][0]["files"][0]["path"] = path
    body = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    doc["checksum"] = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    storage.write(metadata_key, json.dumps(doc).encode())


def stop_leases() -> None:
    """Stop the lease renewal of every coordinator `build_job` started, the lease file
    left as it is (what a test saw stays so)."""
    while _STARTED:
        coord = _STARTED.pop()
        if coord.lease is not None:
            coord.lease.stop(release=False)
