"""The key/value records of the HDFS-backed provider's ``.delta`` and ``.snapshot`` files
and of RocksDB's ``.changelog`` files, read from their decompressed stream
(`state_files.decompressed`).

A changelog of checkpoint format v2 starts with a header (``v3`` and its lineage, each a
``writeUTF``), skipped here. Each record is the key's size (a big-endian int), the
key's UnsafeRow, the value's size and the value's UnsafeRow; in a delta or changelog a
value size of -1 deletes the key. A key size of -1 ends the records, and nothing may
follow it. Records are cut from the blocks a batch at a time (`record_batches`,
`changelog_batches`: what keeps or routes many records takes them so, with no Python step
per record between it and the parser). Memory: a block and a batch; a record claiming
more than `MAX_RECORD_BYTES` is refused before it is gathered.

The typed changelogs of column families (transformWithState's; ``v2``, and ``v4`` with
format v2's lineage after it) are records of a type byte each (`TypedOp`): a put (key,
value), a delete (key, then -1), a merge (key, a value to append to the key's), a range
delete (first key, end key); a 0 ends them (`typed_changelog_records`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from enum import IntEnum
from typing import TypeVar

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Spark's rows are Java arrays (under 2 GiB); a state row near this is not a real one.
MAX_RECORD_BYTES = 512 << 20
_INT = struct.Struct(">i")


_V = TypeVar("_V", bytes, bytes | None)
#: A batch of records: their key rows and value rows (None: a delete), in file order.
Batch = tuple[list[bytes], list[bytes | None]]


def records(blocks: Iterator[bytes], key: str, *, deletes: bool) -> Iterator[
        tuple[bytes, bytes | None]]:
    """(key row, value row, or None for a delete) of each record, in file order.
    `deletes`: whether a value size of -1 is allowed (deltas; not snapshots)."""
    return one_by_one(record_batches(blocks, key, deletes=deletes))


def record_batches(blocks: Iterator[bytes], key: str, *, deletes: bool) -> Iterator[Batch]:
    """`records`, a batch at a time (those whole in a block, or in a few)."""
    return _batches(_Stream(blocks, key), key, deletes=deletes)


def one_by_one(batches: Iterable[tuple[list[bytes], list[_V]]]) -> Iterator[tuple[bytes, _V]]:
    """Batches' records, one at a time."""
    for keys, values in batches:
        yield from zip(keys, values, strict=True)


#: Records gathered before a batch is handed on.
_BATCH_RECORDS = 1024


def _batches(stream: _Stream, key: str, *, deletes: bool) -> Iterator[Batch]:
    # The hot loop of every offline read: the records whole in the stream's buffer are cut
    # from it in one loop, their sizes unpacked in place; a record that runs past the
    # buffer's end is joined (`_Stream.need`), then the loop goes on.
    count = 0
    unpack = _INT.unpack_from
    keys: list[bytes] = []
    values: list[bytes | None] = []
    while True:
        buffer, at = stream.buffer, stream.at
        end = len(buffer)
        add_key, add_value = keys.append, values.append
        # A record whole in the buffer is no larger than it (a block, at most 32 MiB, or
        # one record joined after its sizes were checked): no bound checked here.
        while end - at >= 8:
            (size,) = unpack(buffer, at)
            start = at + 8 + size
            if size < 0 or start > end:
                break
            (value_size,) = unpack(buffer, start - 4)
            stop = start + value_size
            if value_size < 0 or stop > end:
                if value_size != -1 or not deletes:
                    break
                add_key(buffer[at + 4 : start - 4])
                add_value(None)
                at = start
                continue
            add_key(buffer[at + 4 : start - 4])
            add_value(buffer[start:stop])
            at = stop
        stream.at = at
        if len(keys) >= _BATCH_RECORDS:
            count += len(keys)
            yield keys, values
            keys, values = [], []
        # The next record is not whole in the buffer, or ends the records, or is refused
        # (after the records before it: a reader names what it meets first in the file).
        try:
            stream.need(4)
            buffer, at = stream.buffer, stream.at
            (size,) = unpack(buffer, at)
            if size == -1:
                stream.at = at + 4
                break
            _checked(size, key, count + len(keys), "key")
            stream.need(8 + size)
            buffer, at = stream.buffer, stream.at
            (value_size,) = unpack(buffer, at + 4 + size)
            if not (value_size == -1 and deletes):
                _checked(value_size, key, count + len(keys), "value")
                stream.need(8 + size + value_size)
        except SparkCheckpointError:
            if keys:
                yield keys, values
            raise
    if keys:
        yield keys, values
    if not stream.at_end():
        raise SparkCheckpointError(f"{key}: data after the end of the records")


class TypedOp(IntEnum):
    """A typed changelog record's type byte, as Spark writes it."""

    END = 0x00
    PUT = 0x01
    DELETE = 0x10
    MERGE = 0x11
    DELETE_RANGE = 0x20


def changelog_records(blocks: Iterator[bytes], key: str, *, typed: bool = False
                      ) -> Iterator[tuple[bytes, bytes | None]]:
    """A RocksDB changelog's records (`records` with deletes), after its header.
    `typed`: a changelog of column families (v2, v4) is read to its end (its last byte
    the end record, 0) and gives no records, rather than being refused."""
    return one_by_one(changelog_batches(blocks, key, typed=typed))


def changelog_batches(blocks: Iterator[bytes], key: str, *, typed: bool = False
                      ) -> Iterator[Batch]:
    """`changelog_records`, a batch at a time."""
    stream = _Stream(blocks, key)
    head = stream.peek(3)
    if head[:3] == b"\x00\x02v":
        version = stream.utf()
        if version in ("v2", "v4") and typed:
            stream.drain_to_end_record(b"\x00")
            return iter(())
        if version != "v3":
            raise SparkCheckpointError(
                f"{key}: a changelog {version[:8]!r} (column families) is read by state "
                "variable only")
        stream.utf()  # the lineage (stores.resolve has read it)
    return _batches(stream, key, deletes=True)


def typed_changelog_records(blocks: Iterator[bytes], key: str
                            ) -> Iterator[tuple[TypedOp, bytes, bytes | None]]:
    """A typed changelog's (v2, v4) records in file order: (type, key, value), the value
    None for a delete and the end key for a range delete. Refused in one line where it is
    not a typed changelog, a type byte is unknown, or the records do not end."""
    stream = _Stream(blocks, key)
    if stream.peek(3) != b"\x00\x02v" or (version := stream.utf()) not in ("v2", "v4"):
        raise SparkCheckpointError(f"{key}: not a changelog of column families (v2, v4)")
    if version == "v4":
        stream.utf()  # the lineage (stores.resolve has read it)
    count = 0
    while True:
        code = stream.take(1)[0]
        try:
            op = TypedOp(code)
        except ValueError:
            raise SparkCheckpointError(
                f"{key}: record {count} has an unknown type {code:#04x}") from None
        if op is TypedOp.END:
            break
        row = stream.take(_checked(stream.int(), key, count, "key"))
        size = stream.int()
        if op is TypedOp.DELETE:
            if size != -1:
                raise SparkCheckpointError(f"{key}: record {count} deletes with a value")
            yield op, row, None
        else:
            yield op, row, stream.take(_checked(size, key, count, "value"))
        count += 1
    if not stream.at_end():
        raise SparkCheckpointError(f"{key}: data after the end of the records")


def _checked(size: int, key: str, index: int, what: str) -> int:
    if not 0 <= size <= MAX_RECORD_BYTES:
        raise SparkCheckpointError(f"{key}: record {index} has a {what} of size {size}")
    return size


class _Stream:
    """The decompressed blocks as one byte stream: `buffer` from `at` holds what is read
    and not yet taken. It is a block itself, read in place; only a record that runs past
    a block's end is joined into a buffer of its own (what is left of the block, then as
    much of the next ones as it needs), the rest of the last block read in place after
    it."""

    def __init__(self, blocks: Iterator[bytes], key: str) -> None:
        self._blocks = blocks
        # bytes, not a bytearray: a record's rows are sliced out of it in one copy
        self.buffer = b""
        self.at = 0
        #: The block (and where in it) read after the joined buffer.
        self._rest: tuple[bytes, int] | None = None
        self._key = key

    def _next(self) -> tuple[bytes, int] | None:
        if self._rest is not None:
            rest, self._rest = self._rest, None
            return rest
        block = next(self._blocks, None)
        return None if block is None else (block, 0)

    def _fill(self, n: int) -> bool:
        have = len(self.buffer) - self.at
        while have == 0 and n > 0:  # nothing left here: the next block, in place
            following = self._next()
            if following is None:
                return False
            self.buffer, self.at = following
            have = len(self.buffer) - self.at
        if have >= n:
            return True
        parts = [self.buffer[self.at:]]
        while have < n:
            following = self._next()
            if following is None:
                break
            block, at = following
            used = min(len(block) - at, n - have)
            parts.append(block[at : at + used])
            have += used
            if at + used < len(block):
                self._rest = (block, at + used)
        self.buffer, self.at = b"".join(parts), 0
        return have >= n

    def need(self, n: int) -> None:
        """At least `n` bytes from `at` (the buffer may be compacted: read `at` again)."""
        if len(self.buffer) - self.at < n and not self._fill(n):
            raise SparkCheckpointError(f"{self._key}: the records are cut short")

    def take(self, n: int) -> bytes:
        self.need(n)
        out = self.buffer[self.at : self.at + n]
        self.at += n
        return out

    def peek(self, n: int) -> bytes:
        """Up to `n` next bytes, left to be read."""
        self._fill(n)
        return self.buffer[self.at : self.at + n]

    def utf(self) -> str:
        (length,) = struct.unpack(">H", self.take(2))
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise SparkCheckpointError(f"{self._key}: a header that is not UTF-8") from None

    def int(self) -> int:
        value: int = _INT.unpack(self.take(4))[0]
        return value

    def at_end(self) -> bool:
        return not self._fill(1)

    def drain_to_end_record(self, end: bytes) -> None:
        """Read the rest (memory: one block); refused unless it ends with `end`."""
        last = self.buffer[self.at:][-len(end):]
        self.buffer, self.at = b"", 0
        while (following := self._next()) is not None:
            block, at = following
            last = (last + block[at:])[-len(end):]
        if last != end:
            raise SparkCheckpointError(f"{self._key}: the records do not end (truncated?)")


_LIST_SIZE = struct.Struct("<i")


def list_elements(raw: bytes, where: str) -> list[bytes]:
    """A list state's value as its elements (each its 4-byte size and row), read with or
    without a ``,`` after each: no element's size starts with that byte (a version byte
    and an UnsafeRow are 8k + 1 bytes)."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise SparkCheckpointError(f"{where}: a list value cut short")
        (size,) = _LIST_SIZE.unpack_from(raw, at)
        if not 0 < size <= len(raw) - at - 4:
            raise SparkCheckpointError(f"{where}: a list element of {size} bytes")
        out.append(raw[at : at + 4 + size])
        at += 4 + size
        if raw[at : at + 1] == b",":
            at += 1
    return out
