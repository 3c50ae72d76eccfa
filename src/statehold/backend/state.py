"""State primitives bound to one key: ValueState, ListState, MapState.

Values are stored as compact UTF-8 JSON (strict: no NaN/Infinity), never pickled, so
stored state is plain data that any tool can read and that can never run code when read.
So values must be JSON-serializable: None, bool, int, float, str, and lists / dicts (with
str keys) of those; tuples come back as lists. Map keys must be JSON scalars (str, int,
float, bool, None); each map entry is its own RocksDB entry, so large maps stay cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from statehold.backend.keys import Key, StateKind, entry_prefix, key_group_of

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_SCALARS = (str, int, float, bool, type(None))


class KV(Protocol):
    """The raw byte store the primitives sit on (the task's RocksDB)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


def dumps(value: Any) -> bytes:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"state values must be JSON-serializable: {e}") from e
    return text.encode("utf-8")


def loads(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


def map_key_bytes(map_key: Any) -> bytes:
    """Canonical JSON of a map key, so equal keys always hit the same entry."""
    if not isinstance(map_key, _SCALARS):
        raise TypeError(f"map keys must be str, int, float, bool or None, not {map_key!r}")
    return dumps(map_key)


def decode_value(kind: StateKind, suffix: bytes, data: bytes) -> Any:
    """Decode one stored entry (for readers that walk the raw store)."""
    if kind is StateKind.MAP:
        return loads(suffix), loads(data)
    return loads(data)


class _Bound:
    def __init__(self, kv: KV, prefix: bytes) -> None:
        self._kv = kv
        self._prefix = prefix


class ValueState(_Bound, Generic[T]):
    """One value per key."""

    def get(self, default: T | None = None) -> T | None:
        data = self._kv.get(self._prefix)
        return default if data is None else loads(data)

    def update(self, value: T) -> None:
        self._kv.put(self._prefix, dumps(value))

    def clear(self) -> None:
        self._kv.delete(self._prefix)


class ListState(_Bound, Generic[T]):
    """A list per key, stored as one JSON array (append is read-modify-write: keep it
    small, or use MapState for large collections)."""

    def get(self) -> list[T]:
        data = self._kv.get(self._prefix)
        return [] if data is None else loads(data)

    def append(self, value: T) -> None:
        self.extend([value])

    def extend(self, values: Iterable[T]) -> None:
        self.update(self.get() + list(values))

    def update(self, values: Iterable[T]) -> None:
        items = list(values)
        if items:
            self._kv.put(self._prefix, dumps(items))
        else:
            self.clear()

    def clear(self) -> None:
        self._kv.delete(self._prefix)


class MapState(_Bound, Generic[K, V]):
    """A map per key; every entry is its own store entry."""

    def get(self, map_key: K, default: V | None = None) -> V | None:
        data = self._kv.get(self._prefix + map_key_bytes(map_key))
        return default if data is None else loads(data)

    def put(self, map_key: K, value: V) -> None:
        self._kv.put(self._prefix + map_key_bytes(map_key), dumps(value))

    def put_all(self, entries: dict[K, V]) -> None:
        for k, v in entries.items():
            self.put(k, v)

    def contains(self, map_key: K) -> bool:
        return self._kv.get(self._prefix + map_key_bytes(map_key)) is not None

    __contains__ = contains

    def remove(self, map_key: K) -> None:
        self._kv.delete(self._prefix + map_key_bytes(map_key))

    def items(self) -> Iterator[tuple[K, V]]:
        n = len(self._prefix)
        for raw, data in self._kv.scan(self._prefix):
            yield loads(raw[n:]), loads(data)

    def keys(self) -> Iterator[K]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return next(iter(self._kv.scan(self._prefix)), None) is None

    def clear(self) -> None:
        for raw in [k for k, _ in self._kv.scan(self._prefix)]:
            self._kv.delete(raw)


class KeyedState:
    """All state of one key, for a per-key user function, e.g.
    ``st = backend.for_key("user-1"); st.value("n").update((st.value("n").get() or 0) + 1)``.
    """

    def __init__(self, kv: KV, key: Key, max_parallelism: int) -> None:
        self.key = key
        self.key_group = key_group_of(key, max_parallelism)
        self._kv = kv

    def _prefix(self, name: str, kind: StateKind) -> bytes:
        return entry_prefix(self.key_group, name, kind, self.key)

    def value(self, name: str) -> ValueState[Any]:
        return ValueState(self._kv, self._prefix(name, StateKind.VALUE))

    def list(self, name: str) -> ListState[Any]:
        return ListState(self._kv, self._prefix(name, StateKind.LIST))

    def map(self, name: str) -> MapState[Any, Any]:
        return MapState(self._kv, self._prefix(name, StateKind.MAP))
