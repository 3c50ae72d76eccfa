"""Helpers for tests of the RocksDB task state backend without Spark: checkpoints written
and read back the way the driver and the next tasks do, snapshots, filled state, and a
storage that records what was downloaded and uploaded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from statehold.backend import TaskStateBackend, sources_from_metadata
from statehold.backend.rocks import RestoreSource
from statehold.format import layout
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupState,
    OperatorState,
    read_metadata,
)
from statehold.storage import Storage
from tests.support.forwarding_storage import ForwardingStorage
from tests.support.job_dir_contents import write_metadata

MAXP = 64
OP = "counts"


class CountingStorage(ForwardingStorage):
    """A real storage that records which keys were downloaded and uploaded."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.downloads: list[str] = []
        self.uploads: list[str] = []

    def download(self, key: str, local_path: Path) -> None:
        self.downloads.append(key)
        self.inner.download(key, local_path)

    def upload(self, local_path: Path, key: str) -> None:
        self.uploads.append(key)
        self.inner.upload(local_path, key)


def checkpoint(
    storage: Storage, cid: int, states: list[KeyGroupState], epoch: int = 1
) -> list[RestoreSource]:
    """Write chk-<cid>/_metadata for `states` and read it back as restore sources, the way
    the driver and the next tasks do."""
    key = layout.checkpoint_metadata_key(cid)
    meta = CheckpointMetadata(
        job_id="job",
        checkpoint_id=cid,
        epoch=epoch,
        max_parallelism=MAXP,
        operators=[OperatorState(operator=OP, ranges=states)],
    )
    write_metadata(storage, key, meta)
    return sources_from_metadata(storage, key, read_metadata(storage, key), OP)


def close_as_a_task(b: TaskStateBackend) -> None:
    """Close `b` as a Spark task does after its snapshot (a compaction it left running
    finishes and is kept for the next open), waiting for that, so runs are repeatable."""
    thread = b.close_after_compactions()
    if thread is not None:
        thread.join()


def snap(b: TaskStateBackend, storage: Storage, cid: int, epoch: int = 1) -> KeyGroupState:
    return b.snapshot(storage, epoch, cid, layout.checkpoint_metadata_key(cid))


def fill(b: TaskStateBackend, keys: Iterable[str], tag: str = "") -> dict[str, dict[str, Any]]:
    """Write value, list and map state for `keys`; return the expected reader view."""
    expected: dict[str, dict[str, Any]] = {}
    for k in keys:
        st = b.for_key(k)
        st.value("count").update(len(k))
        st.list("events").update([k, tag])
        st.map("seen").put(1, {"k": k})
        st.map("seen").put("x", tag)
        expected[k] = {"count": len(k), "events": [k, tag], "seen": {1: {"k": k}, "x": tag}}
    return expected
