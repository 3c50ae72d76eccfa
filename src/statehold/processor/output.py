"""What the user's functions return, gathered into Arrow tables of exactly the output
schema: over all keys of a task (`Output.add`, `Output.tables`), or emitted a bounded
number of rows at a time as the task goes (`Output.stream`), so a task's output buffer
does not grow with its batch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa


def _is_frame(out: Any) -> bool:
    return isinstance(out, pa.RecordBatch | pa.Table) or (
        hasattr(out, "to_dict") and hasattr(out, "columns")  # pandas.DataFrame
    )


def _to_table(out: Any, schema: pa.Schema) -> pa.Table:
    """A table, record batch or pandas.DataFrame as a table of exactly the output schema."""
    if isinstance(out, pa.RecordBatch):
        out = pa.Table.from_batches([out])
    if isinstance(out, pa.Table):
        return out.select(schema.names).cast(schema)
    return pa.Table.from_pandas(out[list(schema.names)], schema=schema, preserve_index=False)


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
            self._flush()
            table = _to_table(out, self._schema)
            if table.num_rows:
                self._tables.append(table)
                self._table_rows += table.num_rows
            if limit is not None and self._table_rows >= limit:
                yield from self.drain()
            return
        for row in out:
            if _is_frame(row):  # an iterator of frames (Spark's processors)
                yield from self._add(row, limit)
                continue
            if hasattr(row, "asDict"):  # a pyspark.sql.Row
                row = row.asDict()
            is_dict = isinstance(row, Mapping)
            if self._rows and is_dict != self._dicts:
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
        if self._rows:
            table = _rows_to_table(self._rows, self._schema)
            self._tables.append(table)
            self._table_rows += table.num_rows
            self._rows = []

    def tables(self) -> list[pa.Table]:
        self._flush()
        return self._tables
