"""What the user's functions return, gathered over all keys of a task into Arrow tables
of exactly the output schema."""

from __future__ import annotations

from collections.abc import Mapping
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

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._tables: list[pa.Table] = []
        self._rows: list[Any] = []
        self._dicts = False

    def add(self, out: Any) -> None:
        if out is None:
            return
        if _is_frame(out):
            if not len(out):  # also a column-less pandas.DataFrame()
                return
            self._flush()
            table = _to_table(out, self._schema)
            if table.num_rows:
                self._tables.append(table)
            return
        for row in out:
            if _is_frame(row):  # an iterator of frames (Spark's processors)
                self.add(row)
                continue
            if hasattr(row, "asDict"):  # a pyspark.sql.Row
                row = row.asDict()
            is_dict = isinstance(row, Mapping)
            if self._rows and is_dict != self._dicts:
                self._flush()
            self._dicts = is_dict
            self._rows.append(row)

    def _flush(self) -> None:
        if self._rows:
            self._tables.append(_rows_to_table(self._rows, self._schema))
            self._rows = []

    def tables(self) -> list[pa.Table]:
        self._flush()
        return self._tables
