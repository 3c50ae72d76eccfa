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

Rows are first staged per version in a plain file (`Staging`), so a repartition into M
partitions keeps M files open, not M databases, and builds one RocksDB at a time.
"""

from __future__ import annotations

import json
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
    Options,
    Rdict,
    WriteOptions,
)

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Spark's ``spark.sql.streaming.stateStore.rocksdb.formatVersion`` default.
DEFAULT_FORMAT_VERSION = 5
#: The block-based table format versions the RocksDB of every supported Spark reads:
#: 3.5's rocksdbjni 8.3.2 reads up to 5; 6 (RocksDB 9's default, which rocksdict would
#: write unless told) it cannot.
FORMAT_VERSIONS = range(2, 6)
#: The files of the RocksDB directory the zip holds; the rest (LOCK, LOG, IDENTITY,
#: rocksdict's own config) RocksDB recreates, and Spark's checkpoint leaves out.
_ZIPPED = ("CURRENT", "MANIFEST-", "OPTIONS-")
_INT = struct.Struct(">i")
_CHUNK = 1 << 20


class Staging:
    """One version's rows, appended to a plain file before its RocksDB is built."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.rows = 0

    def add(self, key: bytes, value: bytes) -> None:
        self._out.write(_INT.pack(len(key)) + key + _INT.pack(len(value)) + value)
        self.rows += 1


def staged(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The rows `Staging` wrote to `path`, in order."""
    with path.open("rb") as f:
        while head := f.read(4):
            key = f.read(_INT.unpack(head)[0])
            value = f.read(_INT.unpack(f.read(4))[0])
            yield key, value


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


def build_version(rows: Iterator[tuple[bytes, bytes]], directory: Path, *,
                  format_version: int, metadata_extra: Mapping[str, Any]) -> BuiltVersion:
    """The RocksDB holding `rows` (distinct keys), built under `directory` (empty), with
    the zip Spark loads it from (``directory/version.zip``) and the SSTs it names."""
    if format_version not in FORMAT_VERSIONS:
        raise SparkCheckpointError(
            f"RocksDB table format version {format_version}: only "
            f"{FORMAT_VERSIONS.start} to {FORMAT_VERSIONS.stop - 1} are written")
    db_dir = directory / "db"
    count = 0
    try:
        db = Rdict(str(db_dir), options=_options(format_version))
        write = WriteOptions()
        # a property in rocksdict, though its stubs call it a method
        write.disable_wal = True  # type: ignore[method-assign,assignment]
        db.set_write_options(write)
    except Exception as e:  # rocksdict raises RocksDB's status as its own exceptions
        raise SparkCheckpointError(f"RocksDB cannot be created ({_line(e)})") from None
    try:
        for key, value in rows:
            db[key] = value
            count += 1
        db.flush(True)
    except Exception as e:
        raise SparkCheckpointError(f"RocksDB cannot be written ({_line(e)})") from None
    finally:
        db.close()
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
    zip_path = directory / "version.zip"
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
    (The rows are written without a write-ahead log and flushed to SSTs before the zip is
    made.)"""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_format_version(format_version)
    options.set_block_based_table_factory(table)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_max_open_files(64)
    return options


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
