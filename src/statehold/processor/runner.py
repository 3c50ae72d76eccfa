"""One task's batch of a stateful processor: late rows, input rows per key, due timers,
the TTL sweep, close. Runs inside the Spark task (`statehold.spark.task.StateStage`),
on the task's open backend, before its snapshot.

Order (as in Spark): ``init``; per key (key-group, key order) ``handle_initial_state``
(first batch of a job with an initial state, keys in it) then ``handle_input_rows`` (keys
with rows); ``handle_expired_timer`` per timer due at the batch's clock (earliest first; a
timer is deleted just before its call; one registered during this phase that is already
due fires in the next batch); the TTL sweep; ``close``.

The task drives `ProcessorRun` one key at a time as its sorted input streams in, so a
key's rows reach the processor as an iterator of chunks (compat.py) and nothing here holds
more than the key being called.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from statehold.backend.keys import Key
from statehold.errors import InvalidArgumentError
from statehold.processor.api import ExpiredTimerInfo, TimeMode, TimerValues
from statehold.processor.compat import ProcessorCalls
from statehold.processor.handle import StatefulProcessorHandle

if TYPE_CHECKING:
    from statehold.backend.rocks import TaskStateBackend

LateRows = Literal["drop", "process"]


@dataclass(frozen=True)
class ProcessorSpec:
    """What a task needs to run a processor for one batch (plain picklable data)."""

    processor: Any
    time_mode: TimeMode
    #: the batch's processing time (TTL, processing-time timers)
    processing_time_ms: int
    #: the watermark the batch runs with (None: no event time seen yet)
    watermark_ms: int | None
    event_time_column: str | None
    late_rows: LateRows
    #: one key column of type string: the state key is the value itself
    string_key: bool
    #: the input carries initial-state rows (`statehold.spark.initial_state`)
    initial_state: bool = False

    def timer_values(self) -> TimerValues:
        if self.time_mode is TimeMode.NONE:
            return TimerValues(-1, -1)
        if self.time_mode is TimeMode.PROCESSING_TIME:
            return TimerValues(self.processing_time_ms, -1)
        return TimerValues(self.processing_time_ms, self.watermark_ms or 0)

    def threshold(self) -> int | None:
        """Timers with expiry at or before this fire (None: none fire)."""
        if self.time_mode is TimeMode.PROCESSING_TIME:
            return self.processing_time_ms
        if self.time_mode is TimeMode.EVENT_TIME:
            return self.watermark_ms
        return None


def event_time_ms(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """An event-time column as int64 epoch milliseconds: a timestamp (any unit), or an
    integer taken as milliseconds."""
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("ms", t.tz)), pa.int64())
    if pa.types.is_integer(t):
        return pc.cast(column, pa.int64())
    raise InvalidArgumentError(
        f"event-time column {name!r} must be a timestamp or integer milliseconds, not {t}"
    )


@dataclass
class Filtered:
    table: pa.Table | None
    max_event_ms: int | None = None
    late_rows: int = 0


def filter_late(
    table: pa.Table | None, spec: ProcessorSpec, exempt: pa.ChunkedArray | None = None
) -> Filtered:
    """The batch's newest event time, and its late rows (event time at or before the
    watermark) counted and, with ``late_rows="drop"``, removed; rows where `exempt` is
    true (initial-state rows) are neither late nor counted in the newest event time."""
    if table is None or not table.num_rows or spec.event_time_column is None:
        return Filtered(table)
    ms = event_time_ms(table.column(spec.event_time_column), spec.event_time_column)
    if exempt is not None:
        ms = pc.if_else(exempt, pa.scalar(None, pa.int64()), ms)
    newest = pc.max(ms).as_py()
    if spec.watermark_ms is None:
        return Filtered(table, newest)
    late = pc.fill_null(pc.less_equal(ms, spec.watermark_ms), False)
    n_late = int(pc.sum(late).as_py() or 0)
    if n_late and spec.late_rows == "drop":
        table = table.filter(pc.invert(late))
    return Filtered(table, newest, n_late)


def user_key(state_key: Key, spec: ProcessorSpec, n_columns: int) -> Any:
    """The key value(s) a state key was made of (`statehold.spark.task.state_key`)."""
    if isinstance(state_key, bytes) or spec.string_key:
        return state_key
    values = json.loads(state_key)
    return tuple(values) if n_columns > 1 else values


class ProcessorRun:
    """One task's batch of a processor, step by step so the task can stream: `start`,
    then `rows` per key (in key-group and key order), then `finish` (the due timers);
    each step returns the processor's output as it comes (for `Output.stream`)."""

    def __init__(
        self, spec: ProcessorSpec, backend: TaskStateBackend, n_key_columns: int,
        input_format: str,
    ) -> None:
        self.spec = spec
        self.n_key_columns = n_key_columns
        self.handle = StatefulProcessorHandle(
            backend._require_kv(),
            backend.key_groups,
            backend.max_parallelism,
            spec.time_mode,
            spec.processing_time_ms,
            spec.watermark_ms or 0,
            backend.key_hash,
        )
        self.calls = ProcessorCalls(spec.processor, input_format)
        self.values = spec.timer_values()
        self.fired = 0

    def start(self) -> None:
        self.calls.init(self.handle)

    def key(
        self, skey: Key, key: Any, initial_rows: Any | None, chunks: Any | None,
        key_group: int | None = None,
    ) -> Any:
        """One key: its initial-state rows (or None), then its input rows (`chunks`: an
        iterator of row chunks in the input format, or None: no input rows). `key_group`:
        the one its rows were routed by, if known (else hashed here)."""
        self.handle._bind(skey, key_group)
        if initial_rows is not None:
            self.calls.initial(key, initial_rows, self.values)
        if chunks is None:
            return None
        return self.calls.rows(key, chunks, self.values)

    def timers(self) -> Iterator[Any]:
        """The output of each due timer's call, earliest first."""
        threshold = self.spec.threshold()
        if threshold is None:
            return
        handle = self.handle
        for expiry, group, skey in handle.timers.due(threshold):
            handle.timers.delete(group, skey, expiry)
            handle._bind(skey, group)
            key = user_key(skey, self.spec, self.n_key_columns)
            yield self.calls.timer(key, self.values, ExpiredTimerInfo(expiry))
            self.fired += 1

    def finish(self) -> dict[str, Any]:
        """Close the processor; the figures for the task's report."""
        self.calls.close()
        return {
            "timers_fired": self.fired,
            "next_timer_ms": self.handle.timers.next_expiry(),
            # name -> [kind, recorded schema or None], for the driver to record
            "declared": {name: list(v) for name, v in self.handle.declared.items()},
        }
