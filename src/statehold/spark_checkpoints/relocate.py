"""The absolute paths that bind a Spark checkpoint location to its old place, and their
rewrite when the location (or its input, or its file sink's output) moved.

A checkpoint is mostly relative to itself, except:

* a file source's log (``sources/I/N``) names every file it read by its full URI; a
  restart lists the input directory and takes any file whose URI its log does not name
  as new, so a moved input would be read again;
* operator metadata v2 (Spark 4, ``state/OP/_metadata/v2/N``) names its state schema
  files by full path;
* a file sink's ``_spark_metadata`` log names the files it wrote by full URI (readers of
  the sink's output go through it).

Each log file is rewritten whole and in place atomically, its version line and every
field other than the path unchanged; Hadoop's ``.NAME.crc`` beside it is rewritten to
match (an outdated one would fail Spark's read).
"""

from __future__ import annotations

import json
import operator
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import SOURCES_DIR, Kind, crc_of, is_decimal
from statehold.spark_checkpoints.location import SparkCheckpoint, refuse_alive
from statehold.spark_checkpoints.rollback import DEFAULT_GRACE_SECONDS, SINK_LOG_DIR
from statehold.spark_checkpoints.rollback_marker import refuse_unfinished
from statehold.spark_checkpoints.savepoint import operator_file_batch
from statehold.storage import Storage, StorageError, open_storage

Where = Literal["source log", "operator metadata", "sink log"]
_HADOOP_BYTES_PER_CHECKSUM = 512
_FIRST = operator.itemgetter(0)


class BoundPath(BaseModel):
    """An absolute path in a checkpoint file."""

    key: str
    path: str
    where: Where


class RelocateReport(BaseModel):
    checkpoint: str
    from_prefix: str
    to_prefix: str
    sink: str | None = None
    dry_run: bool
    #: The files rewritten (or that would be), checkpoint keys then sink keys.
    files: list[str] = Field(default_factory=list)
    paths: int = 0
    #: Absolute paths left that start with neither prefix (bound elsewhere still).
    others: list[BoundPath] = Field(default_factory=list)


class _Doc:
    """One log file, split into its version line and its JSON documents."""

    def __init__(self, storage: Storage, key: str, where: Where) -> None:
        self.storage, self.key, self.where = storage, key, where
        text = _read(storage, key)
        self.version, _, rest = text.partition("\n")
        if where == "operator metadata":
            self.docs: list[Any] = [json.loads(rest)]
        else:
            self.docs = [json.loads(line) for line in rest.split("\n") if line]

    def paths(self) -> list[str]:
        out: list[str] = []

        def one(path: str) -> str:
            out.append(path)
            return path

        self._walk(one)
        return out

    def rewrite(self, change: Callable[[str], str]) -> int:
        count = [0]

        def one(path: str) -> str:
            new = change(path)
            count[0] += new != path
            return new

        self._walk(one)
        return count[0]

    def _walk(self, fn: Callable[[str], str]) -> None:
        for doc in self.docs:
            if not isinstance(doc, dict):
                continue
            if self.where == "operator metadata":
                for info in doc.get("stateStoreInfo") or []:
                    paths = info.get("stateSchemaFilePaths")
                    if isinstance(paths, list):
                        info["stateSchemaFilePaths"] = [
                            fn(p) if isinstance(p, str) else p for p in paths
                        ]
            elif isinstance(doc.get("path"), str):
                doc["path"] = fn(doc["path"])

    def render(self) -> bytes:
        lines = [json.dumps(d, separators=(",", ":"), ensure_ascii=False) for d in self.docs]
        return "\n".join([self.version, *lines]).encode("utf-8")


def absolute_paths(
    checkpoint: SparkCheckpoint,
    *,
    sink: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[BoundPath]:
    """Every absolute path in the checkpoint's file logs and operator metadata (and in
    the file sink's log at `sink`), in key order."""
    return [
        BoundPath(key=d.key, path=p, where=d.where)
        for d in _documents(checkpoint, sink, storage_options)
        for p in d.paths()
    ]


def relocate(
    checkpoint: SparkCheckpoint,
    from_prefix: str,
    to_prefix: str,
    *,
    sink: str | None = None,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    force: bool = False,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> RelocateReport:
    """Rewrite every absolute path starting with `from_prefix` to start with `to_prefix`
    instead. A plain local path as prefix also matches the ``file://`` URIs Spark
    writes. With `dry_run`, only say what would be rewritten. Refused while the query
    looks alive (a log or state file written within `grace_seconds`; `force` to go on):
    a running query reads a log it may find rewritten before its checksum is, and
    writes new entries with the old paths."""
    if not from_prefix or not to_prefix:
        raise SparkCheckpointError("relocate needs a prefix to rewrite and one to write")
    if not dry_run:
        found = checkpoint.scan()
        refuse_unfinished(checkpoint.storage, found, "relocate")
        if not force:
            refuse_alive(found, grace_seconds, "force the relocation")
    change = _changer(from_prefix, to_prefix)
    docs = _documents(checkpoint, sink, storage_options)
    report = RelocateReport(
        checkpoint=checkpoint.uri,
        from_prefix=from_prefix,
        to_prefix=to_prefix,
        sink=sink,
        dry_run=dry_run,
    )
    changed: list[_Doc] = []
    for doc in docs:
        report.others += [
            BoundPath(key=doc.key, path=p, where=doc.where) for p in doc.paths() if change(p) == p
        ]
        count = doc.rewrite(change)
        if count:
            changed.append(doc)
            report.paths += count
    report.files = [d.key for d in changed]
    if not dry_run:
        for doc in changed:
            _write(doc.storage, doc.key, doc.render())
    return report


def _changer(old: str, new: str) -> Callable[[str], str]:
    """Prefix replacement; a plain absolute path also stands for its file: URIs (moved to
    the new path's file: URIs, or to the new URI: a local location copied to S3)."""
    pairs = [(old, new)]
    if old.startswith("/"):
        local = new.startswith("/")
        pairs += [(f"file://{old}", f"file://{new}" if local else new),
                  (f"file:{old}", f"file:{new}" if local else new)]

    def change(path: str) -> str:
        for a, b in pairs:
            if path == a or path.startswith(a.rstrip("/") + "/"):
                return b.rstrip("/") + path[len(a.rstrip("/")) :]
        return path

    return change


def _documents(
    checkpoint: SparkCheckpoint, sink: str | None, options: Mapping[str, Any] | None
) -> list[_Doc]:
    found = checkpoint.scan()
    docs: list[_Doc] = []
    for key, name in sorted(found.names.items()):
        if name.kind is Kind.SOURCE_LOG and key.startswith(f"{SOURCES_DIR}/"):
            doc = _file_log(checkpoint.storage, key, "source log")
        elif operator_file_batch(key) is not None and "/_metadata/v2/" in key:
            doc = _parsed(checkpoint.storage, key, "operator metadata")
        else:
            continue
        if doc is not None:
            docs.append(doc)
    if sink:
        try:
            storage = open_storage(sink, **dict(options or {}))
        except (StorageError, ValueError) as e:
            raise SparkCheckpointError(f"{sink}: cannot open ({e})") from None
        for info in sorted(storage.list(SINK_LOG_DIR), key=lambda i: i.key):
            leaf = info.key.rsplit("/", 1)[-1]
            if is_decimal(leaf.removesuffix(".compact")):
                doc = _file_log(storage, info.key, "sink log")
                if doc is not None:
                    docs.append(doc)
    return docs


def _file_log(storage: Storage, key: str, where: Where) -> _Doc | None:
    """A file log; None for a source log of another kind (a Kafka source's)."""
    doc = _parsed(storage, key, where)
    if doc is None or not all(isinstance(d, dict) and "path" in d for d in doc.docs):
        return None
    return doc


def _parsed(storage: Storage, key: str, where: Where) -> _Doc | None:
    try:
        doc = _Doc(storage, key, where)
    except ValueError:
        return None
    if not (doc.version.startswith("v") and is_decimal(doc.version[1:])):
        return None
    return doc


def _read(storage: Storage, key: str) -> str:
    try:
        return storage.read(key).decode("utf-8")
    except StorageError as e:
        raise SparkCheckpointError(f"{key}: cannot be read ({e})") from None


def _write(storage: Storage, key: str, data: bytes) -> None:
    """Replace `key` atomically, then Hadoop's checksum beside it if it has one (the
    query is stopped: nothing reads the pair in between)."""
    crc = crc_of(key)
    try:
        had_crc = storage.exists(crc)
        storage.write(key, data)
        if had_crc:
            storage.write(crc, hadoop_crc(data))
    except StorageError as e:
        raise SparkCheckpointError(f"{key}: cannot be rewritten ({e})") from None


def hadoop_crc(data: bytes | memoryview) -> bytes:
    """Hadoop's ChecksumFileSystem ``.NAME.crc``: ``crc\\0``, the bytes per checksum,
    then a CRC-32 of every 512-byte chunk (big-endian)."""
    step = _HADOOP_BYTES_PER_CHECKSUM
    whole = len(data) - len(data) % step
    # the whole chunks cut and summed in C loops (a call per chunk is what it costs)
    sums = array("I", map(zlib.crc32, map(_FIRST, struct.iter_unpack(f"{step}s",
                                                                     data[:whole]))))
    if whole < len(data):
        sums.append(zlib.crc32(data[whole:]))
    if sys.byteorder == "little":
        sums.byteswap()
    return b"crc\x00" + struct.pack(">i", step) + sums.tobytes()
