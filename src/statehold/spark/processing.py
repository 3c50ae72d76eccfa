"""The driver's part of a stateful processor's batch: what its tasks are told (time
mode, processing time, the watermark of the newest checkpoint, the late-row policy) and
the event time recorded with its checkpoint (the new watermark, the earliest timer).

The watermark after batch N is ``max(watermark after N-1, newest event time of N -
delay)``; batch N+1 runs with it. So a timer at T fires in the first batch that starts
with a watermark >= T: the batch after the one whose rows moved the watermark past T
(with no more input, a batch without rows: `StatefulJob.timers_due`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError
from statehold.format.metadata import EventTime
from statehold.processor.api import TimeMode
from statehold.processor.compat import is_spark_style
from statehold.processor.runner import LateRows, ProcessorSpec
from statehold.spark.api import InputFormat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def processor_spec(
    newest_clock: Callable[[], EventTime | None],
    df: DataFrame,
    processor: Any,
    keys: tuple[str, ...],
    time_mode: str,
    event_time_column: str | None,
    late_rows: LateRows,
    processing_time_ms: int,
    input_format: InputFormat | None,
) -> tuple[ProcessorSpec, InputFormat]:
    """The tasks' processor spec for the next batch, and the rows' input format.
    `newest_clock`: the newest checkpoint's event time (its watermark is the batch's),
    asked only once the arguments are accepted."""
    if not callable(getattr(processor, "init", None)):
        raise InvalidArgumentError(
            f"{type(processor).__name__} is not a stateful processor (it has no init)"
        )
    mode = TimeMode.parse(time_mode)
    if mode is TimeMode.EVENT_TIME and event_time_column is None:
        raise InvalidArgumentError("time_mode EventTime needs an event_time_column")
    if late_rows not in ("drop", "process"):
        raise InvalidArgumentError(f"late_rows must be 'drop' or 'process', not {late_rows!r}")
    clock = newest_clock()
    fmt: InputFormat = input_format or ("pandas" if is_spark_style(processor) else "rows")
    string_key = len(keys) == 1 and dict(df.dtypes).get(keys[0]) == "string"
    spec = ProcessorSpec(
        processor=processor,
        time_mode=mode,
        processing_time_ms=processing_time_ms,
        watermark_ms=None if clock is None else clock.watermark_ms,
        event_time_column=event_time_column,
        late_rows=late_rows,
        string_key=string_key,
    )
    return spec, fmt


def event_time_after(spec: ProcessorSpec, delay_ms: int, figures: dict[str, Any]) -> EventTime:
    """What the checkpoint records: the watermark moved by the batch's newest event time
    (never back), and the earliest timer left."""
    watermark = spec.watermark_ms
    newest = figures.get("max_event_ms")
    if newest is not None:
        moved = int(newest) - delay_ms
        watermark = moved if watermark is None else max(watermark, moved)
    return EventTime(
        time_mode=spec.time_mode.value,
        watermark_ms=watermark,
        next_timer_ms=figures.get("next_timer_ms"),
    )
