"""The keys a store version's deltas or changelogs touch, the newest record of each winning
(None: deleted), as a reader replays them over the version's base snapshot. Held in a dict
while they are few; once they pass `IN_MEMORY_BYTES` they move to a temporary RocksDB on
local disk (rocksdict, no write-ahead log), so the reader's memory does not grow with the
state: a RocksDB store with changelog checkpointing whose maintenance has written no
snapshot yet keeps a whole partition's state in its changelogs.

The survivors come out in key order where asked (RocksDB's bytewise order, which a writer
of SSTs needs), from the RocksDB in its own order.

A writer whose later runs replace its earlier ones (a RocksDB version built from sorted
runs, `rocksdb_writer.VersionRuns`) needs no spill: it takes the held changes, deletes
included, each time they pass the bound (`spill=False`, `full`, `taken`), so its memory
holds one bound of changes whatever the state's size.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from pathlib import Path

from rocksdict import DBCompressionType, Options, Rdict, WriteOptions

from statehold.spark_checkpoints.errors import SparkCheckpointError

#: Bytes of keys and values (and a dict entry's overhead) held in memory before the
#: changes move to local disk. Spilled changes cost about 2.5x the CPU of held ones (a
#: RocksDB put and a read back per record: 3 s more per million 1 KiB records, which
#: took the offline read below Spark's own), so the bound is set for memory, not for
#: speed: a partition's changes up to a quarter GiB stay in memory.
IN_MEMORY_BYTES = 256 << 20
#: Survivors given at once.
BATCH = 4096
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

    def __init__(self, directory: Path, *, limit: int | None = None, spill: bool = True
                 ) -> None:
        self._directory = directory
        self._limit = IN_MEMORY_BYTES if limit is None else limit
        self._spill_when_full = spill
        self._held: dict[bytes, bytes | None] = {}
        self._bytes = 0
        #: Whether a delete may be among the held changes.
        self._deletes = False
        self._db: Rdict | None = None

    @property
    def spilled(self) -> bool:
        return self._db is not None

    @property
    def touched(self) -> bool:
        """Whether any key was changed."""
        return self._db is not None or bool(self._held)

    def update(self, batches: Iterable[tuple[list[bytes], list[bytes | None]]]) -> None:
        """Each batch's records (keys, values; None: a delete) replace what earlier ones
        said of their keys. Held ones are counted a batch at a time, so they pass the
        bound by at most a batch before they spill."""
        for keys, values in batches:
            if self._db is None:
                self._held.update(zip(keys, values, strict=True))
                try:
                    value_bytes = sum(map(len, values))  # type: ignore[arg-type]
                except TypeError:  # a delete among them
                    self._deletes = True
                    value_bytes = sum(len(v) for v in values if v is not None)
                self._bytes += sum(map(len, keys)) + value_bytes + _ENTRY_BYTES * len(keys)
                if self._spill_when_full and self.full:
                    self._spill()
                continue
            db = self._db
            try:
                for key, value in zip(keys, values, strict=True):
                    db[key] = _DELETED if value is None else value
            except Exception as e:  # rocksdict raises RocksDB's status as its own exceptions
                raise SparkCheckpointError(
                    f"the changes cannot be kept on local disk ({e})") from None

    @property
    def full(self) -> bool:
        """Whether the held changes passed the bound."""
        return self._bytes > self._limit

    def taken(self) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """The held changes, a delete as None, in key order, `BATCH` at a time; taken out
        now (the changes are empty again when this returns), given as they are read."""
        held, self._held, self._bytes, self._deletes = self._held, {}, 0, False
        keys = sorted(held)

        def batches() -> Iterator[tuple[list[bytes], list[bytes | None]]]:
            for at in range(0, len(keys), BATCH):
                some = keys[at : at + BATCH]
                yield some, list(map(held.__getitem__, some))

        return batches()

    def __contains__(self, key: bytes) -> bool:
        if self._db is None:
            return key in self._held
        return self._db.get(key) is not None

    def survivors(self, *, in_key_order: bool
                  ) -> Generator[tuple[list[bytes], list[bytes]], None, None]:
        """The keys not deleted, with their newest values, `BATCH` at a time."""
        if self._db is None:
            held = self._held
            keys = [k for k, v in held.items() if v is not None] if self._deletes else list(held)
            if in_key_order:
                keys.sort()  # the keys alone: bytes compared, not tuples
            for at in range(0, len(keys), BATCH):
                some = keys[at : at + BATCH]
                yield some, list(map(held.__getitem__, some))  # type: ignore[arg-type]
            return
        keys, values = [], []
        for key, value in self._db.items():
            if value != _DELETED and isinstance(key, bytes) and isinstance(value, bytes):
                keys.append(key)
                values.append(value)
                if len(keys) >= BATCH:
                    yield keys, values
                    keys, values = [], []
        if keys:
            yield keys, values

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
