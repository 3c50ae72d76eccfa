"""The keys a store version's deltas or changelogs touch, the newest record of each winning
(None: deleted), as a reader replays them over the version's base snapshot. Held in a dict
while they are few; once they pass `IN_MEMORY_BYTES` they move to a temporary RocksDB on
local disk (rocksdict, no write-ahead log), so the reader's memory does not grow with the
state: a RocksDB store with changelog checkpointing whose maintenance has written no
snapshot yet keeps a whole partition's state in its changelogs.

The survivors come out in key order where asked (RocksDB's bytewise order, which a writer
of SSTs needs), from the RocksDB in its own order.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from pathlib import Path

from rocksdict import DBCompressionType, Options, Rdict, WriteOptions

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Bytes of keys and values (and a dict entry's overhead) held in memory before the
#: changes move to local disk. Spilled changes cost about 2.5x the CPU of held ones (a
#: RocksDB put and a read back per record: 3 s more per million 1 KiB records, which
#: took the offline read below Spark's own), so the bound is set for memory, not for
#: speed: a partition's changes up to a quarter GiB stay in memory.
IN_MEMORY_BYTES = 256 << 20
#: The temporary RocksDB's write buffer.
_WRITE_BUFFER = 64 << 20
#: What a dict entry and its two bytes objects cost beyond their bytes.
_ENTRY_BYTES = 150
#: What the RocksDB holds for a deleted key: one byte no state value can be (an HDFS-backed
#: store's value is an UnsafeRow, a multiple of 8 bytes; a RocksDB store's is its encoding
#: version, 0, then one; statehold reads no other version), so a value is kept as it is.
_DELETED = b"\xff"


class VersionChanges:
    """The changes replayed so far, newest wins; `directory` (the caller's, removed by it)
    holds the RocksDB once they spill. Close it before the directory goes."""

    def __init__(self, directory: Path, *, limit: int | None = None) -> None:
        self._directory = directory
        self._limit = IN_MEMORY_BYTES if limit is None else limit
        self._held: dict[bytes, bytes | None] = {}
        self._bytes = 0
        self._db: Rdict | None = None

    @property
    def spilled(self) -> bool:
        return self._db is not None

    def update(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Each record replaces what an earlier one said of its key."""
        rest = iter(records)
        if self._db is None:
            held = self._held
            for key, value in rest:
                held[key] = value
                self._bytes += len(key) + (len(value) if value is not None else 0) + _ENTRY_BYTES
                if self._bytes > self._limit:
                    self._spill()
                    break
            else:
                return
        db = self._db
        assert db is not None
        try:
            for key, value in rest:
                db[key] = _DELETED if value is None else value
        except SparkCheckpointError:
            raise
        except Exception as e:  # rocksdict raises RocksDB's status as its own exceptions
            raise SparkCheckpointError(f"the changes cannot be kept on local disk ({e})") from None

    def __contains__(self, key: bytes) -> bool:
        if self._db is None:
            return key in self._held
        return self._db.get(key) is not None

    def survivors(self, *, in_key_order: bool) -> Generator[tuple[bytes, bytes], None, None]:
        """The keys not deleted, with their newest values."""
        if self._db is None:
            kept = [(k, v) for k, v in self._held.items() if v is not None]
            if in_key_order:
                kept.sort()
            yield from kept
            return
        for key, value in self._db.items():
            if value != _DELETED and isinstance(key, bytes) and isinstance(value, bytes):
                yield key, value

    def close(self) -> None:
        self._held = {}
        if self._db is not None:
            self._db.close()
            self._db = None

    def _spill(self) -> None:
        """The held changes into a new RocksDB under the directory, the dict let go."""
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(min(self._limit, _WRITE_BUFFER))
        options.set_compression_type(DBCompressionType.none())  # read back once, soon
        try:
            db = Rdict(str(self._directory / "changes"), options=options)
            write = WriteOptions()
            # a property in rocksdict, though its stubs call it a method
            write.disable_wal = True  # type: ignore[method-assign,assignment]
            db.set_write_options(write)
            for key, value in self._held.items():
                db[key] = _DELETED if value is None else value
        except Exception as e:  # rocksdict raises RocksDB's status as its own exceptions
            raise SparkCheckpointError(f"the changes cannot be kept on local disk ({e})") from None
        self._held = {}
        self._db = db
