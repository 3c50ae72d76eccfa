"""Test helpers that write checkpoint data directly, bypassing the coordinator."""

from __future__ import annotations

import hashlib

from statehold.format import metadata
from statehold.storage import Storage


def bytes_checksum(data: bytes) -> str:
    """The checksum metadata records of a file holding `data`."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_metadata(storage: Storage, key: str, meta: metadata.CheckpointMetadata) -> None:
    """Write a `_metadata` document unconditionally (the coordinator creates it only if
    absent): for tests that build checkpoints by hand."""
    storage.write(key, metadata.encode(meta, key))
