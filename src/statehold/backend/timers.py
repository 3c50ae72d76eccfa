"""Timers of one task's key-group range, kept in its RocksDB beside the state (so they are
checkpointed, restored and rescaled by key group like any state).

Each timer is two entries under the empty state name of its key group (see keys.py): one
under its key (``t``: list and delete a key's timers) and one in the key group's time
index (``T``: find the due timers with one seek per key group, in time order).
"""

from __future__ import annotations

from statehold.backend.keys import (
    Key,
    StateKind,
    decode_key_part,
    decode_time,
    encode_time,
    entry_prefix,
    index_prefix,
    key_part,
)
from statehold.backend.state import KV
from statehold.format.metadata import KeyGroupRange


def _key_entry(key_group: int, key: Key, expiry_ms: int) -> bytes:
    return entry_prefix(key_group, "", StateKind.TIMER, key) + encode_time(expiry_ms)


def _index_entry(key_group: int, key: Key, expiry_ms: int) -> bytes:
    return index_prefix(key_group, StateKind.TIMER_INDEX) + encode_time(expiry_ms) + key_part(key)


class Timers:
    """Register, delete, list and fire the timers of one key-group range."""

    def __init__(self, kv: KV, key_groups: KeyGroupRange) -> None:
        self._kv = kv
        self.key_groups = key_groups

    def register(self, key_group: int, key: Key, expiry_ms: int) -> None:
        self._kv.put(_key_entry(key_group, key, expiry_ms), b"")
        self._kv.put(_index_entry(key_group, key, expiry_ms), b"")

    def delete(self, key_group: int, key: Key, expiry_ms: int) -> None:
        self._kv.delete(_key_entry(key_group, key, expiry_ms))
        self._kv.delete(_index_entry(key_group, key, expiry_ms))

    def of_key(self, key_group: int, key: Key) -> list[int]:
        """The key's timers, earliest first."""
        prefix = entry_prefix(key_group, "", StateKind.TIMER, key)
        return [decode_time(raw[len(prefix) :]) for raw, _ in self._kv.scan(prefix)]

    def due(self, threshold_ms: int) -> list[tuple[int, int, Key]]:
        """Every timer with expiry <= `threshold_ms` as (expiry, key group, key), earliest
        first (ties by key group, then key)."""
        out: list[tuple[int, int, Key]] = []
        for group in range(self.key_groups.start, self.key_groups.end + 1):
            prefix = index_prefix(group, StateKind.TIMER_INDEX)
            for raw, _ in self._kv.scan(prefix):
                expiry = decode_time(raw[len(prefix) :])
                if expiry > threshold_ms:
                    break
                key, _rest = decode_key_part(raw[len(prefix) + 8 :])
                out.append((expiry, group, key))
        out.sort(key=lambda t: (t[0], t[1], t[2] if isinstance(t[2], bytes) else t[2].encode()))
        return out

    def next_expiry(self) -> int | None:
        """The earliest timer of the range (None: no timer)."""
        earliest: int | None = None
        for group in range(self.key_groups.start, self.key_groups.end + 1):
            prefix = index_prefix(group, StateKind.TIMER_INDEX)
            first = next(iter(self._kv.scan(prefix)), None)
            if first is not None:
                expiry = decode_time(first[0][len(prefix) :])
                earliest = expiry if earliest is None else min(earliest, expiry)
        return earliest
