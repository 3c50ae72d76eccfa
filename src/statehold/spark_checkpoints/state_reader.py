"""One state store's rows at a batch, read offline: the files `stores.resolve` names for
the version the batch wrote (batch N writes version N+1), decoded with the store's schema,
as Arrow record batches of key columns then value columns.

HDFS-backed provider: the deltas after the base snapshot are read first into a map of the
keys they touch (newest wins, None for a delete); then the snapshot is streamed, each row
not in that map emitted as it is read; then the map's surviving rows. Memory follows the
deltas since the snapshot (what Spark's maintenance keeps small), not the whole state; a
store with no snapshot yet is all deltas. Files are copied to a temporary directory and
read in chunks, so a remote location is read the same way.

RocksDB provider: the same, with the changelogs after the base snapshot as the map, and
the snapshot zip's RocksDB rebuilt and iterated (`rocksdb_snapshot`); its keys and values
start with Spark's one-byte state encoding version. Format v2 takes the version's unique
id from the commit log. Column families (transformWithState) are refused in one line.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from statehold.spark_checkpoints.errors import SparkCheckpointError, StateSchemaUnreadable
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint, unique_id
from statehold.spark_checkpoints.rocksdb_snapshot import rocksdb_rows
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import Struct
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_records import changelog_records, records
from statehold.spark_checkpoints.state_schema import StateSchema, read_state_schema
from statehold.spark_checkpoints.stores import resolve
from statehold.spark_checkpoints.unsafe_row import row_decoder
from statehold.storage import StorageError

#: Rows per record batch.
BATCH_ROWS = 4096
_CHUNK = 1 << 20


def store_schema(location: SparkCheckpoint, found: Scan, store: StoreId) -> StateSchema:
    """The key and value schemas of `store`'s operator and store name; Spark writes them
    once, in partition 0's ``_metadata/schema``. StateSchemaUnreadable (one line) when
    there is none or it cannot be read: the caller gives one (`read_store`'s `schema`)."""
    first = StoreId(store.operator, 0, store.name)
    files = found.stores.get(first)
    if files is None or files.schema is None:
        raise StateSchemaUnreadable(
            f"{store}: no state schema file ({first.prefix}/_metadata/schema); give the "
            "key and value schemas to read it")
    try:
        return read_state_schema(location.read(files.schema.key), files.schema.key)
    except StateSchemaUnreadable:
        raise
    except SparkCheckpointError as e:
        raise StateSchemaUnreadable(f"{e}; give the key and value schemas to read it") from None


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
    codec = location.codec(found)
    if codec != "lz4":
        raise SparkCheckpointError(f"{store}: compressed with {codec}; only lz4 is read")
    if batch not in found.commits:
        raise SparkCheckpointError(f"batch {batch} is not committed in the location")
    version = batch + 1
    rocks = files.provider == "rocksdb"
    uid = (unique_id(location.commit(batch), store, location.store_order(found, store.operator))
           if rocks else None)
    needs = resolve(files, version, location, uid)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    schema = schema or store_schema(location, found, store)
    arrow = schema.arrow()
    # RocksDB's keys and values carry Spark's state encoding version (one byte, 0) first
    skip = 1 if rocks else 0
    decode_key = _decoder(schema.key, f"{store} version {version} (a key)", skip)
    decode_value = _decoder(schema.value, f"{store} version {version} (a value)", skip)

    steps = [k for k in needs.files if k.endswith((".delta", ".changelog"))]
    bases = [k for k in needs.files if k.endswith((".snapshot", ".zip"))]
    changed: dict[bytes, bytes | None] = {}
    rows: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory(prefix="statehold-state-") as tmp:
        for key in steps:
            blocks = _blocks(location, key, Path(tmp))
            changed.update(changelog_records(blocks, key) if rocks
                           else records(blocks, key, deletes=True))
        for key in bases:
            base: Iterator[tuple[bytes, bytes | None]]
            if rocks:
                (Path(tmp) / "db").mkdir()
                base = rocksdb_rows(location, key, store.prefix, Path(tmp) / "db")
            else:
                base = records(_blocks(location, key, Path(tmp)), key, deletes=False)
            for k, value in base:
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


def _decoder(schema: Struct, where: str, skip: int) -> Callable[[bytes], tuple[Any, ...]]:
    decode = row_decoder(schema, where)
    if not skip:
        return decode

    def versioned(data: bytes) -> tuple[Any, ...]:
        if data[:1] != b"\x00":
            raise SparkCheckpointError(
                f"{where}: state encoding version {data[:1].hex() or 'missing'}, not 00")
        return decode(data[1:])

    return versioned


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
