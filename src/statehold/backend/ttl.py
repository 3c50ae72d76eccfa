"""The TTL sweep: delete a range's expired state entries, so storage really shrinks.

Every write of a TTL'd entry adds ``(expiry, entry key)`` to its key group's TTL index
(keys.py). The sweep walks each key group's index up to `now_ms` and deletes an entry
only if its stored expiry is still due (a rewrite renewed it otherwise), then the index
entry. It runs once per task and batch, before the snapshot, so a checkpoint never holds
what had expired when its batch ran. RocksDB drops deleted bytes only when it compacts
(universal compaction waits for 16 sorted runs), so a batch that left more garbage than
`MAX_GARBAGE` compacts the task's DB at once (`compact_if_garbage`), whatever deleted
it: the sweep, timers that fired, state the processor cleared (`expire_and_compact`, what
every task runs before its snapshot). Measured with keys churning under a TTL or closed
by timers, storage stays near the live state instead of a sawtooth up to 7.5x
(bench/ttl_churn.py, docs/benchmarks.md).
"""

from __future__ import annotations

import re
from typing import Any

from statehold.backend.keys import StateKind, decode_time, index_prefix
from statehold.backend.state import KV
from statehold.format.metadata import KeyGroupRange

#: Garbage (deleted entries and tombstones) share of SST entries that makes a sweep's
#: task compact its DB: storage stays within ~1.3x of the live state.
MAX_GARBAGE = 0.25


def sweep_expired(kv: KV, key_groups: KeyGroupRange, now_ms: int) -> int:
    """Delete the entries of `key_groups` expired at `now_ms`; the number deleted."""
    removed = 0
    for group in range(key_groups.start, key_groups.end + 1):
        prefix = index_prefix(group, StateKind.TTL_INDEX)
        due: list[bytes] = []
        for raw, _ in kv.scan(prefix):
            if decode_time(raw[len(prefix) :]) > now_ms:
                break
            due.append(raw)
        for raw in due:
            entry = raw[len(prefix) + 8 :]
            data = kv.get(entry)
            if data is not None and decode_time(data) <= now_ms:
                kv.delete(entry)
                removed += 1
            kv.delete(raw)
    return removed


def expire_and_compact(
    kv: KV, db: Any, key_groups: KeyGroupRange, now_ms: int,
    max_garbage: float = MAX_GARBAGE,
) -> tuple[int, bool]:
    """End of a task's batch, before its snapshot: sweep what expired at `now_ms`, then
    compact if the batch's deletions of any kind left more than `max_garbage` garbage.
    Returns (entries the sweep deleted, whether it compacted)."""
    expired = sweep_expired(kv, key_groups, now_ms)
    return expired, compact_if_garbage(db, max_garbage)


def _table_counts(db: Any) -> tuple[int, int]:
    """(entries, deletions) over the DB's SST files (RocksDB's aggregated properties)."""
    text = db.property_value("rocksdb.aggregated-table-properties") or ""
    counts = dict(re.findall(r"# (entries|deletions)=(\d+)", text))
    return int(counts.get("entries", 0)), int(counts.get("deletions", 0))


def compact_if_garbage(db: Any, max_garbage: float = MAX_GARBAGE) -> bool:
    """Flush, and compact the whole DB if deleted entries and their tombstones exceed
    `max_garbage` of its SST entries (after a sweep: stored state stays within about
    1 / (1 - max_garbage) of the live state, at the price of uploading the compacted
    files again). True if it compacted."""
    db.flush()
    entries, deletions = _table_counts(db)
    if not entries or 2 * deletions <= max_garbage * entries:
        return False
    db.compact_range(None, None)
    return True
