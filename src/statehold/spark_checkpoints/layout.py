"""What each file in a Spark checkpoint location is, from its key alone.

A checkpoint location (the ``checkpointLocation`` of a Structured Streaming query) holds:

* ``metadata``: the query's id;
* ``offsets/N`` and ``commits/N``: the write-ahead log and the commit log, one file per
  batch N;
* ``sources/I/N`` (and ``N.compact``): what source I recorded for batch N (the file
  source's list of files read);
* ``state/OP/_metadata/...`` and ``state/OP/_stateSchema/...``: operator OP's metadata and
  state schemas;
* ``state/OP/PART/[STORE/]...``: one state store per operator, partition and store name.
  Most operators have one store (``default``, with no directory of its own); a
  stream-stream join has four, each in a directory named after it. In a store:
  ``_metadata/schema``; for the HDFS-backed provider ``V.delta`` and ``V.snapshot``; for
  the RocksDB provider ``V.zip`` (a snapshot: RocksDB's small files and a list of SSTs),
  ``V.changelog``, ``SSTs/*.sst`` and ``logs/*.log``. With checkpoint format version 2
  (Spark 4.x) the zips and changelogs are ``V_<unique id>.zip`` / ``.changelog``.

Batch N's state is version N+1 of every store: the batch loads version N and commits N+1.

Hadoop's local file system writes a ``.NAME.crc`` beside each file, Spark 4 a
``V_<id>.zip.crc`` (its own checksum) beside state files, and Spark's atomic writes go
through ``.NAME.<uuid>.tmp``. statehold itself writes one file there, and only while a
rollback is under way: ``_statehold_rollback``; and `repair` moves the damaged files it sets
aside under ``_repaired/<UTC time>/`` (each at its relative path), a folder Spark never
reads and gc never deletes from. Any other name is *unknown*: reported, never deleted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

QUERY_METADATA = "metadata"
OFFSETS_DIR = "offsets"
COMMITS_DIR = "commits"
SOURCES_DIR = "sources"
STATE_DIR = "state"
#: statehold's own mark of a rollback under way (`spark_checkpoints.rollback_marker`).
ROLLBACK_MARKER = "_statehold_rollback"
#: Where `repair` moves the files it sets aside (`spark_checkpoints.repair`).
REPAIRED_DIR = "_repaired"
DEFAULT_STORE = "default"
#: Directories inside a store (or a partition directory holding the default store).
_STORE_SUBDIRS = {"SSTs", "logs", "_metadata"}

# ASCII digits only (re.ASCII): Spark writes no other, and int() would take some (``١٢``)
_BATCH = re.compile(r"^(\d+)$", re.ASCII)
_COMPACT = re.compile(r"^(\d+)\.compact$", re.ASCII)
_VERSIONED = re.compile(
    r"^(?P<version>\d+)(?:_(?P<uid>[0-9A-Za-z-]+))?\.(?P<ext>zip|changelog|delta|snapshot)$",
    re.ASCII,
)
_TEMP = re.compile(r"(^\..*\.tmp$)|(\.tmp$)")


class Kind(StrEnum):
    QUERY_METADATA = "metadata"
    OFFSETS = "offsets"
    COMMITS = "commits"
    SOURCE_LOG = "source-log"
    OPERATOR_METADATA = "operator-metadata"
    STORE_SCHEMA = "store-schema"
    ZIP = "snapshot-zip"
    CHANGELOG = "changelog"
    DELTA = "delta"
    HDFS_SNAPSHOT = "hdfs-snapshot"
    SST = "sst"
    ROCKSDB_LOG = "rocksdb-log"
    CRC = "crc"
    TEMP = "temp"
    ROLLBACK_MARKER = "rollback-marker"
    REPAIRED = "repaired"
    UNKNOWN = "unknown"


#: Kinds holding one version of a store.
VERSION_FILES = {Kind.ZIP, Kind.CHANGELOG, Kind.DELTA, Kind.HDFS_SNAPSHOT}
_EXT_KIND = {
    "zip": Kind.ZIP,
    "changelog": Kind.CHANGELOG,
    "delta": Kind.DELTA,
    "snapshot": Kind.HDFS_SNAPSHOT,
}


@dataclass(frozen=True, slots=True, order=True)
class StoreId:
    """One state store: operator, partition and store name."""

    operator: int
    partition: int
    name: str = DEFAULT_STORE

    @property
    def prefix(self) -> str:
        """The store's directory under the checkpoint location."""
        base = f"{STATE_DIR}/{self.operator}/{self.partition}"
        return base if self.name == DEFAULT_STORE else f"{base}/{self.name}"

    def __str__(self) -> str:
        return f"operator {self.operator} partition {self.partition} store {self.name}"


@dataclass(frozen=True, slots=True)
class Name:
    """What a key is: its kind, and the batch, version, unique id, store and source it
    belongs to where it has one."""

    key: str
    kind: Kind
    batch: int | None = None
    version: int | None = None
    unique_id: str | None = None
    store: StoreId | None = None
    source: int | None = None
    #: A ``.crc`` file's subject, a compacted log file.
    of: str | None = None
    compact: bool = False


def parse(key: str) -> Name:
    """The `Name` of a key under a checkpoint location (UNKNOWN for anything Spark does
    not write there)."""
    parts = key.split("/")
    leaf = parts[-1]
    if parts[0] == REPAIRED_DIR and len(parts) > 1:  # whatever it is, it was set aside
        return Name(key, Kind.REPAIRED)
    if leaf.endswith(".crc") and leaf.startswith("."):
        return Name(key, Kind.CRC, of="/".join([*parts[:-1], leaf[1:-4]]))
    if leaf.endswith(".crc") and _VERSIONED.match(leaf[:-4]):  # Spark 4's own checksums
        return Name(key, Kind.CRC, of="/".join([*parts[:-1], leaf[:-4]]))
    if _TEMP.search(leaf):
        return Name(key, Kind.TEMP)
    if len(parts) == 1:
        if leaf == ROLLBACK_MARKER:
            return Name(key, Kind.ROLLBACK_MARKER)
        return Name(key, Kind.QUERY_METADATA if leaf == QUERY_METADATA else Kind.UNKNOWN)
    top = parts[0]
    if top in (OFFSETS_DIR, COMMITS_DIR) and len(parts) == 2 and _BATCH.match(leaf):
        kind = Kind.OFFSETS if top == OFFSETS_DIR else Kind.COMMITS
        return Name(key, kind, batch=int(leaf))
    if top == SOURCES_DIR and len(parts) == 3 and is_decimal(parts[1]):
        match = _BATCH.match(leaf) or _COMPACT.match(leaf)
        if match:
            return Name(
                key,
                Kind.SOURCE_LOG,
                batch=int(match.group(1)),
                source=int(parts[1]),
                compact=leaf.endswith(".compact"),
            )
    if top == STATE_DIR and len(parts) >= 3 and is_decimal(parts[1]):
        return _state_file(key, int(parts[1]), parts[2:])
    return Name(key, Kind.UNKNOWN)


def is_decimal(text: str) -> bool:
    """A number as Spark writes one in a name: ASCII digits. `str.isdigit` alone also
    takes ``²`` (which int() refuses) and ``١٢`` (which no Spark writes)."""
    return text.isascii() and text.isdigit()


def _state_file(key: str, operator: int, rest: list[str]) -> Name:
    if rest[0] in ("_metadata", "_stateSchema"):
        # a file in them (``_metadata/metadata``, ``_metadata/v2/N``,
        # ``_stateSchema/STORE/N_ID``); S3A's directory markers list as the bare folders
        folder = len(rest) < (3 if rest[0] == "_stateSchema" else 2) or rest[1:] == ["v2"]
        return Name(key, Kind.UNKNOWN if folder else Kind.OPERATOR_METADATA)
    if not is_decimal(rest[0]) or len(rest) < 2:
        return Name(key, Kind.UNKNOWN)
    partition = int(rest[0])
    inside = rest[1:]
    store = DEFAULT_STORE
    if len(inside) > 1 and inside[0] not in _STORE_SUBDIRS:
        store, inside = inside[0], inside[1:]
    sid = StoreId(operator, partition, store)
    if inside == ["_metadata", "schema"]:
        return Name(key, Kind.STORE_SCHEMA, store=sid)
    if len(inside) == 2 and inside[0] == "SSTs" and inside[1].endswith(".sst"):
        return Name(key, Kind.SST, store=sid)
    if len(inside) == 2 and inside[0] == "logs" and inside[1].endswith(".log"):
        return Name(key, Kind.ROCKSDB_LOG, store=sid)
    match = _VERSIONED.match(inside[0]) if len(inside) == 1 else None
    if match is None:
        return Name(key, Kind.UNKNOWN, store=sid)
    return Name(
        key,
        _EXT_KIND[match["ext"]],
        version=int(match["version"]),
        unique_id=match["uid"],
        store=sid,
    )


def version_file(store: StoreId, version: int, ext: str, unique_id: str | None = None) -> str:
    """The key of a store's version file (``zip``, ``changelog``, ``delta``, ``snapshot``)."""
    stem = f"{version}_{unique_id}" if unique_id else str(version)
    return f"{store.prefix}/{stem}.{ext}"


def crc_of(key: str) -> str:
    """The key of Hadoop's checksum file beside `key`."""
    head, _, leaf = key.rpartition("/")
    return f"{head}/.{leaf}.crc" if head else f".{leaf}.crc"
