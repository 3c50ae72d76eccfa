"""Writing one version of Spark's RocksDB state store as a snapshot, the files Spark's
``RocksDBFileManager`` loads: the version's ``N.zip`` (RocksDB's CURRENT, MANIFEST,
OPTIONS and write-ahead log, and Spark's ``metadata`` naming each SST by its local and
DFS names, its size, and the store's key count) and the SSTs themselves, kept under the
store's ``SSTs/`` as ``<local stem>-<uuid>.sst``. The inverse of `rocksdb_snapshot`.

The RocksDB is built by rocksdict (RocksDB 9.8.4, the version PySpark 4.x's rocksdbjni
ships) in a temporary directory: rows put without a write-ahead log, flushed, closed. Its
SSTs use the block-based table format version the location records
(``spark.sql.streaming.stateStore.rocksdb.formatVersion``, 5 by default, which 3.5's
rocksdbjni 8.3.2 reads too) and lz4, Spark's default compression. RocksDB's MANIFEST
records each SST's size and unique id, which the RocksDB Spark opens checks.

A version's rows are gathered on local disk as they arrive (`VersionRuns`), so a
repartition into M partitions keeps M versions open, not M databases: each run of keys in
increasing order (a source partition's, which RocksDB and `state_reader` give sorted) is
written straight to an SST by RocksDB's ``SstFileWriter``, sorted and compressed with no
memtable; a key out of order is staged in a plain file. The RocksDB is then made by
ingesting the runs (one file each, overlapping, into level 0) and putting the staged rows;
more runs than RocksDB lets level 0 hold before it slows writes (20) are compacted into
one level first, so the query restarted on it is not held up.
"""

from __future__ import annotations

import itertools
import json
import operator
import struct
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rocksdict import (
    BlockBasedOptions,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteOptions,
)

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Spark's ``spark.sql.streaming.stateStore.rocksdb.formatVersion`` default.
DEFAULT_FORMAT_VERSION = 5
#: The block-based table format versions the RocksDB of every supported Spark reads:
#: 3.5's rocksdbjni 8.3.2 reads up to 5; 6 (RocksDB 9's default, which rocksdict would
#: write unless told) it cannot.
FORMAT_VERSIONS = range(2, 6)
_INT = struct.Struct(">i")


#: RocksDB's ``level0_slowdown_writes_trigger`` default: more level-0 files than this slow
#: a writer down, so more runs than this are compacted before the version is written.
MAX_LEVEL0_RUNS = 20


class VersionRuns:
    """One writer's rows of one version, kept under the version's `directory` until
    `build_version`: a run of increasing keys goes straight into an SST, a key out of order
    into a plain staging file. Several writers (one per source partition, maybe in other
    processes) share a directory, each under its own `name`; a writer says where its
    input's order starts again (`end_run`) and closes when it is done. A writer's later
    runs replace what its earlier ones said of a key, and a value of None deletes it (a
    reader's changes taken a bound at a time: `state_reader.store_record_runs`)."""

    def __init__(self, directory: Path, name: str, *, format_version: int) -> None:
        check_format_version(format_version)
        directory.mkdir(exist_ok=True)
        self._dir = directory
        self._name = name
        self._options = _options(format_version)
        self._run: SstFileWriter | None = None
        self._runs = 0
        self._last = b""
        self._staged: BinaryIO | None = None
        self.rows = 0

    def add(self, key: bytes, value: bytes | None) -> None:
        self.rows += 1
        if self._run is None:
            self._run = SstFileWriter(options=self._options)
            _guard("written", self._run.open, str(self._dir / _run_name(self._name,
                                                                         self._runs)))
            self._runs += 1
        elif key <= self._last:
            if self._staged is None:
                self._staged = (self._dir / f"{self._name}.staged").open("wb")
            self._staged.write(_INT.pack(len(key)) + key + (
                _INT.pack(_DELETED) if value is None else _INT.pack(len(value)) + value))
            return
        if value is None:
            del self._run[key]
        else:
            self._run[key] = value
        self._last = key

    def add_batch(self, keys: list[bytes], values: list[bytes | None]) -> None:
        """`add` of each record; keys in increasing order after the run's last (what a
        source partition's batch of one new partition is) go into the run with no check
        per key."""
        if not keys:
            return
        if ((self._run is None or self._last < keys[0]) and None not in values
                and all(map(operator.lt, keys, itertools.islice(keys, 1, None)))):
            if self._run is None:
                self.add(keys[0], values[0])
                keys, values = keys[1:], values[1:]
            run = self._run
            assert run is not None
            for key, value in zip(keys, values, strict=True):
                run[key] = value
            self.rows += len(keys)
            if keys:
                self._last = keys[-1]
            return
        for key, one in zip(keys, values, strict=True):
            self.add(key, one)

    def end_run(self) -> None:
        """Close the current run: the next key starts a new one, whatever its order."""
        if self._run is not None:
            _guard("written", self._run.finish)
            self._run = None

    def close(self) -> None:
        self.end_run()
        if self._staged is not None:
            self._staged.close()


#: A staged record's value size that says it is a delete.
_DELETED = -1


def _run_name(writer: str, run: int) -> str:
    return f"{writer}-{run:06d}.run"


def build_version(directory: Path, *, rows: int, format_version: int,
                  metadata_extra: Mapping[str, Any]) -> BuiltVersion:
    """The RocksDB of every run and staged row its writers (closed) left in `directory`,
    with the zip Spark loads it from (``version.zip`` there) and the SSTs it names. The
    runs are ingested (moved, not copied), a writer's later runs after its earlier ones
    so they win (the n-th run of every writer at once: different writers' keys never
    meet); then the staged rows are put without a write-ahead log and flushed; more runs
    than level 0 holds without slowing writes are compacted. `rows` is the key count the
    zip records, counted again in the RocksDB where a writer's runs may have replaced or
    deleted keys."""
    check_format_version(format_version)
    runs = sorted(directory.glob("*.run"))
    rounds = [sorted(str(p) for p in group) for _n, group in itertools.groupby(
        sorted(runs, key=_run_number), key=_run_number)]
    db_dir = directory / "db"
    options = _options(format_version)
    db = _guard("created", Rdict, str(db_dir), options)
    try:
        write = WriteOptions()
        # a property in rocksdict, though its stubs call it a method
        write.disable_wal = True  # type: ignore[method-assign,assignment]
        db.set_write_options(write)
        for files in rounds:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            _guard("written", db.ingest_external_file, files, ingest)
        for staged in sorted(directory.glob("*.staged")):
            for key, value in _staged_rows(staged):
                if value is None:
                    del db[key]
                else:
                    db[key] = value
        _guard("written", db.flush, True)
        if len(runs) > MAX_LEVEL0_RUNS:
            _guard("compacted", db.compact_range, None, None)
        if len(rounds) > 1:
            rows = _key_count(db)
    finally:
        db.close()
    return _zipped(db_dir, directory / "version.zip", rows, metadata_extra)


def _key_count(db: Rdict) -> int:
    """The keys a RocksDB holds, its files read ahead and not cached (a count is read
    once; their checksums are RocksDB's own, just written): about 0.6 us of CPU a key."""
    read = ReadOptions()
    read.fill_cache(False)  # type: ignore[call-arg]  # its stub takes no flag; RocksDB does
    read.set_verify_checksums(False)
    read.set_readahead_size(_READAHEAD)
    return sum(1 for _key in db.keys(read_opt=read))


#: How far ahead a count reads a RocksDB's files.
_READAHEAD = 8 << 20


def _run_number(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def check_format_version(format_version: int) -> None:
    if format_version not in FORMAT_VERSIONS:
        raise SparkCheckpointError(
            f"RocksDB table format version {format_version}: only "
            f"{FORMAT_VERSIONS.start} to {FORMAT_VERSIONS.stop - 1} are written")


def _staged_rows(path: Path) -> Iterator[tuple[bytes, bytes | None]]:
    with path.open("rb") as f:
        while head := f.read(4):
            key = f.read(_INT.unpack(head)[0])
            size = _INT.unpack(f.read(4))[0]
            yield key, None if size == _DELETED else f.read(size)


def _guard(what: str, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as e:  # rocksdict raises RocksDB's status as its own exceptions
        raise SparkCheckpointError(f"RocksDB cannot be {what} ({_line(e)})") from None


@dataclass(frozen=True)
class SstFile:
    local: str
    dfs: str
    size: int
    path: Path


@dataclass
class BuiltVersion:
    """A version's RocksDB, built: the SSTs to upload, and the zip to write after them."""

    ssts: list[SstFile]
    zip_path: Path
    rows: int
    extra: dict[str, Any] = field(default_factory=dict)


def _zipped(db_dir: Path, zip_path: Path, count: int, metadata_extra: Mapping[str, Any]
            ) -> BuiltVersion:
    """The closed RocksDB in `db_dir` as Spark's snapshot: the zip (CURRENT, the MANIFEST,
    the newest OPTIONS, any log, and Spark's metadata) and the SSTs it names."""
    names = sorted(p.name for p in db_dir.iterdir() if p.is_file())
    current = (db_dir / "CURRENT").read_text().strip()
    options = [n for n in names if n.startswith("OPTIONS-")]
    zipped = [n for n in names
              if n == "CURRENT" or n == current or (options and n == max(options))
              or (n.endswith(".log") and n != "LOG")]
    if current not in zipped or not any(n.startswith("OPTIONS-") for n in zipped):
        raise SparkCheckpointError(f"RocksDB wrote no {current or 'MANIFEST'} or OPTIONS file")
    ssts = [SstFile(n, f"{n.removesuffix('.sst')}-{uuid.uuid4()}.sst",
                    (db_dir / n).stat().st_size, db_dir / n)
            for n in names if n.endswith(".sst")]
    meta: dict[str, Any] = {
        "sstFiles": [{"localFileName": s.local, "dfsSstFileName": s.dfs, "sizeBytes": s.size}
                     for s in ssts],
        "numKeys": count,
        **metadata_extra,
    }
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in zipped:
            archive.write(db_dir / name, name)
        archive.writestr("metadata", "v1\n" + json.dumps(meta, separators=(",", ":")))
    return BuiltVersion(ssts, zip_path, count)


def metadata_extra(zip_meta_extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields after ``numKeys`` that the Spark which wrote the location puts in a
    zip's metadata: Spark 4's column family fields (empty: no column families), none for
    3.5's (and where no zip of the location tells)."""
    if not zip_meta_extra or "numInternalKeys" not in zip_meta_extra:
        return {}
    return {"numInternalKeys": 0, "columnFamilyMapping": {}, "columnFamilyTypeMap": {},
            "maxColumnFamilyId": 0}


def _options(format_version: int) -> Options:
    """What Spark's RocksDB sets that shapes the files: the table format version and lz4.
    Compactions only when asked (`build_version`), so the SSTs a version is written with
    do not depend on a background thread's timing (Spark opens the RocksDB with its own
    options, compactions on)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_format_version(format_version)
    options.set_block_based_table_factory(table)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_max_open_files(64)
    options.set_disable_auto_compactions(True)
    return options


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
