"""What the user's functions return, gathered into Arrow tables of exactly the output
schema: over all keys of a task (`Output.add`, `Output.tables`), or emitted a bounded
number of rows at a time as the task goes (`Output.stream`), so a task's output buffer
does not grow with its batch.

Small outputs are converted to Arrow together, not one by one: pyarrow's conversion of a
pandas.DataFrame costs about 0.45 ms however few rows it has, and a processor typically
yields a frame of one or two rows per key (the sessions benchmark spent a quarter of a
task there). Consecutive frames with the same columns and dtypes are copied as they come,
then concatenated and converted once, so each column is converted from the dtype it had,
as it would be alone: about 0.08 ms a frame."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa


def _is_frame(out: Any) -> bool:
    return isinstance(out, pa.RecordBatch | pa.Table) or (
        hasattr(out, "to_dict") and hasattr(out, "columns")  # pandas.DataFrame
    )


def _to_table(out: Any, schema: pa.Schema) -> pa.Table:
    """A table or record batch as a table of exactly the output schema."""
    if isinstance(out, pa.RecordBatch):
        out = pa.Table.from_batches([out])
    return out.select(schema.names).cast(schema)


def _frames_to_table(frames: list[Any], schema: pa.Schema) -> pa.Table:
    """pandas.DataFrames of the same columns and dtypes as one table of the schema."""
    import pandas as pd

    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return pa.Table.from_pandas(frame[list(schema.names)], schema=schema,
                                preserve_index=False)


def _signature(frame: Any) -> tuple[Any, ...]:
    return tuple(frame.columns), tuple(frame.dtypes)


def _rows_to_table(rows: list[Any], schema: pa.Schema) -> pa.Table:
    """Rows that are all dicts or all tuples (in output-schema order) as one table."""
    if isinstance(rows[0], Mapping):
        return pa.Table.from_pylist(rows, schema=schema)
    columns = list(zip(*rows, strict=True))
    return pa.Table.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


class Output:
    """What the user function returns, gathered over all keys of a task: rows (dicts or
    tuples) are buffered and converted to Arrow once per run of the same kind, not once
    per key, which costs more than a small key's whole processing."""

    def __init__(self, schema: pa.Schema, limit: int | None = None) -> None:
        self._schema = schema
        #: `stream` emits once this many rows are buffered (None: never, `add` keeps all)
        self._limit = limit
        self._tables: list[pa.Table] = []
        self._table_rows = 0
        self._rows: list[Any] = []
        self._dicts = False
        #: pandas.DataFrames of one signature (`_signature`), converted together
        self._frames: list[Any] = []
        self._frame_rows = 0
        self._frame_signature: tuple[Any, ...] = ()

    def add(self, out: Any) -> None:
        """Buffer `out` (everything is kept until `tables`)."""
        for _ in self._add(out, None):
            pass

    def stream(self, out: Any) -> Iterator[pa.Table]:
        """Buffer `out`, yielding what is buffered whenever it reaches the limit: rows are
        pulled from a returned iterator one at a time, so a function's output for one hot
        key is emitted as it is produced, not held whole."""
        yield from self._add(out, self._limit)

    def _add(self, out: Any, limit: int | None) -> Iterator[pa.Table]:
        if out is None:
            return
        if _is_frame(out):
            if not len(out):  # also a column-less pandas.DataFrame()
                return
            if isinstance(out, pa.RecordBatch | pa.Table):
                self._flush()
                table = _to_table(out, self._schema)
                self._tables.append(table)
                self._table_rows += table.num_rows
            else:
                signature = _signature(out)
                if self._rows or (self._frames and signature != self._frame_signature):
                    self._flush()
                self._frame_signature = signature
                # a copy: a function may change a frame it yielded once it resumes, and
                # what it yielded is what is output (Spark converts it before resuming)
                self._frames.append(out.copy())
                self._frame_rows += len(out)
            if limit is not None and self._frame_rows + self._table_rows >= limit:
                yield from self.drain()
            return
        for row in out:
            if _is_frame(row):  # an iterator of frames (Spark's processors)
                yield from self._add(row, limit)
                continue
            if hasattr(row, "asDict"):  # a pyspark.sql.Row
                row = row.asDict()
            is_dict = isinstance(row, Mapping)
            if self._frames or (self._rows and is_dict != self._dicts):
                self._flush()
            self._dicts = is_dict
            self._rows.append(row)
            if limit is not None and len(self._rows) + self._table_rows >= limit:
                yield from self.drain()

    def drain(self) -> Iterator[pa.Table]:
        """Everything buffered, in order; the buffer is empty afterwards."""
        self._flush()
        tables, self._tables, self._table_rows = self._tables, [], 0
        yield from tables

    def _flush(self) -> None:
        """Convert what is buffered (rows of one kind, or frames of one signature)."""
        if self._rows:
            table = _rows_to_table(self._rows, self._schema)
            self._rows = []
        elif self._frames:
            table = _frames_to_table(self._frames, self._schema)
            self._frames, self._frame_rows = [], 0
        else:
            return
        self._tables.append(table)
        self._table_rows += table.num_rows

    def tables(self) -> list[pa.Table]:
        self._flush()
        return self._tables
