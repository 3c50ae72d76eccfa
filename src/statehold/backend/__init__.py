"""Executor-side keyed state: one task = one operator + one key-group range, held in an
embedded RocksDB (rocksdict, raw mode, JSON values) and snapshotted incrementally into the
job directory."""

from statehold.backend.keys import (
    MAX_MAX_PARALLELISM,
    all_ranges,
    key_group_of,
    task_of,
    task_of_key,
    task_range,
)
from statehold.backend.rocks import (
    RestoreSource,
    RestoreStats,
    SnapshotStats,
    StateBackendError,
    TaskStateBackend,
    sources_from_metadata,
)
from statehold.backend.state import KeyedState, ListState, MapState, ValueState

__all__ = [
    "MAX_MAX_PARALLELISM",
    "KeyedState",
    "ListState",
    "MapState",
    "RestoreSource",
    "RestoreStats",
    "SnapshotStats",
    "StateBackendError",
    "TaskStateBackend",
    "ValueState",
    "all_ranges",
    "key_group_of",
    "sources_from_metadata",
    "task_of",
    "task_of_key",
    "task_range",
]
