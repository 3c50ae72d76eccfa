"""Repartition a Spark checkpoint location's state: a new location whose batch N restarts
with M shuffle partitions (`spark.sql.shuffle.partitions` is fixed at a query's first run
and recorded in its offsets; Spark has no way to change it).

Every key goes where the restarted query's shuffle sends its rows: partition
``pmod(murmur3(partitioning columns, seed 42), M)`` (`spark_hash`), the partitioning
columns being the operator's own, found from its state key schema:

- an aggregation (``stateStoreSave``; a window's key holds the window struct),
  ``dropDuplicates`` (``dedupe``, ``dedupeWithinWatermark``), ``flatMapGroupsWithState`` and
  ``applyInPandasWithState``: the whole key, in order;
- a session window (``sessionWindowStateStoreSaveExec``): the key less its session start,
  the operator metadata's ``numColsPrefixKey`` columns;
- a stream-stream join (``symmetricHashJoin``): the join keys, i.e. ``keyToNumValues``'s
  whole key and ``keyWithIndexToValue``'s without its trailing ``index``.

Without operator metadata (Spark 3.5 writes none) the operator is recognised by its
stores: the four join stores, a session window's key ending in ``sessionStartTime``, any
other single ``default`` store as the whole key. Refused in one line, with nothing
written: a global limit or an operator not listed (transformWithState among them), a
location recorded with ``useStrictDistribution=false`` (its shuffle may have used fewer
columns) or with row checksums, a codec other than lz4; for RocksDB, keys encoded for
prefix scans (a session window's), state encoded as avro, a table format version RocksDB 8
cannot read.

DEST holds what `savepoint` copies for a restart at N, except: the offsets' recorded
shuffle partitions and the operator metadata's ``numPartitions`` rewritten to M, each
store's schema file in partition 0 only, and every store's state as one snapshot per new
partition (an empty one where no key goes), its records copied byte for byte: an
HDFS-backed store's ``N+1.snapshot``, a RocksDB store's ``N+1.zip`` and the SSTs it names
(`rocksdb_writer`; with changelog checkpointing on too: a restart loads the snapshot and
writes changelogs after it). Checkpoint format v2: each new snapshot is ``N+1_<id>.zip``
under a new id, and ``commits/N`` names those ids (Spark loads a version's own snapshot as
the whole truth, with no lineage before it).
``commits/N`` is written last, then DEST is verified; an interrupted repartition leaves
no commit, so no location a query would restart from.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from pydantic import BaseModel

from statehold.format.signed import load_json
from statehold.progress import NoProgress, Progress
from statehold.spark_checkpoints.columnar_hash import partitions_of
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import (
    COMMITS_DIR,
    DEFAULT_STORE,
    OFFSETS_DIR,
    Kind,
    StoreId,
    crc_of,
    is_decimal,
    parse,
    version_file,
)
from statehold.spark_checkpoints.location import MAX_PARTITIONS, SparkCheckpoint
from statehold.spark_checkpoints.prefix_keys import PrefixKeys, prefix_keys
from statehold.spark_checkpoints.relocate import hadoop_crc
from statehold.spark_checkpoints.rocksdb_writer import (
    DEFAULT_FORMAT_VERSION,
    FORMAT_VERSIONS,
    BuiltVersion,
    VersionRuns,
    build_version,
    metadata_extra,
)
from statehold.spark_checkpoints.rollback_marker import refuse_unfinished
from statehold.spark_checkpoints.savepoint import (
    check_destination,
    needs_at,
    open_destination,
    restart_files,
    verify_copy,
)
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_hash import partition_of
from statehold.spark_checkpoints.spark_types import Atomic, SparkType, Struct
from statehold.spark_checkpoints.state_files import mapped, read_zip_metadata
from statehold.spark_checkpoints.state_reader import (
    resolved,
    store_record_batches,
    store_record_runs,
    store_schema,
)
from statehold.spark_checkpoints.state_records import one_by_one
from statehold.spark_checkpoints.state_writer import SnapshotWriter
from statehold.spark_checkpoints.tws_records import tws_records
from statehold.spark_checkpoints.tws_state import (
    TwsOperator,
    family_id,
    family_prefix,
    grouping_router,
    partition_ids,
    tws_operator,
)
from statehold.spark_checkpoints.unsafe_row import row_decoder
from statehold.spark_checkpoints.workers import Workers
from statehold.storage import LocalStorage, Storage, StorageError

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_STRICT = "spark.sql.streaming.statefulOperator.useStrictDistribution"
_CODEC = "spark.sql.streaming.stateStore.compression.codec"
_ENCODING = "spark.sql.streaming.stateStore.encodingFormat"
_ROW_CHECKSUM = "spark.sql.streaming.stateStore.rowChecksum.enabled"
_ROCKSDB_FORMAT = "spark.sql.streaming.stateStore.rocksdb.formatVersion"
#: Hadoop's file system scheme for an object store statehold names otherwise.
_HADOOP_SCHEMES = {"s3": "s3a"}
#: Operators whose state key is exactly what their shuffle hashes.
_WHOLE_KEY = {"stateStoreSave", "dedupe", "dedupeWithinWatermark", "flatMapGroupsWithState",
              "applyInPandasWithState"}
#: An operator without metadata whose one store's key is what its shuffle hashes.
_ONE_STORE = "aggregation, dropDuplicates or flatMapGroupsWithState"
_SESSION = "sessionWindowStateStoreSaveExec"
_JOIN = "symmetricHashJoin"
#: A stream-stream join's four stores (`key_delete` deletes a key from them together).
JOIN_STORES = {f"{side}-{kind}" for side in ("left", "right")
               for kind in ("keyToNumValues", "keyWithIndexToValue")}
#: Keys hashed at once (`columnar_hash`): the batch's rows and their slots in memory.
_HASH_BATCH = 4096


class StorePlan(BaseModel):
    """How one store of an operator is repartitioned, and what it held."""

    store: str
    #: The key columns hashed (names in the state key schema; nested ones whole).
    partitioning: list[str]
    rows: int = 0
    #: Rows per new partition.
    per_partition: list[int] = []


class OperatorPlan(BaseModel):
    operator: int
    #: Spark's name of the operator (its metadata's), or what its stores say it is.
    name: str
    #: Where the name came from: ``metadata`` or ``stores`` (no operator metadata).
    known_from: str
    stores: list[StorePlan]


class RepartitionReport(BaseModel):
    """What a repartition wrote, and from what."""

    source: str
    dest: str
    #: The batch a query started on `dest` has completed (it continues with batch + 1).
    batch: int
    partitions_before: int
    partitions: int
    operators: list[OperatorPlan]
    files: int
    bytes: int
    verified: bool


@dataclass(frozen=True)
class _Store:
    name: str
    schema: Struct
    columns: tuple[int, ...]
    source: list[StoreId]
    #: ``hdfs`` or ``rocksdb``.
    provider: str = "hdfs"
    #: RocksDB: the zip metadata's fields after numKeys, as the location's Spark writes them.
    zip_extra: dict[str, Any] | None = None
    #: A transform's records (`StoreChange.records`); None: the source's, bytes unchanged.
    records: Records | None = None
    #: RocksDB keys laid out for prefix scans (a session window's): hashed by the prefix.
    prefixed: PrefixKeys | None = None
    #: transformWithState's column families: each record routed by its grouping key.
    tws: TwsOperator | None = None


#: A source partition's records as written to the new location: (the key's values, key
#: bytes, value bytes), RocksDB's bytes with their encoding version byte; called with the
#: partition, the batch, and whether the store is RocksDB's (`versioned`).
Records = Callable[[StoreId, int, bool], Iterator[tuple[tuple[Any, ...], bytes, bytes]]]


@dataclass(frozen=True)
class StoreChange:
    """What a transform changes: one operator's one store, its rows from `records`, its
    key schema (what its new keys hash by) and, where the schema changed, the schema
    file partition 0 gets instead of the source's."""

    operator: int
    store: str
    key: Struct
    records: Records
    schema_file: bytes | None = None


@dataclass
class Rewritten:
    """What `rewrite` wrote: where, at which batch, with how many partitions."""

    dest: str
    batch: int
    partitions_before: int
    partitions: int
    operators: list[OperatorPlan]
    written: dict[str, int]


def repartition(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    partitions: int,
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> RepartitionReport:
    """Write at `dest` (empty or absent) a location whose batch `batch` (default: the
    newest restartable) restarts with `partitions` shuffle partitions. Everything that
    can be refused is refused before the first write; the source is only read."""
    done = rewrite(checkpoint, dest, partitions=partitions, batch=batch, progress=progress,
                   dest_options=dest_options)
    return RepartitionReport(
        source=checkpoint.uri, dest=done.dest, batch=done.batch,
        partitions_before=done.partitions_before, partitions=done.partitions,
        operators=done.operators, files=len(done.written), bytes=sum(done.written.values()),
        verified=True,
    )


def rewrite(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    partitions: int | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
    changes: Sequence[StoreChange] = (),
) -> Rewritten:
    """The one writing path of repartition and transform: DEST holds what a restart after
    `batch` needs, every key of the operators rewritten where Spark's hash sends it among
    `partitions` (default: the recorded number), each of `changes`' stores from its records
    (all of one operator). With `changes` and the recorded number, only their operator is
    rewritten: the others' files
    are copied as they are. DEST's commit last, then DEST verified."""
    if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
        raise SparkCheckpointError(f"--partitions must be 1 to {MAX_PARTITIONS}, not {partitions}")
    progress = progress or NoProgress()
    out = open_destination(dest, dest_options)
    found = checkpoint.scan()
    refuse_unfinished(checkpoint.storage, found, "transform" if changes else "repartition")
    needs = needs_at(checkpoint, found, batch)
    n = needs.batch
    files = restart_files(checkpoint, found, needs)
    before = _recorded_partitions(checkpoint, f"{OFFSETS_DIR}/{n}")
    m = before if partitions is None else partitions
    changed_ops = {c.operator for c in changes}
    if len(changed_ops) > 1:
        raise SparkCheckpointError("a transform changes one operator's stores; nothing written")
    if changed_ops - set(found.operators):
        raise SparkCheckpointError(
            f"no operator {min(changed_ops)} in the location (its operators: "
            f"{', '.join(map(str, sorted(found.operators))) or 'none'}); nothing written")
    offsets = {k: _offsets_text(checkpoint, k, m) for k in files
               if parse(k).kind is Kind.OFFSETS}
    _refuse_unsupported(checkpoint, found, n)
    ops = set(found.operators) if not changes or m != before else changed_ops
    plans = {op: _plan(checkpoint, found, op, n, changes) for op in ops}
    metadata = {k: _operator_metadata_text(checkpoint, k, m, out.uri) for k in files
                if parse(k).kind is Kind.OPERATOR_METADATA and "/_stateSchema/" not in k}
    check_destination(checkpoint, out)

    written: dict[str, int] = {}
    last = f"{COMMITS_DIR}/{n}"
    commit_files = [k for k in (crc_of(last), f"{last}.crc", last) if k in files]
    schemas = {files_of.schema.key for sid, files_of in found.stores.items()
               if sid.partition == 0 and files_of.schema is not None}
    new_schema: dict[str, bytes] = {}
    for change in changes:
        if change.schema_file is not None:
            schema_of = found.stores[StoreId(change.operator, 0, change.store)].schema
            assert schema_of is not None  # the change was made from it
            new_schema[schema_of.key] = change.schema_file
    rewritten = set(offsets) | set(metadata) | set(new_schema)
    for key in sorted(files):
        parsed = parse(key)
        subject = parse(parsed.of) if parsed.kind is Kind.CRC and parsed.of else parsed
        if key in commit_files or subject.key in rewritten:
            continue
        if (subject.store is not None and subject.store.operator in ops
                and subject.key not in schemas):
            continue  # state: written below
        _copy(checkpoint, out, key)
        written[key] = files[key]
    with_crc = any(parse(k).kind is Kind.CRC for k in found.files if k.startswith("state/"))
    for key, text in {**offsets, **metadata}.items():
        data = text.encode("utf-8")
        _write(out, key, data, written, crc=crc_of(key) in found.files)
    for key, data in new_schema.items():
        _write(out, key, data, written, crc=crc_of(key) in found.files)

    v2 = bool(checkpoint.commit(n).stateUniqueIds)
    ids: dict[StoreId, str] | None = {} if v2 else None
    reports = []
    workers = max((_workers(checkpoint, found, store) for _name, _from, stores in plans.values()
                   for store in stores), default=0)
    with _pool(workers) as pool:
        for op, (op_name, known_from, stores) in sorted(plans.items()):
            store_reports = []
            for store in stores:
                report = _repartition_store(checkpoint, found, out, op, store, n, m,
                                            written, with_crc, progress, ids, pool)
                store_reports.append(report)
            reports.append(OperatorPlan(operator=op, name=op_name, known_from=known_from,
                                        stores=store_reports))
    if ids is None:
        for key in commit_files:
            _copy(checkpoint, out, key)
            written[key] = files[key]
    else:
        _write(out, last, _commit_text(checkpoint, found, n, m, ids), written,
               crc=crc_of(last) in files)
    verify_copy(out, written, n)
    return Rewritten(dest=out.uri, batch=n, partitions_before=before, partitions=m,
                     operators=reports, written=written)


# -- refusals and plans -------------------------------------------------------------------
def _refuse_unsupported(checkpoint: SparkCheckpoint, found: Scan, batch: int) -> None:
    conf = checkpoint.offsets(batch).metadata.conf
    codec = conf.get(_CODEC, "lz4")
    if codec != "lz4":
        raise SparkCheckpointError(f"state compressed with {codec}: only lz4 is repartitioned")
    if conf.get(_STRICT, "true").lower() == "false":
        raise SparkCheckpointError(
            f"the offsets record {_STRICT}=false: the query's shuffle may hash fewer "
            "columns than its state key, so where a key goes cannot be derived")
    if conf.get(_ROW_CHECKSUM, "false").lower() == "true":
        raise SparkCheckpointError(
            f"the offsets record {_ROW_CHECKSUM}=true: state rows with checksums are not "
            "repartitioned yet")
    if checkpoint.commit(batch).stateUniqueIds and any(
            f.provider != "rocksdb" for f in found.stores.values()):
        raise SparkCheckpointError(
            "the commit log holds state unique ids (checkpoint format v2) for a store that "
            "is not RocksDB's")
    if any(f.provider == "rocksdb" for f in found.stores.values()):
        encoding = conf.get(_ENCODING, "unsaferow")
        if encoding != "unsaferow":
            raise SparkCheckpointError(
                f"RocksDB state encoded as {encoding}: only unsaferow is repartitioned")
        version = conf.get(_ROCKSDB_FORMAT, str(DEFAULT_FORMAT_VERSION))
        if not is_decimal(version) or int(version) not in FORMAT_VERSIONS:
            raise SparkCheckpointError(
                f"the offsets record {_ROCKSDB_FORMAT}={version}: statehold writes RocksDB "
                f"table format versions {FORMAT_VERSIONS.start} to {FORMAT_VERSIONS.stop - 1}")


def operator_doc(checkpoint: SparkCheckpoint, found: Scan, op: int, batch: int
                  ) -> dict[str, Any] | None:
    """The operator's newest metadata written by `batch` or before (v2, else v1)."""
    v2 = sorted(
        (int(k.rsplit("/", 1)[1]), k) for k in found.operator_files
        if k.startswith(f"state/{op}/_metadata/v2/") and is_decimal(k.rsplit("/", 1)[1])
    )
    candidates = [k for b, k in reversed(v2) if b <= batch]
    v1 = f"state/{op}/_metadata/metadata"
    if v1 in found.files:
        candidates.append(v1)
    for key in candidates:
        body = checkpoint.read(key).partition(b"\n")[2]
        doc = load_json(body, where=key, error=SparkCheckpointError)
        if isinstance(doc, dict):
            return doc
    return None


def _plan(checkpoint: SparkCheckpoint, found: Scan, op: int, batch: int,
          changes: Sequence[StoreChange] = ()) -> tuple[str, str, list[_Store]]:
    """The operator's name, where it came from, and each store's partitioning columns
    (a store `changes` changes: by its new key schema, its records the change's)."""
    doc = operator_doc(checkpoint, found, op, batch)
    info = (doc.get("operatorInfo") or {}) if doc else {}
    stores_info = {str(s.get("storeName", DEFAULT_STORE)): s
                   for s in ((doc or {}).get("stateStoreInfo") or []) if isinstance(s, dict)}
    name = info.get("operatorName") if isinstance(info, dict) else None
    ids = sorted(s for s in checkpoint.expected_stores(found) if s.operator == op)
    names = sorted({s.name for s in ids})
    tws = tws_operator(checkpoint, found, op, DEFAULT_STORE) if names == [DEFAULT_STORE] else None
    if tws is not None or (isinstance(name, str) and "transformwithstate" in name.lower()):
        if tws is None:
            raise SparkCheckpointError(
                f"operator {op} ({name}): no state schema v3 file to read its column "
                "families with; nothing written")
        mine = [c for c in changes if c.operator == op]
        records = mine[0].records if mine else None
        source = [s for s in ids if s.name == DEFAULT_STORE]
        if {found.stores[s].provider for s in source if s in found.stores} != {"rocksdb"}:
            raise SparkCheckpointError(f"operator {op} ({name}): not RocksDB's state")
        grouping = tws.grouping
        return str(name or "transformWithState"), "metadata", [_Store(
            DEFAULT_STORE, grouping, tuple(range(len(grouping.fields))), source, "rocksdb",
            tws.zip_fields, records, tws=tws)]
    schemas = {n: store_schema(checkpoint, found, StoreId(op, 0, n)) for n in names}
    known_from = "metadata"
    if not isinstance(name, str):
        known_from = "stores"
        name = _recognised(names, {n: s.key for n, s in schemas.items()})
    changed = {c.store: c for c in changes if c.operator == op}
    if set(changed) - set(names):
        raise SparkCheckpointError(
            f"operator {op} ({name}) has stores {', '.join(names)}, not "
            f"{', '.join(sorted(set(changed) - set(names)))}; nothing written")
    stores = []
    for store in names:
        change = changed.get(store)
        key = change.key if change is not None else schemas[store].key
        records = change.records if change is not None else None
        prefix = stores_info.get(store, {}).get("numColsPrefixKey", 0)
        columns = _partitioning(op, name, store, key, prefix)
        source = [s for s in ids if s.name == store]
        providers = {found.stores[s].provider for s in source if s in found.stores}
        if providers == {"rocksdb"}:
            prefixed = prefix_keys(checkpoint, found, StoreId(op, 0, store), key)
            if prefixed is not None and columns != tuple(range(prefixed.count)):
                raise SparkCheckpointError(
                    f"operator {op} ({name}) store {store}: RocksDB keys encoded for prefix "
                    f"scans by {prefixed.count} columns, not the {len(columns)} it is "
                    "partitioned by")
            extra = _zip_extra(checkpoint, found, op, store, source, batch)
            stores.append(_Store(store, key, columns, source, "rocksdb", extra, records,
                                 prefixed))
        elif providers <= {"hdfs"}:
            stores.append(_Store(store, key, columns, source, records=records))
        else:
            raise SparkCheckpointError(
                f"operator {op} store {store}: partitions kept by different providers "
                f"({', '.join(sorted(providers))})")
    return name, known_from, stores


def _zip_extra(checkpoint: SparkCheckpoint, found: Scan, op: int, store: str,
               source: list[StoreId], batch: int) -> dict[str, Any]:
    """What the zips the batch's version loads from hold after numKeys (Spark 4's column
    family fields); a store with column families that is not transformWithState's with
    a state schema v3 to read them by (`_plan` takes those) is refused."""
    for sid in source:
        _files, needs = resolved(checkpoint, found, sid, batch)
        for key in needs.files:
            if key.endswith(".zip"):
                meta = read_zip_metadata(checkpoint.read(key), key)
                extra = meta.model_extra or {}
                if extra.get("columnFamilyMapping"):
                    raise SparkCheckpointError(
                        f"operator {op} store {store}: RocksDB column families without a "
                        "state schema v3 to read them by; nothing written")
                return metadata_extra(extra)
    return {}


def _recognised(names: list[str], keys: dict[str, Struct]) -> str:
    """What an operator without metadata is, from its stores."""
    if set(names) == JOIN_STORES:
        return _JOIN
    if names == [DEFAULT_STORE]:
        fields = keys[DEFAULT_STORE].fields
        if fields and fields[-1].name == "sessionStartTime":
            return _SESSION
        return _ONE_STORE
    return f"an operator with stores {', '.join(names)}"


def _partitioning(op: int, name: str, store: str, key: Struct, prefix: Any) -> tuple[int, ...]:
    """The indices of the key columns the operator's shuffle hashes."""
    fields = key.fields
    where = f"operator {op} ({name}) store {store}"
    if not fields or all(_void(f.type) for f in fields):
        raise SparkCheckpointError(f"{where}: a key without values (a global limit?) "
                                   "is not partitioned by hash")
    if (name in _WHOLE_KEY or name == _ONE_STORE) and store == DEFAULT_STORE:
        return tuple(range(len(fields)))
    if name == _SESSION and store == DEFAULT_STORE:
        count = prefix if isinstance(prefix, int) and prefix > 0 else len(fields) - 1
        if not 0 < count < len(fields) or fields[-1].name != "sessionStartTime":
            raise SparkCheckpointError(f"{where}: a session window key {_names(key)} whose "
                                       "grouping columns cannot be told")
        return tuple(range(count))
    if name == _JOIN and store in JOIN_STORES:
        if store.endswith("keyToNumValues"):
            return tuple(range(len(fields)))
        last = fields[-1]
        if len(fields) < 2 or last.name != "index" or last.type != Atomic("long"):
            raise SparkCheckpointError(f"{where}: a key {_names(key)} without its index")
        return tuple(range(len(fields) - 1))
    raise SparkCheckpointError(
        f"{where}: not an operator whose partitioning statehold knows; nothing written")


def _void(t: SparkType) -> bool:
    return isinstance(t, Atomic) and t.name == "void"


def _names(key: Struct) -> str:
    return "(" + ", ".join(f.name for f in key.fields) + ")"


# -- rewritten logs -----------------------------------------------------------------------
def _recorded_partitions(checkpoint: SparkCheckpoint, key: str) -> int:
    value = checkpoint.offsets(int(key.rsplit("/", 1)[1])).metadata.conf.get(SHUFFLE_PARTITIONS)
    if value is None or not is_decimal(value):
        raise SparkCheckpointError(f"{key}: no {SHUFFLE_PARTITIONS} recorded")
    return int(value)


def _offsets_text(checkpoint: SparkCheckpoint, key: str, partitions: int) -> str:
    """``offsets/B`` with its recorded shuffle partitions set to `partitions`, every other
    byte as it was."""
    text = checkpoint.read(key).decode("utf-8")
    head, sep, rest = text.partition("\n")
    meta, sep2, tail = rest.partition("\n")
    pattern = re.compile(rf'("{re.escape(SHUFFLE_PARTITIONS)}"\s*:\s*")(\d+)(")')
    new_meta, count = pattern.subn(lambda m: f"{m[1]}{partitions}{m[3]}", meta)
    if count != 1:
        raise SparkCheckpointError(f"{key}: no {SHUFFLE_PARTITIONS} recorded in its metadata")
    doc = json.loads(new_meta)
    if doc.get("conf", {}).get(SHUFFLE_PARTITIONS) != str(partitions):
        raise SparkCheckpointError(f"{key}: {SHUFFLE_PARTITIONS} is not where it is expected")
    return head + sep + new_meta + sep2 + tail


def _operator_metadata_text(checkpoint: SparkCheckpoint, key: str, partitions: int,
                            dest_uri: str) -> str:
    """An operator metadata file with each store's ``numPartitions`` set to `partitions`,
    and the absolute paths of its state schema files (v2: transformWithState's) moved to
    the same files in DEST, so DEST does not read the source's when Spark restarts."""
    text = checkpoint.read(key).decode("utf-8")
    version, sep, body = text.partition("\n")
    doc = load_json(body.encode("utf-8"), where=key, error=SparkCheckpointError)
    infos = doc.get("stateStoreInfo") if isinstance(doc, dict) else None
    if not isinstance(infos, list):
        raise SparkCheckpointError(f"{key}: no stateStoreInfo in it")
    state_dir = "/" + key.split("/_metadata/", 1)[0] + "/"  # /state/OP/
    for info in infos:
        if isinstance(info, dict) and "numPartitions" in info:
            info["numPartitions"] = partitions
        paths = info.get("stateSchemaFilePaths") if isinstance(info, dict) else None
        if isinstance(paths, list):
            info["stateSchemaFilePaths"] = [
                _in_dest(p, state_dir, dest_uri) if isinstance(p, str) else p for p in paths]
    return version + sep + json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _in_dest(path: str, state_dir: str, dest_uri: str) -> str:
    """A source file's absolute path (Hadoop's form, as Spark recorded it) as the same
    file's in DEST: the part from ``/state/OP/`` on kept, DEST's place before it in the
    form Spark writes (``file:/path`` for a local disk; the source's scheme, as S3A's
    ``s3a``, with DEST's bucket and prefix; a local source's files in an object store DEST
    by Hadoop's scheme of that store: a ``file:`` one there would name no file)."""
    at = path.rfind(state_dir)
    if at < 0:
        return path  # not a file of this operator's: left as Spark wrote it
    dest = urlparse(dest_uri)
    if dest.scheme in ("", "file"):
        place = "file:" + (unquote(dest.path) if dest.scheme else dest_uri).rstrip("/")
    else:
        scheme = urlparse(path).scheme
        if scheme in ("", "file"):
            scheme = _HADOOP_SCHEMES.get(dest.scheme, dest.scheme)
        place = f"{scheme}://{dest.netloc}{dest.path.rstrip('/')}"
    return place + path[at:]


# -- writing ------------------------------------------------------------------------------
def _copy(checkpoint: SparkCheckpoint, out: Storage, key: str) -> None:
    try:
        checkpoint.storage.copy(key, key, target=out)
    except StorageError as e:
        raise SparkCheckpointError(f"copying {key} to {out.uri} failed ({e})") from None


def _write(out: Storage, key: str, data: bytes, written: dict[str, int], *, crc: bool) -> None:
    try:
        out.write(key, data)
        written[key] = len(data)
        if crc:
            check = hadoop_crc(data)
            out.write(crc_of(key), check)
            written[crc_of(key)] = len(check)
    except StorageError as e:
        raise SparkCheckpointError(f"writing {key} to {out.uri} failed ({e})") from None


def _upload(out: Storage, local: Path, key: str, written: dict[str, int], *, crc: bool) -> None:
    """`local` (given up: moved where it can be, `Storage.hand_over`) written as `key`."""
    _hand_over(out, local, key, written, _file_crc(local) if crc else None)


def _hand_over(out: Storage, local: Path, key: str, written: dict[str, int],
               check: bytes | None) -> None:
    """`local` written as `key` (`Storage.hand_over`), with its Hadoop CRC `check`."""
    try:
        size = local.stat().st_size
        out.hand_over(local, key)
        written[key] = size
        if check is not None:
            out.write(crc_of(key), check)
            written[crc_of(key)] = len(check)
    except (StorageError, OSError) as e:
        raise SparkCheckpointError(f"writing {key} to {out.uri} failed ({e})") from None


def _file_crc(path: Path) -> bytes:
    """`relocate.hadoop_crc` of a file, mapped a window at a time (`state_files.mapped`:
    an SST just written is summed where it lies in the page cache)."""
    sums = [hadoop_crc(window)[8:] for window in mapped(path)]  # windows of 512-byte chunks
    return hadoop_crc(b"")[:8] + b"".join(sums)


def _repartition_store(
    checkpoint: SparkCheckpoint, found: Scan, out: Storage, op: int, store: _Store,
    batch: int, partitions: int, written: dict[str, int], with_crc: bool, progress: Progress,
    ids: dict[StoreId, str] | None, pool: Pool,
) -> StorePlan:
    """Route every record of the store's partitions to its new partition's snapshot
    (`ids`: checkpoint format v2, where each new snapshot's unique id is recorded)."""
    if store.provider == "rocksdb":
        return _repartition_rocksdb(checkpoint, found, out, op, store, batch, partitions,
                                    written, with_crc, progress, ids, pool)
    with tempfile.TemporaryDirectory(prefix="statehold-repartition-") as tmp:
        paths = [Path(tmp) / f"{p}.snapshot" for p in range(partitions)]
        handles = [p.open("wb") for p in paths]
        try:
            writers = [SnapshotWriter(h) for h in handles]
            counts = _route(checkpoint, found, op, store, batch,
                            [_one_by_one(w.add) for w in writers], progress, versioned=False)
            for w in writers:
                w.close()
        finally:
            for h in handles:
                h.close()
        for p, path in enumerate(paths):
            sid = StoreId(op, p, store.name)
            _upload(out, path, version_file(sid, batch + 1, "snapshot"), written, crc=with_crc)
    return _store_plan(store, counts)


def _repartition_rocksdb(
    checkpoint: SparkCheckpoint, found: Scan, out: Storage, op: int, store: _Store,
    batch: int, partitions: int, written: dict[str, int], with_crc: bool, progress: Progress,
    ids: dict[StoreId, str] | None, pool: Pool,
) -> StorePlan:
    """Route each source partition's records to the new partitions' runs (`VersionRuns`:
    its keys, sorted, go straight into SSTs), then build each new partition's RocksDB and
    write it as the snapshot ``N+1.zip`` with its SSTs (uploaded first: the zip names
    them). Both steps are mapped by `pool` (worker processes where they pay). Checkpoint
    format v2: the zip is ``N+1_<new id>.zip``, the id recorded in `ids` for
    ``commits/N``; Spark takes a version's own snapshot as the whole truth, so no lineage
    goes with it."""
    conf = checkpoint.offsets(batch).metadata.conf
    format_version = int(conf.get(_ROCKSDB_FORMAT, str(DEFAULT_FORMAT_VERSION)))
    progress.start(f"operator {op} store {store.name}", len(store.source) + partitions,
                   "partitions")
    with tempfile.TemporaryDirectory(prefix="statehold-repartition-") as tmp:
        dirs = [Path(tmp) / f"{p}" for p in range(partitions)]
        route = functools.partial(_route_to_runs, checkpoint, found, op, store, batch,
                                  dirs, format_version)
        build = functools.partial(_build, format_version=format_version, crc=with_crc)
        counts = [0] * partitions
        internal = [0] * partitions
        for routed, routed_internal in pool(route, store.source):
            counts = [a + b for a, b in zip(counts, routed, strict=True)]
            internal = [a + b for a, b in zip(internal, routed_internal, strict=True)]
            progress.advance(1)
        extras = [{"numInternalKeys": n, **(store.zip_extra or {})} if store.tws is not None
                  else store.zip_extra or {} for n in internal]
        rows = [a - b for a, b in zip(counts, internal, strict=True)]
        for p, (built, crcs) in enumerate(pool(build, dirs, rows, extras)):
            counts[p] = built.rows + internal[p]  # counted again where runs replaced keys
            sid = StoreId(op, p, store.name)
            for sst in built.ssts:
                _hand_over(out, sst.path, f"{sid.prefix}/SSTs/{sst.dfs}", written,
                           crcs.get(sst.path.name))
            unique_id = None
            if ids is not None:
                unique_id = ids[sid] = str(uuid.uuid4())
            _hand_over(out, built.zip_path, version_file(sid, batch + 1, "zip", unique_id),
                       written, crcs.get(built.zip_path.name))
            shutil.rmtree(dirs[p], ignore_errors=True)
            progress.advance(1)
    return _store_plan(store, counts)


#: Bytes of a source partition's changes (its changelogs since its snapshot) held before
#: they go to the new partitions as a run of their own (`state_reader.store_record_runs`):
#: what keeps a repartition's memory the same whatever the size of the state.
RUN_BYTES = 32 << 20

#: Below this many bytes of source state, a repartition routes in its own process: a
#: worker's start (a new interpreter importing statehold) would cost more than it saves.
PARALLEL_BYTES = 256 << 20


def _workers(checkpoint: SparkCheckpoint, found: Scan, store: _Store) -> int:
    """Worker processes for a RocksDB store: one per core (the routing is Python, one core
    a process) where the source is on local disk (a worker opens it by its path), holds at
    least `PARALLEL_BYTES` and is read as it is (a transform's function stays in this
    process); 0 (this process) otherwise."""
    if (store.provider != "rocksdb" or store.records is not None
            or not isinstance(checkpoint.storage, LocalStorage)):
        return 0
    held = [found.stores[sid] for sid in store.source if sid in found.stores]
    size = sum(f.size for files in held
               for f in [*files.versions.values(), *files.shared.values()])
    workers = min(os.cpu_count() or 1, len(store.source))
    return workers if workers > 1 and size >= PARALLEL_BYTES else 0


#: A map over calls, their results in order.
Pool = Callable[..., Iterator[Any]]


@contextmanager
def _pool(workers: int) -> Iterator[Pool]:
    """A map over calls, in order: in `workers` worker processes (`workers.Workers`), or
    in this one (0)."""
    if workers == 0:
        yield map
        return
    with Workers(workers) as pool:
        yield pool.map


def _route_to_runs(
    checkpoint: SparkCheckpoint, found: Scan, op: int, store: _Store, batch: int,
    dirs: list[Path], format_version: int, sid: StoreId,
) -> tuple[list[int], list[int]]:
    """One source partition's records to the new partitions' runs (each under its new
    partition's directory, named by the source partition); its rows per new partition,
    and of them those of internal column families (transformWithState's timers, TTL)."""
    runs = [VersionRuns(d, f"from-{sid.partition}", format_version=format_version)
            for d in dirs]
    counts = [0] * len(dirs)
    internal = [0] * len(dirs)
    try:
        if store.tws is not None:
            batches = _source_batches(checkpoint, found, store, sid, batch, True)
            _route_families(checkpoint, found, store.tws, sid, batch, one_by_one(batches),
                            [r.add for r in runs], counts, internal)
        elif store.records is not None:  # a transform's rows
            _route_records(_source_batches(checkpoint, found, store, sid, batch, True),
                           store, [r.add_batch for r in runs], counts, True,
                           _key_decoder(op, store), sid)
        else:
            sinks: list[Sink] = [r.add_batch for r in runs]
            decode = _key_decoder(op, store)
            for run in store_record_runs(checkpoint, found, sid, batch, limit=RUN_BYTES):
                _route_records(run, store, sinks, counts, True, decode, sid)
                for r in runs:
                    r.end_run()
    finally:
        for r in runs:
            r.close()
    return counts, internal


def _route_families(
    checkpoint: SparkCheckpoint, found: Scan, tws: TwsOperator, sid: StoreId, batch: int,
    records: Iterator[tuple[bytes, bytes]], sinks: list[Callable[[bytes, bytes], None]],
    counts: list[int], internal: list[int],
) -> None:
    """A transformWithState source partition's records, every column family's, each to
    the new partition Spark's hash of its grouping key sends it to, its bytes as they are
    but for its family id where this partition's snapshot numbered the family otherwise
    than the one the new snapshots carry."""
    remap = _family_remap(checkpoint, found, tws, sid, batch)
    route = grouping_router(tws, len(sinks), str(sid))
    internal_ids = tws.internal_ids
    for key, value in records:
        fid = family_id(key)
        if remap:
            if fid not in remap:
                raise SparkCheckpointError(f"{sid}: a key of column family {fid}, which its "
                                           "snapshot does not name")
            fid = remap[fid]
            key = family_prefix(fid) + key[2:]
        target = route(key)
        sinks[target](key, value)
        counts[target] += 1
        internal[target] += fid in internal_ids


def _family_remap(checkpoint: SparkCheckpoint, found: Scan, tws: TwsOperator, sid: StoreId,
                  batch: int) -> dict[int, int]:
    """The source partition's family ids -> the new snapshots' (by family name); empty
    where they agree (or the partition's version has no snapshot to say)."""
    mapping = partition_ids(checkpoint, found, tws, sid, batch)
    if mapping == tws.ids:
        return {}
    missing = sorted(set(mapping) - set(tws.ids))
    if missing:
        raise SparkCheckpointError(
            f"{sid}: column families {', '.join(missing)} that the operator's newest "
            "snapshot does not name; nothing written")
    return {i: tws.ids[name] for name, i in mapping.items()}


def _build(directory: Path, rows: int, extra: Mapping[str, Any], *, format_version: int,
           crc: bool) -> tuple[BuiltVersion, dict[str, bytes]]:
    """A new partition's version built from its runs, and each file's Hadoop CRC (by file
    name; none unless `crc`)."""
    built = build_version(directory, rows=rows, format_version=format_version,
                          metadata_extra=extra)
    files = [s.path for s in built.ssts] + [built.zip_path]
    return built, ({f.name: _file_crc(f) for f in files} if crc else {})


def _source_batches(checkpoint: SparkCheckpoint, found: Scan, store: _Store, sid: StoreId,
                    batch: int, versioned: bool) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """A source partition's records as written to the new location, in batches (keys,
    values): the source's bytes unchanged (a transformWithState operator's, every column
    family's), or a transform's."""
    if store.tws is not None and store.records is None:
        _files, needs = resolved(checkpoint, found, sid, batch)
        if not needs.ok:
            raise SparkCheckpointError(needs.problems[0])
        records: Iterator[tuple[bytes, bytes]] = tws_records(
            checkpoint, sid, needs, store.tws.delimiter, store.tws.list_prefixes)
    elif store.records is None:
        yield from store_record_batches(checkpoint, found, sid, batch)
        return
    else:
        records = ((key, value) for _key_values, key, value in store.records(sid, batch,
                                                                               versioned))
    while some := list(itertools.islice(records, _HASH_BATCH)):
        keys, values = zip(*some, strict=True)
        yield list(keys), list(values)


#: Where a batch of records goes: the keys and values of one new partition, in order (a
#: value None, a delete, only to a sink of runs: `VersionRuns.add_batch`).
Sink = Callable[[list[bytes], list[Any]], None]


def _one_by_one(add: Callable[[bytes, bytes], None]) -> Sink:
    def sink(keys: list[bytes], values: list[bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            add(key, value)

    return sink


def _route(
    checkpoint: SparkCheckpoint, found: Scan, op: int, store: _Store, batch: int,
    sinks: list[Sink], progress: Progress, *, versioned: bool,
) -> list[int]:
    """Every record of the store's partitions to the sink of the new partition Spark's
    hash sends its key to; the records per new partition."""
    counts = [0] * len(sinks)
    decode = _key_decoder(op, store)
    progress.start(f"operator {op} store {store.name}", len(store.source), "partitions")
    for sid in store.source:
        _route_records(_source_batches(checkpoint, found, store, sid, batch, versioned),
                       store, sinks, counts, versioned, decode, sid)
        progress.advance(1)
    return counts


def _route_records(
    batches: Iterator[tuple[list[bytes], list[Any]]], store: _Store, sinks: list[Sink],
    counts: list[int], versioned: bool,
    decode: Callable[[StoreId, bytes, bool], tuple[Any, ...]], sid: StoreId,
) -> None:
    """One source partition's records to their new partitions' sinks, the keys hashed
    `_HASH_BATCH` or more at a time from their bytes (`columnar_hash`; a batch it does
    not take, key by key). `versioned`: RocksDB's keys start with Spark's state encoding
    version (00), the row after it."""
    keys: list[bytes] = []
    values: list[Any] = []
    for more_keys, more_values in batches:
        keys += more_keys
        values += more_values
        if len(keys) >= _HASH_BATCH:
            _send(keys, values, store, sinks, counts, versioned, decode, sid)
            keys, values = [], []
    _send(keys, values, store, sinks, counts, versioned, decode, sid)


def _send(keys: list[bytes], values: list[Any], store: _Store, sinks: list[Sink],
          counts: list[int], versioned: bool,
          decode: Callable[[StoreId, bytes, bool], tuple[Any, ...]], sid: StoreId) -> None:
    """One batch of the source's records to their new partitions' sinks: each new
    partition's records at once, in the batch's order."""
    if not keys:
        return
    if store.prefixed is not None:  # the prefix is the partitioning columns
        prefixed = store.prefixed
        hashed = partitions_of(prefixed.prefixes(keys, f"{sid} (a key)"), prefixed.prefix,
                               store.columns, len(sinks), 1)
    else:
        hashed = partitions_of(keys, store.schema, store.columns, len(sinks), int(versioned))
    if hashed is None:  # decoded key by key: a key's refusal, or a type not hashed at once
        types = [store.schema.fields[i].type for i in store.columns]
        targets = []
        for key in keys:
            key_values = decode(sid, key, versioned)
            targets.append(partition_of([key_values[i] for i in store.columns], types,
                                        len(sinks)))
        hashed = np.array(targets, dtype=np.int64)
    order = np.argsort(hashed, kind="stable")
    ordered = hashed[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    for at, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(keys)], strict=True):
        target = int(ordered[at])
        picked = order[at:end].tolist()
        sinks[target](list(map(keys.__getitem__, picked)),
                      list(map(values.__getitem__, picked)))
        counts[target] += end - at


def _commit_text(checkpoint: SparkCheckpoint, found: Scan, batch: int, partitions: int,
                 ids: dict[StoreId, str]) -> bytes:
    """``commits/N`` of checkpoint format v2 naming the new snapshots: per operator
    rewritten, per new partition, the ids of its stores in Spark's order; every other
    operator's ids and field as read."""
    key = f"{COMMITS_DIR}/{batch}"
    head, _, body = checkpoint.read(key).partition(b"\n")
    doc = load_json(body, where=key, error=SparkCheckpointError)
    doc["stateUniqueIds"] = {  # an operator copied as it was keeps its ids
        **(doc.get("stateUniqueIds") or {}),
        **{str(op): [[ids[StoreId(op, p, name)] for name in checkpoint.store_order(found, op)]
                     for p in range(partitions)]
           for op in sorted({sid.operator for sid in ids})},
    }
    return head + b"\n" + json.dumps(doc, separators=(",", ":")).encode("utf-8")


def _key_decoder(op: int, store: _Store) -> Callable[[StoreId, bytes, bool], tuple[Any, ...]]:
    """A key's values (the source's or a transform's); RocksDB's (`versioned`) after
    Spark's state encoding version, which must be 00."""
    where = f"operator {op} store {store.name} (a key)"
    if store.prefixed is not None:
        prefixed = store.prefixed.decoder(where)
        return lambda sid, key, versioned: prefixed(key)
    decode = row_decoder(store.schema, where)

    def values(sid: StoreId, key: bytes, versioned: bool) -> tuple[Any, ...]:
        if versioned and key[:1] != b"\x00":
            raise SparkCheckpointError(
                f"{sid}: a key of state encoding version {key[:1].hex() or 'missing'}, not 00")
        return decode(key[1:] if versioned else key)

    return values


def _store_plan(store: _Store, counts: list[int]) -> StorePlan:
    return StorePlan(store=store.name, partitioning=[store.schema.fields[i].name
                                                     for i in store.columns],
                     rows=sum(counts), per_partition=counts)


__all__ = ["RepartitionReport", "StoreChange", "repartition", "rewrite"]
