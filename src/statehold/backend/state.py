"""State primitives bound to one key: ValueState, ListState, MapState.

A value becomes bytes through its variable's codec (`statehold.state.schema.codec_for`;
without a schema `statehold.state.json_codec.JSON`, never pickled), so stored state is
plain data that any tool can read and that can never run code when read. Every map entry
and every list element is its own RocksDB entry, so large maps stay cheap and appending
never rewrites a list.

With a TTL a stored value starts with its 8-byte expiry (the batch's processing time plus
the TTL, renewed by every write); an expired value is never returned, and the TTL index
(`statehold.backend.ttl`) lets the checkpoint's sweep delete it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar

from statehold.backend.keys import (
    DecodedKey,
    Key,
    StateKind,
    decode_time,
    encode_time,
    entry_prefix,
    index_prefix,
    key_group_of,
)
from statehold.errors import InvalidArgumentError
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyHash
from statehold.state.json_codec import JSON, JSON_MAP_KEY, EntryDecoders, StateCodec

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: The column / state name under which a key's timers appear to readers.
TIMERS_NAME = "__statehold_timers"
#: What a TTL may be given as: milliseconds, or a timedelta.
TTL = int | timedelta


class KV(Protocol):
    """The raw byte store the primitives sit on (the task's RocksDB)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
    def last(self, prefix: bytes) -> bytes | None: ...


def ttl_ms(ttl: TTL | None) -> int | None:
    """A TTL in milliseconds (None: no TTL); refuses a non-positive one."""
    if ttl is None:
        return None
    ms = int(ttl.total_seconds() * 1000) if isinstance(ttl, timedelta) else int(ttl)
    if ms <= 0:
        raise InvalidArgumentError(f"a TTL must be positive, not {ttl!r}")
    return ms


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def ttl_index_key(entry: bytes, expiry_ms: int) -> bytes:
    """The TTL index entry saying `entry` (a full RocksDB key) may expire at `expiry_ms`."""
    return index_prefix(int.from_bytes(entry[:2], "big"), StateKind.TTL_INDEX) + (
        encode_time(expiry_ms) + entry
    )


class _Bound:
    """One (state, key) pair: its prefix, codec, and TTL (with the batch's clock)."""

    def __init__(
        self,
        kv: KV,
        prefix: bytes,
        codec: StateCodec = JSON,
        ttl: int | None = None,
        now: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._kv = kv
        self._prefix = prefix
        self._codec = codec
        self._ttl = ttl
        self._now = now

    def _encode(self, entry: bytes, value: Any) -> bytes:
        data = self._codec.encode(value)
        if self._ttl is None:
            return data
        expiry = self._now() + self._ttl
        self._kv.put(ttl_index_key(entry, expiry), b"")
        return encode_time(expiry) + data

    def _decode(self, data: bytes | None) -> tuple[bool, Any]:
        """(live, value): an expired entry is not live."""
        if data is None:
            return False, None
        if self._ttl is not None:
            if decode_time(data) <= self._now():
                return False, None
            data = data[8:]
        return True, self._codec.decode(data)


class ValueState(_Bound, Generic[T]):
    """One value per key."""

    def get(self, default: T | None = None) -> T | None:
        live, value = self._decode(self._kv.get(self._prefix))
        return value if live else default

    def exists(self) -> bool:
        return self._decode(self._kv.get(self._prefix))[0]

    def update(self, value: T) -> None:
        self._kv.put(self._prefix, self._encode(self._prefix, value))

    def clear(self) -> None:
        self._kv.delete(self._prefix)


class ListState(_Bound, Generic[T]):
    """A list per key: one entry per element (suffix: 8-byte sequence number), so append
    writes only the new elements."""

    def _elements(self) -> Iterator[tuple[bytes, bytes]]:
        return self._kv.scan(self._prefix)

    def __iter__(self) -> Iterator[T]:
        n = len(self._prefix)
        for raw, data in self._elements():
            if len(raw) == n:  # an older format: the whole list as one JSON array
                yield from JSON.decode(data)
                continue
            live, value = self._decode(data)
            if live:
                yield value

    def get(self) -> list[T]:
        return list(self)

    def exists(self) -> bool:
        return any(True for _ in self)

    def append(self, value: T) -> None:
        self.extend([value])

    def extend(self, values: Iterable[T]) -> None:
        last = self._kv.last(self._prefix)
        n = len(self._prefix)
        seq = 0 if last is None or len(last) == n else int.from_bytes(last[n:], "big") + 1
        for value in values:
            entry = self._prefix + seq.to_bytes(8, "big")
            self._kv.put(entry, self._encode(entry, value))
            seq += 1

    def update(self, values: Iterable[T]) -> None:
        items = list(values)
        self.clear()
        self.extend(items)

    def clear(self) -> None:
        for raw in [k for k, _ in self._elements()]:
            self._kv.delete(raw)

    # Spark's names
    put = update
    append_value = append
    append_list = extend


class MapState(_Bound, Generic[K, V]):
    """A map per key; every entry is its own store entry (suffix: the encoded map key)."""

    def __init__(
        self,
        kv: KV,
        prefix: bytes,
        codec: StateCodec = JSON,
        ttl: int | None = None,
        now: Callable[[], int] = wall_clock_ms,
        key_codec: StateCodec = JSON_MAP_KEY,
    ) -> None:
        super().__init__(kv, prefix, codec, ttl, now)
        self._key_codec = key_codec

    def _entry(self, map_key: K) -> bytes:
        return self._prefix + self._key_codec.encode(map_key)

    def get(self, map_key: K, default: V | None = None) -> V | None:
        live, value = self._decode(self._kv.get(self._entry(map_key)))
        return value if live else default

    def put(self, map_key: K, value: V) -> None:
        entry = self._entry(map_key)
        self._kv.put(entry, self._encode(entry, value))

    def put_all(self, entries: dict[K, V]) -> None:
        for k, v in entries.items():
            self.put(k, v)

    def contains(self, map_key: K) -> bool:
        return self._decode(self._kv.get(self._entry(map_key)))[0]

    __contains__ = contains

    def remove(self, map_key: K) -> None:
        self._kv.delete(self._entry(map_key))

    def items(self) -> Iterator[tuple[K, V]]:
        n = len(self._prefix)
        for raw, data in self._kv.scan(self._prefix):
            live, value = self._decode(data)
            if live:
                yield self._key_codec.decode(raw[n:]), value

    def keys(self) -> Iterator[K]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return next(self.items(), None) is None

    def exists(self) -> bool:
        return not self.is_empty()

    def clear(self) -> None:
        for raw in [k for k, _ in self._kv.scan(self._prefix)]:
            self._kv.delete(raw)

    # Spark's names
    get_value = get
    update_value = put
    contains_key = contains
    remove_key = remove
    iterator = items


def codec_for(schema: Any) -> StateCodec:
    """A variable's codec (`statehold.state.schema.codec_for`); pyspark only with a schema."""
    if schema is None:
        return JSON
    from statehold.state.schema import codec_for as typed

    return typed(schema)


class KeyedState:
    """All state of one key, for a per-key user function, e.g.
    ``st = backend.for_key("user-1"); st.value("n").update((st.value("n").get() or 0) + 1)``.

    `schema` picks a variable's codec (`statehold.state.schema.codec_for`; None: JSON);
    `ttl` (milliseconds or a timedelta) expires its values `ttl` after their last write,
    measured on `now_ms` (the batch's processing time; default: the wall clock).
    """

    def __init__(
        self,
        kv: KV,
        key: Key,
        max_parallelism: int,
        now_ms: int | None = None,
        key_hash: KeyHash = NEW_JOB_KEY_HASH,
        key_group: int | None = None,
    ) -> None:
        self.key = key
        #: `key_group`: already computed by the caller (e.g. the key's rows were routed by it)
        self.key_group = (
            key_group_of(key, max_parallelism, key_hash) if key_group is None else key_group
        )
        self._kv = kv
        self._now: Callable[[], int] = wall_clock_ms if now_ms is None else (lambda: now_ms)

    def _prefix(self, name: str, kind: StateKind, ttl: int | None) -> bytes:
        return entry_prefix(self.key_group, name, kind.with_ttl(ttl is not None), self.key)

    def value(self, name: str, schema: Any = None, ttl: TTL | None = None) -> ValueState[Any]:
        ms = ttl_ms(ttl)
        return ValueState(
            self._kv, self._prefix(name, StateKind.VALUE, ms), codec_for(schema), ms, self._now
        )

    def list(self, name: str, schema: Any = None, ttl: TTL | None = None) -> ListState[Any]:
        ms = ttl_ms(ttl)
        return ListState(
            self._kv, self._prefix(name, StateKind.LIST, ms), codec_for(schema), ms, self._now
        )

    def map(
        self,
        name: str,
        key_schema: Any = None,
        value_schema: Any = None,
        ttl: TTL | None = None,
    ) -> MapState[Any, Any]:
        ms = ttl_ms(ttl)
        key_codec = JSON_MAP_KEY if key_schema is None else codec_for(key_schema)
        return MapState(
            self._kv,
            self._prefix(name, StateKind.MAP, ms),
            codec_for(value_schema),
            ms,
            self._now,
            key_codec,
        )


def decode_value(
    kind: StateKind, suffix: bytes, data: bytes, decoders: EntryDecoders = (None, None)
) -> Any:
    """Decode one stored entry (for readers that walk the raw store): a map entry as
    (map key, value), anything else as its value (a TTL's expiry left out). Typed
    variables need their `decoders`; without them values are read as JSON."""
    if kind.has_ttl:
        data = data[8:]
    values, map_keys = decoders
    value = JSON.decode(data) if values is None else values.decode(data)
    if kind.base is StateKind.MAP:
        return (JSON_MAP_KEY if map_keys is None else map_keys).decode(suffix), value
    return value


def fold_entry(
    states: dict[str, Any],
    d: DecodedKey,
    data: bytes,
    decoders: Mapping[str, EntryDecoders] | None = None,
) -> None:
    """Add one stored entry of a key to `states` (state name -> value): list state as a
    list, map state as a dict, the key's timers (expiry ms) under `TIMERS_NAME`. Index
    entries belong to no key: the caller skips them. `decoders`: the typed variables'."""
    kind = d.kind
    if kind is StateKind.TIMER:
        states.setdefault(TIMERS_NAME, []).append(decode_time(d.suffix))
        return
    base = kind.base
    codecs = (None, None) if decoders is None else decoders.get(d.state_name, (None, None))
    if base is StateKind.MAP:
        k, v = decode_value(kind, d.suffix, data, codecs)
        states.setdefault(d.state_name, {})[k] = v
    elif base is StateKind.LIST:
        items = states.setdefault(d.state_name, [])
        value = decode_value(kind, d.suffix, data, codecs)
        if d.suffix:
            items.append(value)
        else:
            items.extend(value)
    else:
        states[d.state_name] = decode_value(kind, d.suffix, data, codecs)
