"""`StatefulProcessorHandle`: the state variables and timers a processor declares in
``init``, each acting on the key of the current call (as in Spark).

A variable's values go through the codec of its `schema`
(`statehold.state.schema.codec_for`; None: JSON); a TTL (milliseconds, `timedelta` or
`TTLConfig`) expires a value that long after its last write, on the batch's processing
time. Names follow Spark's ``StatefulProcessorHandle`` in snake_case and in camelCase.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from statehold.backend.keys import (
    Key,
    StateKind,
    check_state_name,
    entry_prefix,
    group_prefix,
    key_group_of,
)
from statehold.backend.state import KV, ListState, MapState, ValueState, codec_for
from statehold.backend.timers import Timers
from statehold.errors import InvalidArgumentError
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyGroupRange, KeyHash
from statehold.processor.timing import TimeMode, TTLConfig
from statehold.state.json_codec import JSON_MAP_KEY, StateCodec

TTLLike = TTLConfig | int | Any | None


class _Variable:
    """A declared state variable; `_state()` is its primitive for the current key."""

    kind = StateKind.VALUE

    def __init__(
        self, handle: StatefulProcessorHandle, name: str, codec: StateCodec, ttl: int | None,
        key_codec: StateCodec | None = None,
    ) -> None:
        self._handle = handle
        self.name = check_state_name(name)
        self._codec = codec
        self._ttl = ttl
        self._key_codec = key_codec
        self._version = -1
        self._bound: Any = None

    def _state(self) -> Any:
        h = self._handle
        if self._version != h._version:
            kg, key = h._current()
            prefix = entry_prefix(kg, self.name, self.kind.with_ttl(self._ttl is not None), key)
            args = (h._kv, prefix, self._codec, self._ttl, h._now)
            if self._key_codec is not None:
                self._bound = MapState(*args, key_codec=self._key_codec)
            else:
                self._bound = (ListState if self.kind is StateKind.LIST else ValueState)(*args)
            self._version = h._version
        return self._bound

    def exists(self) -> bool:
        return bool(self._state().exists())

    def clear(self) -> None:
        self._state().clear()


class ValueStateVariable(_Variable):
    """One value per key: `get` (None if absent or expired), `exists`, `update`, `clear`."""

    def get(self) -> Any:
        return self._state().get()

    def update(self, value: Any) -> None:
        self._state().update(value)


class ListStateVariable(_Variable):
    """A list per key, one entry per element: `get` (an iterator), `put` (replace),
    `append_value`, `append_list`, `exists`, `clear`."""

    kind = StateKind.LIST

    def get(self) -> Iterator[Any]:
        return iter(self._state())

    def put(self, values: list[Any]) -> None:
        self._state().update(values)

    def append_value(self, value: Any) -> None:
        self._state().append(value)

    def append_list(self, values: list[Any]) -> None:
        self._state().extend(values)

    appendValue = append_value
    appendList = append_list


class MapStateVariable(_Variable):
    """A map per key, one entry per map key."""

    kind = StateKind.MAP

    def get_value(self, key: Any) -> Any:
        return self._state().get(key)

    def contains_key(self, key: Any) -> bool:
        return bool(self._state().contains(key))

    def update_value(self, key: Any, value: Any) -> None:
        self._state().put(key, value)

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._state().items())

    def keys(self) -> Iterator[Any]:
        return iter(self._state().keys())

    def values(self) -> Iterator[Any]:
        return iter(self._state().values())

    def remove_key(self, key: Any) -> None:
        self._state().remove(key)

    getValue = get_value
    containsKey = contains_key
    updateValue = update_value
    removeKey = remove_key


class StatefulProcessorHandle:
    """What `StatefulProcessor.init` gets: declares state variables, and registers,
    deletes and lists the current key's timers."""

    def __init__(
        self,
        kv: KV,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        time_mode: TimeMode,
        processing_time_ms: int,
        watermark_ms: int,
        key_hash: KeyHash = NEW_JOB_KEY_HASH,
    ) -> None:
        self._kv = kv
        self._key_groups = key_groups
        self._max_parallelism = max_parallelism
        self._key_hash = key_hash
        self.time_mode = time_mode
        self.processing_time_ms = processing_time_ms
        self.watermark_ms = watermark_ms
        self.timers = Timers(kv, key_groups)
        self._key: Key | None = None
        self._key_group = -1
        self._version = 0
        #: name -> (kind, recorded schema JSON or None) of every variable declared
        self.declared: dict[str, tuple[str, str | None]] = {}

    def _declare(self, variable: _Variable, *codecs: StateCodec) -> None:
        schemas = [c.schema_json() for c in codecs]
        record = json.dumps(schemas) if any(s is not None for s in schemas) else None
        self.declared[variable.name] = (variable.kind.name.lower(), record)

    # -- the current key (set by the runner) ----------------------------------------------
    def _now(self) -> int:
        return self.processing_time_ms

    def _bind(self, key: Key, key_group: int | None = None) -> None:
        self._key = key
        self._key_group = (
            key_group_of(key, self._max_parallelism, self._key_hash)
            if key_group is None
            else key_group
        )
        self._version += 1

    def _current(self) -> tuple[int, Key]:
        if self._key is None:
            raise InvalidArgumentError(
                "state and timers act on the current key: use them in handle_input_rows or "
                "handle_expired_timer, not in init"
            )
        return self._key_group, self._key

    # -- state variables ------------------------------------------------------------------
    def get_value_state(
        self, name: str, schema: Any = None, ttl: TTLLike = None
    ) -> ValueStateVariable:
        codec = codec_for(schema)
        var = ValueStateVariable(self, name, codec, TTLConfig.of(ttl))
        self._declare(var, codec)
        return var

    def get_list_state(
        self, name: str, schema: Any = None, ttl: TTLLike = None
    ) -> ListStateVariable:
        codec = codec_for(schema)
        var = ListStateVariable(self, name, codec, TTLConfig.of(ttl))
        self._declare(var, codec)
        return var

    def get_map_state(
        self,
        name: str,
        user_key_schema: Any = None,
        value_schema: Any = None,
        ttl: TTLLike = None,
    ) -> MapStateVariable:
        key_codec = JSON_MAP_KEY if user_key_schema is None else codec_for(user_key_schema)
        codec = codec_for(value_schema)
        var = MapStateVariable(self, name, codec, TTLConfig.of(ttl), key_codec)
        self._declare(var, key_codec, codec)
        return var

    def delete_if_exists(self, name: str) -> None:
        """Delete the variable `name` for every key of this task's key groups."""
        raw = check_state_name(name).encode("utf-8")
        delete_range = getattr(self._kv, "delete_range", None)
        for group in range(self._key_groups.start, self._key_groups.end + 1):
            lower = group_prefix(group) + raw + b"\x00"
            upper = group_prefix(group) + raw + b"\x01"
            if delete_range is not None:
                delete_range(lower, upper)
            else:
                for k in [k for k, _ in self._kv.scan(lower)]:
                    self._kv.delete(k)

    # -- timers ---------------------------------------------------------------------------
    def _check_timers(self) -> None:
        if self.time_mode is TimeMode.NONE:
            raise InvalidArgumentError(
                "timers need time_mode ProcessingTime or EventTime (this job runs with None)"
            )

    def register_timer(self, expiry_ms: int) -> None:
        """Fire a timer for the current key once the batch's clock (processing time or
        watermark) reaches `expiry_ms` (at or after it)."""
        self._check_timers()
        kg, key = self._current()
        self.timers.register(kg, key, int(expiry_ms))

    def delete_timer(self, expiry_ms: int) -> None:
        self._check_timers()
        kg, key = self._current()
        self.timers.delete(kg, key, int(expiry_ms))

    def list_timers(self) -> Iterator[int]:
        """The current key's timers, earliest first."""
        self._check_timers()
        kg, key = self._current()
        return iter(self.timers.of_key(kg, key))

    # -- Spark's names --------------------------------------------------------------------
    def getValueState(  # noqa: N802
        self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None  # noqa: N803
    ) -> ValueStateVariable:
        return self.get_value_state(stateName, schema, ttlDurationMs)

    def getListState(  # noqa: N802
        self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None  # noqa: N803
    ) -> ListStateVariable:
        return self.get_list_state(stateName, schema, ttlDurationMs)

    def getMapState(  # noqa: N802
        self,
        stateName: str,  # noqa: N803
        userKeySchema: Any = None,  # noqa: N803
        valueSchema: Any = None,  # noqa: N803
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> MapStateVariable:
        return self.get_map_state(stateName, userKeySchema, valueSchema, ttlDurationMs)

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        self.register_timer(expiryTimestampMs)

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        self.delete_timer(expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        return self.list_timers()

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802,N803
        self.delete_if_exists(stateName)
