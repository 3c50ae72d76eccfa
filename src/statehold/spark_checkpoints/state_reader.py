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
start with Spark's one-byte state encoding version, except a session window's keys, laid
out for prefix scans (`prefix_keys`). Format v2 takes the version's unique
id from the commit log. transformWithState's column families are read by `tws_state`
(`read_state(state_var=...)`).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from statehold.spark_checkpoints.columnar_rows import flat_columns, is_flat
from statehold.spark_checkpoints.errors import SparkCheckpointError, StateSchemaUnreadable
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint, unique_id
from statehold.spark_checkpoints.prefix_keys import PrefixKeys, prefix_keys
from statehold.spark_checkpoints.rocksdb_snapshot import rocksdb_rows
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import Struct
from statehold.spark_checkpoints.state_files import decompressed, mapped
from statehold.spark_checkpoints.state_records import (
    changelog_batches,
    one_by_one,
    record_batches,
)
from statehold.spark_checkpoints.state_schema import StateSchema, read_state_schema
from statehold.spark_checkpoints.stores import Needs, StoreFiles, resolve
from statehold.spark_checkpoints.unsafe_row import row_decoder, versioned_row_decoder
from statehold.spark_checkpoints.version_changes import VersionChanges
from statehold.storage import StorageError

#: Rows per record batch.
BATCH_ROWS = 4096


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
    files, needs = resolved(location, found, store, batch)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    schema = schema or store_schema(location, found, store)
    arrow = schema.arrow()
    prefixed = prefix_keys(location, found, store, schema.key)
    decode_key, decode_value = row_decoders(schema, store, needs.version, files.provider,
                                            prefixed)
    if is_flat(schema.key) and is_flat(schema.value):
        skip = 1 if files.provider == "rocksdb" else 0
        keys: list[bytes] = []
        values: list[bytes] = []
        for more_keys, more_values in _merged_batches(location, store, needs):
            keys += more_keys
            values += more_values
            while len(keys) >= batch_rows:
                yield _columnar_batch(keys[:batch_rows], values[:batch_rows], schema, arrow,
                                      skip, (decode_key, decode_value), store, prefixed)
                keys, values = keys[batch_rows:], values[batch_rows:]
        if keys:
            yield _columnar_batch(keys, values, schema, arrow, skip, (decode_key, decode_value),
                                  store, prefixed)
        return
    rows: list[tuple[Any, ...]] = []
    for k, value in one_by_one(_merged_batches(location, store, needs)):
        rows.append(decode_key(k) + decode_value(value))
        if len(rows) >= batch_rows:
            yield arrow_batch(rows, arrow, store)
            rows = []
    if rows:
        yield arrow_batch(rows, arrow, store)


def _columnar_batch(
    keys: list[bytes], values: list[bytes], schema: StateSchema, arrow: pa.Schema, skip: int,
    decoders: tuple[Callable[[bytes], tuple[Any, ...]], Callable[[bytes], tuple[Any, ...]]],
    store: StoreId, prefixed: PrefixKeys | None = None,
) -> pa.RecordBatch:
    """Flat keys and values decoded column by column; where any row is not taken as it
    is there, the batch's rows one by one (which refuse or replace as they always have).
    `prefixed`: the keys are encoded for prefix scans."""
    types = list(arrow.types)
    width = len(schema.key.fields)
    key_columns = (prefixed.columns(keys, types[:width]) if prefixed is not None
                   else flat_columns(keys, schema.key, types[:width], skip))
    value_columns = (flat_columns(values, schema.value, types[width:], skip)
                     if key_columns is not None else None)
    if key_columns is None or value_columns is None:
        decode_key, decode_value = decoders
        return arrow_batch([decode_key(k) + decode_value(v) for k, v in zip(keys, values,
                                                                             strict=True)],
                           arrow, store)
    return pa.RecordBatch.from_arrays([*key_columns, *value_columns], schema=arrow)


def store_records(
    location: SparkCheckpoint, found: Scan, store: StoreId, batch: int
) -> Iterator[tuple[bytes, bytes]]:
    """`store`'s (key, value) records as batch `batch` left them, each once, in their
    stored bytes (RocksDB's with their encoding version byte), not decoded."""
    yield from one_by_one(store_record_batches(location, found, store, batch))


def store_record_batches(
    location: SparkCheckpoint, found: Scan, store: StoreId, batch: int
) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """`store_records`, a batch (keys, values) at a time."""
    _files, needs = resolved(location, found, store, batch)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    yield from _merged_batches(location, store, needs)


def store_record_runs(
    location: SparkCheckpoint, found: Scan, store: StoreId, batch: int, *, limit: int
) -> Iterator[Iterator[tuple[list[bytes], list[bytes | None]]]]:
    """`store_record_batches` as runs in key order, each read to its end before the next
    is asked for, a later run's records replacing an earlier's (None: a delete), for a
    writer that keeps that order (`rocksdb_writer.VersionRuns`). A RocksDB store whose
    changes pass `limit` bytes comes as its base snapshot as it is, then its changes a
    `limit` at a time, deletes included: memory holds `limit` of changes, not the
    partition's state. Otherwise (and for an HDFS-backed store, whose snapshot cannot
    say a delete) one run, `store_record_batches`'."""
    files, needs = resolved(location, found, store, batch)
    if not needs.ok:
        raise SparkCheckpointError(needs.problems[0])
    if files.provider != "rocksdb":
        yield _merged_batches(location, store, needs)  # type: ignore[misc]
        return
    steps, bases = _steps_and_bases(needs)
    with tempfile.TemporaryDirectory(prefix="statehold-state-") as tmp:
        changes = VersionChanges(Path(tmp), limit=limit, spill=False)
        based = False
        try:
            for key in steps:
                for keys, values in file_record_batches(location, key, store, Path(tmp)):
                    changes.update([(keys, values)])
                    if changes.full:
                        if not based:
                            based = True
                            yield _snapshot_batches(location, store, bases, Path(tmp))
                        yield changes.taken()
            if based:
                yield changes.taken()
            else:
                yield _merged(location, store, steps, bases, changes,  # type: ignore[misc]
                              Path(tmp))
        finally:
            changes.close()


def _merged_batches(location: SparkCheckpoint, store: StoreId, needs: Needs
                    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The deltas or changelogs after the base snapshot read first into the keys they
    touch (`VersionChanges`: newest wins, in memory or, past a bound, on local disk);
    then `_merged`."""
    steps, bases = _steps_and_bases(needs)
    with tempfile.TemporaryDirectory(prefix="statehold-state-") as tmp:
        changes = VersionChanges(Path(tmp))
        try:
            for key in steps:
                changes.update(file_record_batches(location, key, store, Path(tmp)))
            yield from _merged(location, store, steps, bases, changes, Path(tmp))
        finally:
            changes.close()


def _steps_and_bases(needs: Needs) -> tuple[list[str], list[str]]:
    """The version's deltas or changelogs, and its base snapshot (none, or one)."""
    return ([k for k in needs.files if k.endswith((".delta", ".changelog"))],
            [k for k in needs.files if k.endswith((".snapshot", ".zip"))])


def _snapshot_batches(location: SparkCheckpoint, store: StoreId, bases: list[str], tmp: Path
                      ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    for key in bases:  # a snapshot's records are never deletes
        yield from file_record_batches(location, key, store, tmp)


def _merged(location: SparkCheckpoint, store: StoreId, steps: list[str], bases: list[str],
            changes: VersionChanges, tmp: Path) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The base snapshot streamed, each record not changed given as it is read, the
    surviving `changes` merged in among them by key. A RocksDB store's records come in
    key order (its snapshot is iterated in order, its changes' survivors sorted), which
    lets a writer put them straight into an SST; an HDFS-backed store's in no order. In
    batches: a version of changes alone, or of a snapshot alone, goes without a step per
    record."""
    in_key_order = not any(k.endswith(".delta") for k in steps)
    if not changes.touched:
        yield from _snapshot_batches(location, store, bases, tmp)  # type: ignore[misc]
        return
    survivors = changes.survivors(in_key_order=in_key_order)
    try:
        if not bases:  # changes alone: their survivors are the version
            yield from survivors
            return
        rest = one_by_one(survivors)
        pending = next(rest, None)
        keys: list[bytes] = []
        values: list[bytes] = []
        for key in bases:
            for k, value in file_records(location, key, store, tmp):
                if value is None or k in changes:
                    continue
                while in_key_order and pending is not None and pending[0] < k:
                    keys.append(pending[0])
                    values.append(pending[1])
                    pending = next(rest, None)
                keys.append(k)
                values.append(value)
                if len(keys) >= BATCH_ROWS:
                    yield keys, values
                    keys, values = [], []
        while pending is not None:
            keys.append(pending[0])
            values.append(pending[1])
            pending = next(rest, None)
            if len(keys) >= BATCH_ROWS or pending is None:
                yield keys, values
                keys, values = [], []
        if keys:
            yield keys, values
    finally:
        survivors.close()


def resolved(location: SparkCheckpoint, found: Scan, store: StoreId, batch: int
             ) -> tuple[StoreFiles, Needs]:
    """`store`'s files and what the version committed `batch` wrote (batch + 1) needs
    (format v2: by the commit's unique id); refused where the location's codec is not
    lz4 or the batch is not committed."""
    files = found.stores.get(store)
    if files is None:
        raise SparkCheckpointError(f"{store}: no files in the location")
    codec = location.codec(found)
    if codec != "lz4":
        raise SparkCheckpointError(f"{store}: compressed with {codec}; only lz4 is read")
    if batch not in found.commits:
        raise SparkCheckpointError(f"batch {batch} is not committed in the location")
    uid = (unique_id(location.commit(batch), store, location.store_order(found, store.operator))
           if files.provider == "rocksdb" else None)
    return files, resolve(files, batch + 1, location, uid)


def row_decoders(schema: StateSchema, store: StoreId, version: int, provider: str,
                 prefixed: PrefixKeys | None = None
                 ) -> tuple[Callable[[bytes], tuple[Any, ...]], Callable[[bytes], tuple[Any, ...]]]:
    """The key's and the value's decoder; RocksDB's rows carry Spark's state encoding
    version (one byte, 0) first; `prefixed`: its keys are encoded for prefix scans."""
    skip = 1 if provider == "rocksdb" else 0
    where = f"{store} version {version} (a key)"
    return (prefixed.decoder(where) if prefixed is not None
            else _decoder(schema.key, where, skip),
            _decoder(schema.value, f"{store} version {version} (a value)", skip))


def file_records(location: SparkCheckpoint, key: str, store: StoreId, tmp: Path, *,
                 column_families: bool = False, checksums: bool = False
                 ) -> Iterator[tuple[bytes, bytes | None]]:
    """The raw (key row, value row or None for a delete) records of one state file, in
    file order, streamed: a delta or HDFS snapshot, a changelog, or a snapshot zip's
    RocksDB rebuilt under `tmp` (removed when done). `column_families`: a store of
    transformWithState's is read anyway, its RocksDB iterated and its typed changelogs
    read to their end without their records; `checksums`: each lz4 block's checksum
    verified (both `verify --deep`'s)."""
    return one_by_one(file_record_batches(location, key, store, tmp,
                                          column_families=column_families,
                                          checksums=checksums))


def file_record_batches(location: SparkCheckpoint, key: str, store: StoreId, tmp: Path, *,
                        column_families: bool = False, checksums: bool = False
                        ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    """`file_records`, a batch (keys, values) at a time."""
    if key.endswith(".zip"):
        db = Path(tempfile.mkdtemp(prefix="db-", dir=tmp))
        rows = rocksdb_rows(location, key, store.prefix, db, column_families=column_families)
        try:
            while some := list(itertools.islice(rows, BATCH_ROWS)):
                keys, values = zip(*some, strict=True)
                yield list(keys), list(values)
        finally:
            rows.close()  # its RocksDB closed before its directory goes
            shutil.rmtree(db, ignore_errors=True)
        return
    blocks = file_blocks(location, key, tmp, checksums)
    if key.endswith(".changelog"):
        yield from changelog_batches(blocks, key, typed=column_families)
    else:
        yield from record_batches(blocks, key, deletes=key.endswith(".delta"))


def _decoder(schema: Struct, where: str, skip: int) -> Callable[[bytes], tuple[Any, ...]]:
    return versioned_row_decoder(schema, where) if skip else row_decoder(schema, where)


def file_blocks(location: SparkCheckpoint, key: str, tmp: Path, checksums: bool = False
            ) -> Iterator[bytes]:
    """`key`'s decompressed blocks, from a local copy (or link) mapped a window at a
    time."""
    local = tmp / "file"  # one at a time: a file is read to its end before the next
    local.unlink(missing_ok=True)
    try:
        location.storage.download_to_read(key, local)
    except StorageError as e:
        raise SparkCheckpointError(f"{key}: cannot be read ({e})") from None
    yield from decompressed(mapped(local), key, checksums=checksums)


def arrow_batch(rows: list[tuple[Any, ...]], schema: pa.Schema, store: object) -> pa.RecordBatch:
    try:
        columns = [pa.array(column, type=f.type) for column, f in
                   zip(zip(*rows, strict=True), schema, strict=True)]
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
        detail = " ".join(str(e).split())[:300]
        raise SparkCheckpointError(f"{store}: a value does not fit its column ({detail})") from None
    return pa.RecordBatch.from_arrays(columns, schema=schema)
