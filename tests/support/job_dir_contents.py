"""Test helpers that write checkpoint data directly, bypassing the coordinator, and list
what a job directory holds and what its retained checkpoints name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from statehold.format import layout, metadata
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.storage import Storage
from statehold.storage.base import bytes_checksum

if TYPE_CHECKING:
    from statehold.checkpoint.coordinator import CheckpointCoordinator


__all__ = ["bytes_checksum", "data_files", "listing", "referenced", "write_metadata"]


def write_metadata(storage: Storage, key: str, meta: metadata.CheckpointMetadata) -> None:
    """Write a `_metadata` document unconditionally (the coordinator creates it only if
    absent): for tests that build checkpoints by hand."""
    storage.write(key, metadata.encode(meta, key))


def listing(storage: Storage) -> set[str]:
    """Every key under `storage`, as a listing gives them."""
    return {info.key for info in storage.list()}


def data_files(storage: Storage) -> set[str]:
    """The job directory's checkpoint data and documents: shared, exclusive and ``chk-N``."""
    return {
        k for k in listing(storage)
        if k.split("/", 1)[0] in (layout.SHARED_DIR, layout.EXCLUSIVE_DIR) or k.startswith("chk-")
    }


def referenced(storage: Storage, coord: CheckpointCoordinator) -> set[str]:
    """The retained checkpoints' `_metadata` keys and every file they name."""
    keys: set[str] = set()
    for key, _ in coord.retained():
        keys.add(key)
        keys.update(referenced_keys(read_metadata(storage, key), key))
    return keys


def assert_reconciled_exact(storage: Storage, coord: CheckpointCoordinator, bound: float) -> None:
    """After a reconcile: every file a retained checkpoint names is listed, and nothing
    else of checkpoint data is (no orphan), proven by listing the storage."""
    coord.start_reconcile()
    assert coord.wait_reconciled(bound)
    kept = referenced(storage, coord)
    assert kept <= listing(storage), "a referenced file is missing"
    assert data_files(storage) == kept, "orphans left"
