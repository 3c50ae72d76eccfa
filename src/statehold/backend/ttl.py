"""The TTL sweep: delete a range's expired state entries, so storage really shrinks.

Every write of a TTL'd entry adds ``(expiry, entry key)`` to its key group's TTL index
(keys.py). The sweep walks each key group's index up to `now_ms` and deletes an entry
only if its stored expiry is still due (a rewrite renewed it otherwise), then the index
entry. It runs once per task and batch, before the snapshot, so a checkpoint never holds
what had expired when its batch ran; RocksDB drops the deleted bytes at its next
compaction (the backend marks files dense with deletions for compaction).
"""

from __future__ import annotations

from statehold.backend.keys import StateKind, decode_time, index_prefix
from statehold.backend.state import KV
from statehold.metadata import KeyGroupRange


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

