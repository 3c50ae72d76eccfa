"""How the task backend runs RocksDB: its identity in checkpoints, its options, the raw
key-value view state.py works on, and parallel file transfers.

RocksDB runs in raw mode: keys and values are bytes and nothing is ever pickled; values are
JSON (see state.py).

Why uploads stay near the changed state (see docs/benchmarks.md, "Incremental checkpoints"):

* Universal ("tiered") compaction, not RocksDB's default leveled compaction. With leveled
  compaction every L0->L1 compaction rewrites every L1 file a flush overlaps; keys are spread
  by hash, so a batch touching 5% of the keys overlaps all of them and the next checkpoint
  re-uploads the whole state (every `RUNS_TRIGGER` flushes, and at the first open after a
  restore). Universal compaction waits for `RUNS_TRIGGER` sorted runs, then merges the
  small recent runs with each other, or rewrites the big oldest run if the others reach
  `MAX_SIZE_AMP` percent of it. Both numbers trade bytes uploaded for bytes stored; the
  defaults were chosen by measurement (docs/benchmarks.md, "The trade between bytes
  uploaded and bytes stored").
* Compaction stays off the commit path. A snapshot checkpoints the DB as it is, whatever
  compaction runs (a RocksDB checkpoint is consistent while one does); after the batch the
  task hands its working DB to a background thread, which lets the compaction finish and
  keeps its result as a local snapshot equivalent to the checkpoint just taken
  (`rocks.TaskStateBackend.close_after_compactions`). The next task of that range on this
  executor opens that one, and its checkpoint uploads the compaction's output with its
  own. Only when runs pile up to `SYNC_COMPACTION_RUNS` (background work lost again and
  again: Python workers not reused, executors lost) does a snapshot wait for compaction,
  so reads never look into an unbounded number of runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    UniversalCompactOptions,
)

from statehold.errors import StateholdError

#: Recorded in every task state this backend writes; a restore refuses any other.
BACKEND_NAME = "rocksdb"
BACKEND_FORMAT = 1
#: Sorted runs (flushes not yet merged) that trigger a universal compaction.
RUNS_TRIGGER = 16
#: The oldest (largest) run is rewritten only when the newer runs reach this % of it.
MAX_SIZE_AMP = 50
#: How long a snapshot gives a scheduled compaction to start (it then waits for it).
COMPACTION_GRACE = 0.05
#: Sorted runs at which a snapshot compacts before it checkpoints (RocksDB's own write
#: slowdown starts there too: `raw_options`).
SYNC_COMPACTION_RUNS = 4 * RUNS_TRIGGER


class StateBackendError(StateholdError):
    """State cannot be restored or snapshotted (bad metadata, checksum mismatch, ...)."""


def raw_options(size_amplification: int = MAX_SIZE_AMP) -> Options:
    """Raw mode, universal compaction (see the module docstring), bloom filters (reads
    look into up to `RUNS_TRIGGER` runs), ZSTD blocks (state is uploaded and stored, so
    its bytes cost more than the CPU to shrink them)."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.zstd())
    opts.set_compaction_style(DBCompactionStyle.universal())
    universal = UniversalCompactOptions()
    universal.max_size_amplification_percent = size_amplification
    opts.set_universal_compaction_options(universal)
    opts.set_level_zero_file_num_compaction_trigger(RUNS_TRIGGER)
    opts.set_level_zero_slowdown_writes_trigger(SYNC_COMPACTION_RUNS)
    opts.set_level_zero_stop_writes_trigger(6 * RUNS_TRIGGER)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def open_db(path: str, options: Options) -> Rdict:
    """Open (or create) the DB at `path` with `options`. The default column family gets
    them explicitly: opening an existing DB, rocksdict otherwise takes its options from the
    DB's OPTIONS file, where the bloom filter does not survive (`filter_policy=bloomfilter`
    reads back as none), so every SST written after the first batch had no filter."""
    return Rdict(path, options, column_families={"default": options})


def settle_compactions(db: Rdict) -> None:
    """Wait until no compaction runs. One scheduled by the flush just before gets
    `COMPACTION_GRACE` seconds to start; one that RocksDB keeps pending without picking
    (none of its runs qualifies yet) is not waited for."""
    deadline = time.monotonic() + COMPACTION_GRACE
    while True:
        if db.property_int_value("rocksdb.num-running-compactions"):
            deadline = time.monotonic() + COMPACTION_GRACE
        elif not db.property_int_value("rocksdb.compaction-pending") or (
            time.monotonic() >= deadline
        ):
            return
        time.sleep(0.005)


def sorted_runs(db: Rdict) -> int:
    """The DB's sorted runs, as universal compaction counts them: each level-0 file, and
    each other level that holds files."""
    runs = db.property_int_value("rocksdb.num-files-at-level0") or 0
    for level in range(1, 7):
        if db.property_int_value(f"rocksdb.num-files-at-level{level}"):
            runs += 1
    return runs


def compacting(db: Rdict) -> bool:
    """Whether a compaction runs, or RocksDB has one it could pick."""
    return bool(db.property_int_value("rocksdb.num-running-compactions")
                or db.property_int_value("rocksdb.compaction-pending"))


def in_parallel(fn: Callable[[Any], Any], items: list[Any], threads: int) -> list[Any]:
    """`fn` over `items` in order, on up to `threads` threads (none for a single item:
    most restores and snapshots of small state move one or two files)."""
    if len(items) <= 1 or threads == 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


class RocksKV:
    """The KV protocol of state.py on a raw-mode Rdict."""

    def __init__(self, db: Rdict) -> None:
        self.db = db

    def get(self, key: bytes) -> bytes | None:
        value = self.db.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.range(prefix, None, prefix)

    def last(self, prefix: bytes) -> bytes | None:
        """The greatest key starting with `prefix` (list state's newest element)."""
        it = self.db.iter()
        try:
            it.seek_for_prev(prefix + b"\xff" * 16)
            if it.valid():
                key = bytes(it.key())
                if key.startswith(prefix):
                    return key
            return None
        finally:
            del it

    def delete_range(self, lower: bytes, upper: bytes) -> None:
        self.db.delete_range(lower, upper)

    def range(
        self, lower: bytes, upper: bytes | None, prefix: bytes = b""
    ) -> Iterator[tuple[bytes, bytes]]:
        # Bounds are checked here, not with ReadOptions: rocksdict encodes ReadOptions
        # bounds in its non-raw format.
        it = self.db.iter()
        it.seek(lower)
        try:
            while it.valid():
                key = bytes(it.key())
                if (upper is not None and key >= upper) or not key.startswith(prefix):
                    return
                yield key, bytes(it.value())
                it.next()
        finally:
            del it
