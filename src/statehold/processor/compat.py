"""How a processor's methods are called: statehold's snake_case ones as they are, or the
camelCase ones of a class written for Spark 4.x (``pyspark.sql.streaming``'s
`StatefulProcessor`, or ours after an import change) with Spark's argument shapes:

* the key as a tuple of the key columns' values;
* rows as an iterator: of pandas.DataFrames, one per chunk of the key's rows
  (``input_format="pandas"``, Spark's ``transformWithStateInPandas``, the default for such
  a class), or of `pyspark.sql.Row` (``input_format="rows"``, Spark's
  ``transformWithState``), read chunk by chunk as the processor iterates;
* ``handleExpiredTimer`` optional (no output when missing);
* ``handleInitialState`` optional, called as Spark calls it: once per key with one
  pandas.DataFrame of the key's initial-state rows, or once per `Row`.

The handle, `TimerValues` and `ExpiredTimerInfo` answer to Spark's method names, and the
output (an iterator of DataFrames or Rows) is taken as it comes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from statehold.processor.api import ExpiredTimerInfo, StatefulProcessor, TimerValues
from statehold.processor.chunks import Chunk


def is_spark_style(processor: Any) -> bool:
    """True if `processor` implements Spark's ``handleInputRows`` and not ours."""
    native = getattr(type(processor), "handle_input_rows", None)
    overridden = native is not None and native is not StatefulProcessor.handle_input_rows
    return not overridden and callable(getattr(processor, "handleInputRows", None))


def whole(chunks: Iterable[Chunk], input_format: str) -> Any:
    """All chunks of one key as one value of the input format (held whole)."""
    parts = list(chunks)
    if len(parts) == 1:
        return parts[0].as_format(input_format)
    return Chunk.of(pa.concat_tables([c.table for c in parts])).as_format(input_format)


def _chunk_iter(chunks: Iterable[Chunk], input_format: str) -> Iterator[Any]:
    if input_format == "rows":
        from pyspark.sql import Row

        return (Row(**r) for c in chunks for r in c.as_format(input_format))
    return (c.as_format(input_format) for c in chunks)


def _rows_iter(rows: Any, input_format: str) -> Iterator[Any]:
    if input_format == "rows":
        from pyspark.sql import Row

        return (Row(**r) for r in rows)
    return iter([rows])


class ProcessorCalls:
    """One interface over both styles, for the task that runs the processor."""

    def __init__(self, processor: Any, input_format: str) -> None:
        self.processor = processor
        self.input_format = input_format
        self.spark_style = is_spark_style(processor)

    def init(self, handle: Any) -> None:
        self.processor.init(handle)

    def rows(self, key: Any, chunks: Iterable[Chunk], timer_values: TimerValues) -> Any:
        """The key's input rows, given as chunks (slices of the input batches' user
        columns): an iterator for Spark-style processors and for ours with
        ``input_chunks = True``, else the whole key as one value of the input format."""
        if not self.spark_style:
            if getattr(self.processor, "input_chunks", False):
                rows: Any = (c.as_format(self.input_format) for c in chunks)
            else:
                rows = whole(chunks, self.input_format)
            return self.processor.handle_input_rows(key, rows, timer_values)
        return self.processor.handleInputRows(
            key if isinstance(key, tuple) else (key,),
            _chunk_iter(chunks, self.input_format),
            timer_values,
        )

    def timer(self, key: Any, timer_values: TimerValues, info: ExpiredTimerInfo) -> Any:
        if not self.spark_style:
            return self.processor.handle_expired_timer(key, timer_values, info)
        fire = getattr(self.processor, "handleExpiredTimer", None)
        if fire is None:
            return None
        return fire(key if isinstance(key, tuple) else (key,), timer_values, info)

    def initial(self, key: Any, rows: Any, timer_values: TimerValues) -> None:
        """The key's initial-state rows (their return value is ignored, as in Spark)."""
        if not self.spark_style:
            native = getattr(self.processor, "handle_initial_state", None)
            if native is not None:
                native(key, rows, timer_values)
            return
        handle = getattr(self.processor, "handleInitialState", None)
        if handle is None:
            return
        spark_key = key if isinstance(key, tuple) else (key,)
        for state in _rows_iter(rows, self.input_format):
            handle(spark_key, state, timer_values)

    def close(self) -> None:
        close = getattr(self.processor, "close", None)
        if close is not None:
            close()
