"""One state store's rows at a batch, read offline: the files `stores.resolve` names for
the version the batch wrote (batch N writes version N+1), decoded with the store's schema,
as Arrow record batches of key columns then value columns.

HDFS-backed provider: the deltas after the base snapshot are read first into a map of the
keys they touch (newest wins, None for a delete); then the snapshot is streamed, each row
not in that map emitted as it is read; then the map's surviving rows. Memory follows the
deltas since the snapshot (what Spark's maintenance keeps small), not the whole state; a
store with no snapshot yet is all deltas. Files are copied to a temporary directory and
read in chunks, so a remote location is read the same way.

RocksDB stores (zips, SSTs, changelogs) are refused in one line: not read yet.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from statehold.format.spark_layout import Kind, StoreId
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_records import records
from statehold.spark_checkpoints.state_schema import StateSchema, read_state_schema
from statehold.spark_checkpoints.stores import resolve
from statehold.spark_checkpoints.unsafe_row import row_decoder
from statehold.storage import StorageError

#: Rows per record batch.
BATCH_ROWS = 4096
_CHUNK = 1 << 20


def store_schema(location: SparkCheckpoint, found: Scan, store: StoreId) -> StateSchema:
    """The key and value schemas of `store`'s operator and store name; Spark writes them
    once, in partition 0's ``_metadata/schema``. Refused in one line when there is none
    (give one: `read_store`'s `schema`) or it cannot be read."""
    first = StoreId(store.operator, 0, store.name)
    files = found.stores.get(first)
    if files is None or files.schema is None:
        raise SparkCheckpointError(
            f"{store}: no state schema file ({first.prefix}/_metadata/schema); give the "
            "key and value schemas to read it")
    return read_state_schema(location.read(files.schema.key), files.schema.key)


def read_store(
    location: SparkCheckpoint,
    found: Scan,
    store: StoreId,
    batch: int,
    *,
    schema: StateSchema | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """`store`'s rows as batch `batch` left them, `batch_rows` at a time."""
    files = found.stores.get(store)
    if files is None:
        raise SparkCheckpointError(f"{store}: no files in the location")
    if files.provider != "hdfs":
        raise SparkCheckpointError(
            f"{store}: a RocksDB store; only the HDFS-backed provider's state is read yet")
    codec = location.codec(found)
    if codec != "lz4":
        raise SparkCheckpointError(f"{store}: compressed with {codec}; only lz4 is read")
    if batch not in found.commits:
        raise SparkCheckpointError(f"batch {batch} is not committed in the location")
    version = batch + 1
    needs = resolve(files, version, location)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    schema = schema or store_schema(location, found, store)
    arrow = schema.arrow()
    decode_key = row_decoder(schema.key, f"{store} version {version} (a key)")
    decode_value = row_decoder(schema.value, f"{store} version {version} (a value)")

    changed: dict[bytes, bytes | None] = {}
    with tempfile.TemporaryDirectory(prefix="statehold-state-") as tmp:
        for v in range(needs.base + 1, version + 1):
            key = files.key(Kind.DELTA, v)
            changed.update(records(_blocks(location, key, Path(tmp)), key, deletes=True))
        rows: list[tuple[Any, ...]] = []
        if needs.base:
            key = files.key(Kind.HDFS_SNAPSHOT, needs.base)
            for k, value in records(_blocks(location, key, Path(tmp)), key, deletes=False):
                if k in changed or value is None:
                    continue
                rows.append(decode_key(k) + decode_value(value))
                if len(rows) >= batch_rows:
                    yield arrow_batch(rows, arrow, store)
                    rows = []
    for k, value in changed.items():
        if value is not None:
            rows.append(decode_key(k) + decode_value(value))
            if len(rows) >= batch_rows:
                yield arrow_batch(rows, arrow, store)
                rows = []
    if rows:
        yield arrow_batch(rows, arrow, store)


def _blocks(location: SparkCheckpoint, key: str, tmp: Path) -> Iterator[bytes]:
    """`key`'s decompressed blocks, from a local copy read a chunk at a time."""
    local = tmp / "file"
    try:
        location.storage.download(key, local)
    except StorageError as e:
        raise SparkCheckpointError(f"{key}: cannot be read ({e})") from None
    yield from decompressed(_chunks(local), key)


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def arrow_batch(rows: list[tuple[Any, ...]], schema: pa.Schema, store: object) -> pa.RecordBatch:
    try:
        columns = [pa.array(column, type=f.type) for column, f in
                   zip(zip(*rows, strict=True), schema, strict=True)]
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
        detail = " ".join(str(e).split())[:300]
        raise SparkCheckpointError(f"{store}: a value does not fit its column ({detail})") from None
    return pa.RecordBatch.from_arrays(columns, schema=schema)
