"""`verify --deep`: each store version a restart needs is loaded, the way Spark loads it,
rather than only found whole.

A RocksDB version's snapshot zip is rebuilt in a temporary directory (its CURRENT,
MANIFEST and OPTIONS beside the SSTs it lists) and opened read-only by RocksDB itself,
which compares each SST's size and unique id with the MANIFEST's at open
(`rocksdb_snapshot._options`); then every row is iterated (every block's checksum
verified). Its changelogs, and an HDFS-backed version's snapshot and deltas, are read to
their end, every record decoded with the store's schema where it has one (a flat schema's
rows a batch at a time, `columnar_rows.all_decode`: the row decoder's refusals without a
Python call per value; a batch with a row refused is decoded row by row, which names the
first in file order). Each file is
read on its own, streamed (`state_reader.file_records`: memory is one block and one
record, not the state), so every damaged file of a version is named, not only the first.

What is wrong is given a kind (`Kind`), and the Spark bug whose signature it carries where
it carries one: an SST whose unique id differs from the MANIFEST's (SPARK-43404, "Mismatch
in unique ID on table file"), an SST whose size differs (SPARK-51717, "Sst file size
mismatch").
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from statehold.progress import NoProgress, Progress
from statehold.spark_checkpoints.columnar_rows import all_decode, is_flat
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.prefix_keys import prefix_keys
from statehold.spark_checkpoints.rocksdb_snapshot import local_names
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.state_files import read_zip_metadata
from statehold.spark_checkpoints.state_reader import (
    BATCH_ROWS,
    file_records,
    resolved,
    row_decoders,
    store_schema,
)
from statehold.spark_checkpoints.stores import Needs


class Kind(StrEnum):
    """What is wrong with a file a store version needs."""

    SST_UNIQUE_ID = "sst-unique-id-mismatch"
    SST_SIZE = "sst-size-mismatch"
    SST_MISSING = "sst-missing"
    SST_CORRUPT = "sst-corrupt"
    ROCKSDB_CANNOT_OPEN = "rocksdb-cannot-open"
    ZIP_MISSING = "zip-missing"
    ZIP_CUT_SHORT = "zip-cut-short"
    ZIP_CORRUPT = "zip-corrupt"
    CHANGELOG_MISSING = "changelog-missing"
    CHANGELOG_CUT_SHORT = "changelog-cut-short"
    CHANGELOG_CORRUPT = "changelog-corrupt"
    DELTA_MISSING = "delta-missing"
    DELTA_CUT_SHORT = "delta-cut-short"
    DELTA_CORRUPT = "delta-corrupt"
    SNAPSHOT_CUT_SHORT = "snapshot-cut-short"
    SNAPSHOT_CORRUPT = "snapshot-corrupt"
    VERSION_MISSING = "version-missing"
    SCHEMA_UNREADABLE = "schema-unreadable"
    RECORD_UNDECODABLE = "record-undecodable"


#: The Spark bugs whose signature a kind carries, and what each did.
SPARK_BUGS: dict[Kind, tuple[str, str]] = {
    Kind.SST_UNIQUE_ID: ("SPARK-43404", "a task retry re-uploaded an SST under a reused name"),
    Kind.SST_SIZE: ("SPARK-51717", "an SST mapping kept across a reload from version 0"),
}
_STEP = {".changelog": "changelog", ".delta": "delta", ".snapshot": "snapshot"}
_UNIQUE_ID = re.compile(r"Mismatch in unique ID on table file (\d+)")
_SIZE = re.compile(r"Sst file size mismatch: \S*?(\d+\.sst)")
_LOCAL_SST = re.compile(r"(\d{6}\.sst)\b")
_ZIP_END = b"PK\x05\x06"  # a zip's end of central directory record


@dataclass(frozen=True)
class Finding:
    path: str
    kind: Kind
    problem: str

    @property
    def spark_bug(self) -> str | None:
        bug = SPARK_BUGS.get(self.kind)
        return bug[0] if bug else None


@dataclass
class DeepResult:
    findings: list[Finding] = field(default_factory=list)
    #: Store versions loaded (whole or not), files and bytes read, records decoded.
    stores: int = 0
    files: int = 0
    bytes: int = 0
    records: int = 0
    #: Stores whose records were read to their end but not decoded, and why.
    not_decoded: list[str] = field(default_factory=list)
    #: The keys read here (the shallow check need not read them again).
    read: set[str] = field(default_factory=set)

    def add(self, other: DeepResult) -> None:
        self.findings += other.findings
        self.stores += other.stores
        self.files += other.files
        self.bytes += other.bytes
        self.records += other.records
        self.not_decoded += other.not_decoded
        self.read |= other.read


#: What one store version's load found, by the version and every file it reads as listed
#: (key, size, mtime) and what its chain misses: a caller that loads the same version of
#: unchanged files again (`repair`: its plan, its tries, its check after) reads it once.
Loads = dict[tuple[object, ...], DeepResult]


def deep_check(
    location: SparkCheckpoint,
    found: Scan,
    batch: int,
    *,
    operator: int | None = None,
    progress: Progress | None = None,
    only: Iterable[StoreId] | None = None,
    loads: Loads | None = None,
) -> DeepResult:
    """Load version `batch` + 1 of every store (of `operator` only, if given; of the
    stores `only` names, if given: a repair trying another way to one store's version).
    `loads`: the versions loaded before, not loaded again while their files are as they
    were (filled with what this call loads)."""
    progress = progress or NoProgress()
    result = DeepResult()
    chosen = None if only is None else set(only)
    stores = sorted(s for s in found.stores if (operator is None or s.operator == operator)
                    and (chosen is None or s in chosen))
    if operator is not None and not stores:
        raise SparkCheckpointError(f"{location.uri}: no state store of operator {operator}")
    for store in stores:
        _check_store(location, found, store, batch, result, progress,
                     {} if loads is None else loads)
    # one line per file and kind (every partition reads partition 0's schema file)
    result.findings = list(dict.fromkeys(result.findings))
    return result


def _check_store(location: SparkCheckpoint, found: Scan, store: StoreId, batch: int,
                 into: DeepResult, progress: Progress, loads: Loads) -> None:
    version = batch + 1
    try:
        files, needs = resolved(location, found, store, batch)
    except SparkCheckpointError as e:  # a zip's file list, a changelog's lineage unread
        subject = _subject(str(e))
        if subject.endswith(".zip"):
            into.findings.append(_zip_finding(location, subject, str(e)))
        elif subject.endswith(".changelog") and subject.startswith(store.prefix):
            into.findings.append(_step_finding(subject, str(e)))
        else:
            raise
        return
    # what the load reads: the version's files, its schema and operator metadata
    operator = f"state/{store.operator}/"
    schema = found.stores.get(StoreId(store.operator, 0, store.name))
    keys = [*needs.files, *(k for k in found.operator_files if k.startswith(operator)),
            *([schema.schema.key] if schema and schema.schema else [])]
    listed = tuple((k, i.size, i.mtime) for k in keys if (i := found.files.get(k)))
    seen = (store, version, files.provider, listed, tuple(needs.missing))
    if seen in loads:
        into.add(loads[seen])
        return
    result = loads[seen] = DeepResult()
    _load_store(location, found, store, batch, files.provider, needs, result, progress)
    into.add(result)


def _load_store(location: SparkCheckpoint, found: Scan, store: StoreId, batch: int,
                provider: str, needs: Needs, result: DeepResult, progress: Progress) -> None:
    version = batch + 1
    result.stores += 1
    total = sum(found.files[k].size for k in needs.files if k in found.files)
    progress.start(f"verify --deep {store} version {version}", total)
    result.findings += _missing(needs, batch)
    check = _checker(location, found, store, version, provider, result)
    with tempfile.TemporaryDirectory(prefix="statehold-deep-") as tmp:
        for key in needs.files:
            if not key.endswith((".zip", *_STEP)) or key not in found.files:
                continue
            result.read.add(key)
            part = [key, *(_listed(needs, key) if key.endswith(".zip") else [])]
            size = sum(found.files[k].size for k in part if k in found.files)
            gone = [k for k in part[1:] if k not in found.files]
            if gone:  # RocksDB cannot open it: said without trying (the listing decides)
                result.findings += [Finding(k, Kind.SST_MISSING, f"{key} lists it; it is gone")
                                    for k in gone]
            else:
                try:
                    result.records += _read(location, key, store, Path(tmp), check)
                except SparkCheckpointError as e:
                    result.findings.append(
                        _classify(location, found, store, key, str(e), Path(tmp)))
            result.files += len(part)
            result.bytes += size
            progress.advance(size)


#: Checks that each record of a batch decodes (key rows; value rows, None for a delete);
#: raises (the first in file order that does not) like the row decoders.
Check = Callable[[list[bytes], list[bytes | None]], None] | None


def _checker(location: SparkCheckpoint, found: Scan, store: StoreId, version: int,
             provider: str, result: DeepResult) -> Check:
    """The check of each batch of records, or None where the store has no schema file
    (transformWithState's): then the records are read to their end undecoded."""
    schema_file = found.stores[StoreId(store.operator, 0, store.name)].schema \
        if StoreId(store.operator, 0, store.name) in found.stores else None
    if schema_file is None:
        result.not_decoded.append(f"{store}: no schema file (transformWithState's column "
                                  "families): its records are read to their end, not decoded")
        return None
    try:
        schema = store_schema(location, found, store)
    except SparkCheckpointError as e:
        result.findings.append(Finding(schema_file.key, Kind.SCHEMA_UNREADABLE,
                                       _detail(str(e), schema_file.key)))
        return None
    prefixed = prefix_keys(location, found, store, schema.key)
    key_of, value_of = row_decoders(schema, store, version, provider, prefixed)
    skip = 1 if provider == "rocksdb" else 0
    # keys laid out for prefix scans (a session window's on RocksDB) are decoded one by one
    flat = is_flat(schema.key) and is_flat(schema.value) and prefixed is None

    def check(keys: list[bytes], values: list[bytes | None]) -> None:
        # a flat schema's rows checked many at once (the same refusals, nothing built);
        # where one would be refused, each decoded in file order names the first
        if flat and all_decode(keys, schema.key, skip) and all_decode(
                [v for v in values if v is not None], schema.value, skip):
            return
        for k, v in zip(keys, values, strict=True):
            key_of(k)
            if v is not None:
                value_of(v)

    return check


def _read(location: SparkCheckpoint, key: str, store: StoreId, tmp: Path,
          check: Check) -> int:
    """The records of `key` read to their end, each checked to decode (`check`, a
    batch at a time); their count."""
    count = 0
    keys: list[bytes] = []
    values: list[bytes | None] = []
    try:
        for k, v in file_records(location, key, store, tmp, column_families=check is None,
                                 checksums=True):
            count += 1
            if check is not None:
                keys.append(k)
                values.append(v)
                if len(keys) >= BATCH_ROWS:
                    check(keys, values)
                    keys, values = [], []
    except SparkCheckpointError:
        if check is not None and keys:  # a record before the damage is named first
            check(keys, values)
        raise
    if check is not None and keys:
        check(keys, values)
    return count


def _listed(needs: Needs, zip_key: str) -> list[str]:
    """The SSTs and logs a zip of `needs` lists (they follow it in `needs.files`)."""
    keys = list(needs.files)
    at = keys.index(zip_key) + 1
    out = []
    for k in keys[at:]:
        if k.endswith((".zip", *_STEP)):
            break
        out.append(k)
    return out


def _missing(needs: Needs, batch: int) -> list[Finding]:
    out = []
    chain = f"version {needs.version} of {needs.store} (batch {batch}'s, held as {needs.how}" + (
        f" from snapshot {needs.base})" if needs.base else ")")
    for key, what in needs.missing:
        kind = Kind(what)
        if kind is Kind.VERSION_MISSING:
            text = (f"batch {batch} is committed (commits/{batch}) but version "
                    f"{needs.version} of {needs.store}, which it wrote, has no file: neither "
                    "this nor a snapshot of that version")
        elif kind is Kind.ZIP_MISSING:
            text = (f"the snapshot {chain} starts from is gone, and no changelogs to rebuild "
                    "it from an older one")
        else:
            text = f"{chain} is rebuilt through it, and it is gone from the middle of the chain"
        out.append(Finding(key, kind, text))
    return out


def _classify(location: SparkCheckpoint, found: Scan, store: StoreId, key: str,
              message: str, tmp: Path) -> Finding:
    """The file and kind an error reading `key` (a zip or a step) points at."""
    message = re.sub(re.escape(str(tmp)) + r"/db-[^/\s]*/", "", message)
    subject = _subject(message)
    if message.startswith(f"{store} version"):  # a row_decoders error
        return Finding(key, Kind.RECORD_UNDECODABLE,
                       f"a record does not decode with the store's schema ({message})")
    if key.endswith(tuple(_STEP)):
        return _step_finding(key, message)
    if subject != key and subject.startswith(store.prefix):  # an SST or log not read
        kind = Kind.SST_MISSING if subject not in found.files else Kind.SST_CORRUPT
        return Finding(subject, kind, f"{key} lists it: {_detail(message, subject)}")
    if "RocksDB" not in message:
        return _zip_finding(location, key, message)
    named = _named_sst(location, store, key, message)
    if (m := _UNIQUE_ID.search(message)) and named:
        return Finding(named, Kind.SST_UNIQUE_ID, _bug(
            Kind.SST_UNIQUE_ID, f"its unique id is not the one {key}'s MANIFEST records for "
            f"table file {m.group(1)}: another SST under its name (RocksDB: "
            f"{_rocksdb(message)})"))
    if _SIZE.search(message) and named:
        return Finding(named, Kind.SST_SIZE, _bug(
            Kind.SST_SIZE, f"{found.files[named].size} bytes, not the size {key}'s MANIFEST "
            f"records (RocksDB: {_rocksdb(message)})"))
    if named:
        return Finding(named, Kind.SST_CORRUPT, f"{key} lists it: RocksDB: {_rocksdb(message)}")
    return Finding(key, Kind.ROCKSDB_CANNOT_OPEN, _detail(message, key))


def _step_finding(key: str, message: str) -> Finding:
    """A changelog, delta or HDFS snapshot that does not read to its end."""
    word = _STEP["." + key.rsplit(".", 1)[1]]
    cut = "cut short" in message or "do not end" in message
    kind = Kind(f"{word}-{'cut-short' if cut else 'corrupt'}")
    return Finding(key, kind, _detail(message, key))


def _named_sst(location: SparkCheckpoint, store: StoreId, zip_key: str, message: str
               ) -> str | None:
    """The SST (its key) a RocksDB error names by table number or local file name."""
    try:
        names = local_names(read_zip_metadata(location.read(zip_key), zip_key))
    except SparkCheckpointError:
        return None
    number = _UNIQUE_ID.search(message)
    local = f"{int(number.group(1)):06d}.sst" if number else None
    if local is None and (m := _LOCAL_SST.search(message)):
        local = m.group(1)
    rel = names.get(local) if local else None
    return f"{store.prefix}/{rel}" if rel else None


def _zip_finding(location: SparkCheckpoint, key: str, message: str) -> Finding:
    """A zip that does not open: cut short when its end record is gone."""
    try:
        data = location.read(key)
    except SparkCheckpointError:
        return Finding(key, Kind.ZIP_MISSING, _detail(message, key))
    cut = _ZIP_END not in data[-(65_535 + 22):]
    kind = Kind.ZIP_CUT_SHORT if cut else Kind.ZIP_CORRUPT
    what = f"cut short ({len(data)} bytes, no end record): " if cut else ""
    return Finding(key, kind, what + _detail(message, key))


def _bug(kind: Kind, text: str) -> str:
    bug, what = SPARK_BUGS[kind]
    return f"{text}: the signature of {bug} ({what})"


def _rocksdb(message: str) -> str:
    """RocksDB's own words from a message of `rocksdb_snapshot` (in its parentheses)."""
    inner = message.split(" (", 1)[1] if " (" in message else message
    return inner.removesuffix(")")


def _detail(message: str, key: str) -> str:
    return message.removeprefix(f"{key}: ")


def _subject(message: str) -> str:
    return message.split(": ", 1)[0]

