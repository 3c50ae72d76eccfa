"""statehold's inspection views of a Spark checkpoint location, as rows for
``format("statehold")`` (like pyiceberg's ``inspect`` tables: read-only, one small table
each). Spark's own state rows are not among them: decoding Spark's UnsafeRows, per
operator and store format, is Spark's ``format("statestore")`` source's job.

- ``batches``: each batch in the logs, whether it is committed, whether a restart can
  start after it (and the first reason why not), its time and watermark.
- ``stores``: each state store, the versions it holds, how the newest restartable
  batch's version is held and from which snapshot, bytes needed and held.
- ``files``: each file, its kind, size, batch/version/store where it has one, and
  whether a restart after the newest restartable batch reads it.
- ``needs``: for each committed batch, every file a restart after it reads.
- ``history``: per batch, the sources' end offsets (JSON) and the state each operator
  held after it (what `statehold.spark_checkpoints.history` reports).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from statehold.spark_checkpoints import looks_like_spark_checkpoint, open_spark_checkpoint
from statehold.spark_checkpoints.history import history
from statehold.spark_checkpoints.reports import listing
from statehold.storage import Storage

_BATCHES = (
    "batch long, committed boolean, restartable boolean, timestamp_ms long, "
    "watermark_ms long, why_not string"
)
_STORES = (
    "operator int, partition int, store string, provider string, versions array<long>, "
    "how string, base long, needed_bytes long, bytes long"
)
_FILES = (
    "path string, kind string, bytes long, batch long, version long, operator int, "
    "partition int, store string, needed boolean"
)
_NEEDS = "batch long, path string, bytes long"
_HISTORY = (
    "batch long, committed boolean, timestamp_ms long, watermark_ms long, offsets string, "
    "operators array<struct<operator: int, bytes: long, files: long>>, problem string"
)
#: view name -> its columns (DDL)
VIEWS: dict[str, str] = {
    "batches": _BATCHES,
    "stores": _STORES,
    "files": _FILES,
    "needs": _NEEDS,
    "history": _HISTORY,
}


def is_spark_checkpoint(storage: Storage) -> bool:
    """A Spark checkpoint location (metadata, offsets/ or commits/), not a job directory."""
    return looks_like_spark_checkpoint(storage)


def view_schema(view: str) -> str:
    return VIEWS[view]


def view_rows(view: str, uri: str, storage_options: Mapping[str, Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of `view` of the location at `uri`, read now (in the task that asks)."""
    location = open_spark_checkpoint(uri, **dict(storage_options))
    if view == "history":
        for r in history(location).records:
            operators = None if r.operators is None else [
                (o.operator, o.bytes, o.files) for o in r.operators
            ]
            yield (r.batch, r.committed, r.timestamp_ms, r.watermark_ms,
                   json.dumps(r.offsets, separators=(",", ":")), operators, r.problem)
        return
    if view == "needs":
        found = location.scan()
        for batch in sorted(found.commits):
            for path, size in sorted(location.restart_needs(found, batch).files.items()):
                yield batch, path, size
        return
    listed = listing(location)
    if view == "batches":
        for b in listed.batches:
            yield b.batch, b.committed, b.restartable, b.timestamp_ms, b.watermark_ms, b.why_not
    elif view == "stores":
        for s in listed.stores:
            yield (s.operator, s.partition, s.store, s.provider, s.versions, s.how, s.base,
                   s.needed_bytes, s.bytes)
    elif view == "files":
        found = location.scan()
        restart = listed.restart_batch
        needed = set() if restart is None else set(location.restart_needs(found, restart).files)
        for path, info in sorted(found.files.items()):
            name = found.names[path]
            store = name.store
            yield (path, str(name.kind), info.size, name.batch, name.version,
                   None if store is None else store.operator,
                   None if store is None else store.partition,
                   None if store is None else store.name, path in needed)
