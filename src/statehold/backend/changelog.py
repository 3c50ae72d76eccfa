"""Changelog commits: a checkpoint that uploads the batch's writes instead of flushing them.

A full snapshot flushes the memtable into an SST and checkpoints RocksDB on the commit path
(snapshot.py); both are mostly fixed costs (fsyncs, an SST's blocks, index and filter), so
they dominate a checkpoint of a small batch. With `changelog=True` a task also records each
write of the batch (put, delete, range delete, in order) and its checkpoint uploads that
record as one compressed Arrow IPC file instead: the state is then the last full snapshot
(the *base*) plus the changelogs written since, which a restore replays in order. The
memtable is flushed after the task, off the commit path, into the local snapshot the next
task opens (rocks.py), so in steady state nothing is replayed.

A new base is uploaded only when RocksDB no longer holds any of the base's SSTs (its oldest
run was rewritten, which a full snapshot would upload anyway) or the changelogs outgrow the
limits below, so the bytes uploaded stay about what full snapshots upload.

A changelog holds three columns, `op` (0 put, 1 delete, 2 range delete), `key` and `value`
(the value of a put, the exclusive upper bound of a range delete, else null); nothing in it
is executable or pickled.
"""

from __future__ import annotations

import hashlib
import io
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.ipc as ipc
from rocksdict import Rdict, WriteBatch

from statehold.backend.engine import RocksKV, StateBackendError

#: Task states that name changelogs carry this backend format (older readers refuse them).
CHANGELOG_FORMAT = 2
#: The most changelogs a checkpoint names after its base; the next takes a full snapshot.
MAX_CHANGELOGS = 64
#: Changelog bytes, as a share of the base's bytes, past which a full snapshot is taken.
MAX_CHANGELOG_SHARE = 1.0

PUT, DELETE, DELETE_RANGE = 0, 1, 2
SCHEMA = pa.schema([("op", pa.int8()), ("key", pa.binary()), ("value", pa.binary())])
_NAME = re.compile(r"^changelog-(?P<ckpt>\d{10})-[0-9a-f]{12}\.arrow$")
#: Records, or their bytes, buffered before they are written out as one compressed Arrow
#: batch, as the task goes: so a commit compresses only the last few (ZSTD compresses a
#: batch of 512 about as well as one of thousands).
_CHUNK = 512
_CHUNK_BYTES = 1 << 20
#: Compressed bytes a log keeps in memory before it moves to the task's local disk.
_MEMORY_MAX = 8 << 20
_IPC = ipc.IpcWriteOptions(compression="zstd")


def is_changelog(name: str | None) -> bool:
    return bool(name and _NAME.match(name))


def changelog_checkpoint(name: str) -> int:
    """The checkpoint whose task wrote the changelog `name`."""
    m = _NAME.match(name)
    if m is None:
        raise StateBackendError(f"{name!r} is not a changelog's name")
    return int(m.group("ckpt"))


def changelog_name(checkpoint_id: int) -> str:
    return f"changelog-{checkpoint_id:010d}-{uuid.uuid4().hex[:12]}.arrow"


class _Spool(io.RawIOBase):
    """Where a changelog's bytes go: memory up to `_MEMORY_MAX`, then a local file; their
    checksum is taken as they come, so a commit does not read them again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sha256 = hashlib.sha256()
        self.memory: bytearray | None = bytearray()
        self.file: BinaryIO | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        if self.memory is not None and len(self.memory) + view.nbytes > _MEMORY_MAX:
            self.file = open(self.path, "wb")  # noqa: SIM115  # closed by finish/discard
            self.file.write(self.memory)
            self.memory = None
        if self.memory is not None:
            self.memory += view
        else:
            assert self.file is not None
            self.file.write(view)
        return view.nbytes

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()


class ChangeLog:
    """The writes since the last checkpoint, written out as the task makes them: every
    `_CHUNK` records (or `_CHUNK_BYTES`) become one compressed Arrow batch of the log,
    which stays in memory up to `_MEMORY_MAX` and then goes to a local file. So memory
    stays bounded whatever the batch writes, and a commit compresses only the last
    chunk."""

    def __init__(self, directory: Path) -> None:
        self.records = 0
        self._held = 0  # bytes of keys and values buffered
        self._ops: list[int] = []
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._spool = _Spool(directory / f".changes-{uuid.uuid4().hex}.arrow")
        self._writer: ipc.RecordBatchFileWriter | None = None

    def add(self, op: int, key: bytes, value: bytes | None) -> None:
        self._ops.append(op)
        self._keys.append(key)
        self._values.append(value)
        self._held += len(key) + (len(value) if value is not None else 0)
        if len(self._ops) >= _CHUNK or self._held >= _CHUNK_BYTES:
            self._spill()

    def _spill(self) -> None:
        if not self._ops:
            return
        if self._writer is None:
            self._writer = ipc.new_file(pa.PythonFile(self._spool, mode="w"), SCHEMA,
                                        options=_IPC)
        self.records += len(self._ops)
        self._writer.write_batch(pa.record_batch(
            [pa.array(self._ops, pa.int8()), pa.array(self._keys, pa.binary()),
             pa.array(self._values, pa.binary())],
            schema=SCHEMA,
        ))
        self._ops, self._keys, self._values, self._held = [], [], [], 0

    def finish(self) -> tuple[bytes | Path, str] | None:
        """Close the log: its bytes if it stayed in memory, else its local file (not
        fsync'd: the upload makes it durable in the job), with their checksum (as
        `storage.base.file_checksum` gives it); None if nothing was written."""
        self._spill()
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        memory, path = self._spool.memory, self._spool.path
        self._spool.close()
        checksum = "sha256:" + self._spool.sha256.hexdigest()
        return (bytes(memory) if memory is not None else path), checksum

    def discard(self) -> None:
        self._writer = None
        self._spool.close()
        self._spool.path.unlink(missing_ok=True)


class LoggedKV(RocksKV):
    """RocksKV that records every write in a ChangeLog as well."""

    def __init__(self, db: Rdict, log: ChangeLog) -> None:
        super().__init__(db)
        self.log = log

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)
        self.log.add(PUT, key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)
        self.log.add(DELETE, key, None)

    def delete_range(self, lower: bytes, upper: bytes) -> None:
        self.db.delete_range(lower, upper)
        self.log.add(DELETE_RANGE, lower, upper)


def replay(db: Rdict, paths: Iterable[Path], bounds: tuple[bytes, bytes] | None = None) -> int:
    """Apply changelog files to `db` in order (only keys within [lower, upper) when
    `bounds` is given: a rescaled restore). Returns the records applied. A file that is
    not a changelog of this format is refused before any of its records is applied."""
    applied = 0
    for path in paths:
        try:
            with pa.memory_map(str(path)) as source:
                reader = ipc.open_file(source)
                if not reader.schema.equals(SCHEMA):
                    raise StateBackendError(f"{path.name}: not a changelog (schema "
                                            f"{reader.schema.names})")
                for i in range(reader.num_record_batches):
                    applied += _apply(db, reader.get_batch(i), bounds, path.name)
        except (pa.ArrowException, OSError) as e:
            raise StateBackendError(f"{path.name}: unreadable changelog: {e}") from e
    return applied


def _apply(db: Rdict, batch: pa.RecordBatch, bounds: tuple[bytes, bytes] | None,
           name: str) -> int:
    ops = batch.column(0).to_pylist()
    keys = batch.column(1).to_pylist()
    values = batch.column(2).to_pylist()
    lower, upper = bounds if bounds is not None else (b"", None)
    writes = WriteBatch(raw_mode=True)
    for op, key, value in zip(ops, keys, values, strict=True):
        if key is None:
            raise StateBackendError(f"{name}: a record without a key")
        if op == DELETE_RANGE:
            if value is None:
                raise StateBackendError(f"{name}: a range delete without its upper bound")
            lo, hi = max(key, lower), value if upper is None else min(value, upper)
            if lo < hi:
                writes.delete_range(lo, hi)
            continue
        if key < lower or (upper is not None and key >= upper):
            continue
        if op == PUT and value is not None:
            writes.put(key, value)
        elif op == DELETE:
            writes.delete(key)
        else:
            raise StateBackendError(f"{name}: bad record (op {op!r})")
    if writes.len():
        db.write(writes)
    return len(ops)
