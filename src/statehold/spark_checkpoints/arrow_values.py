"""What a transform's function answers, checked and turned back into rows: its Arrow
record batches (key columns, then value columns) as the Python values
`unsafe_row_writer.encode_row` writes (and `unsafe_row.decode_row` gives), so a row read,
changed and written again is the row Spark would have written. Shared by `transform`
(one store's rows) and `tws_transform` (a transformWithState variable's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import Array, Atomic, Decimal, Map, SparkType, Struct

#: What ``fn`` gets and returns: a batch of key columns then value columns (returned:
#: in the new schema; None or no rows: none kept).
TransformFn = Callable[[pa.RecordBatch], "pa.RecordBatch | pa.Table | None"]


def returned(out: Any, want: pa.Schema, new: bool = False) -> Iterable[pa.RecordBatch]:
    """`fn`'s answer as record batches of `want`'s columns, or refused in one line (`new`:
    the schema is a new one, as the refusal says)."""
    if out is None:
        return []
    batches: list[pa.RecordBatch]
    if isinstance(out, pa.Table):
        batches = list(out.to_batches())
        schema = out.schema
    elif isinstance(out, pa.RecordBatch):
        batches, schema = [out], out.schema
    else:
        raise SparkCheckpointError(
            f"fn returned {type(out).__name__}: a pyarrow RecordBatch, Table or None is "
            "expected; nothing restartable written")
    if schema.names != want.names:
        raise SparkCheckpointError(
            f"fn returned columns ({', '.join(schema.names)}), not the "
            f"{'new ' if new else ''}schema's ({', '.join(want.names)}); "
            "nothing restartable written")
    for got, expected in zip(schema, want, strict=True):
        if not got.type.equals(expected.type):
            raise SparkCheckpointError(
                f"fn returned column {got.name} as {got.type}, not {expected.type}; "
                "nothing restartable written")
    return batches


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """No rows of `schema`: what ``fn`` is probed with before anything is written."""
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def row_columns(batch: pa.RecordBatch, start: int, stop: int,
                convert: list[Callable[[pa.Array], list[Any]]]) -> list[tuple[Any, ...]]:
    """Rows of columns `start` to `stop` as `unsafe_row.decode_row` gives values."""
    columns = [fn(batch.column(i)) for fn, i in zip(convert, range(start, stop), strict=True)]
    if not columns:
        return [()] * batch.num_rows
    return list(zip(*columns, strict=True))


def to_values(t: SparkType) -> Callable[[pa.Array], list[Any]]:
    """An Arrow array of `t` (as `spark_types.to_arrow` types it) to Python values as
    `decode_row` gives them: dates in days, timestamps in microseconds, structs as tuples,
    maps as lists of pairs."""
    if isinstance(t, Atomic):
        if t.name in ("timestamp", "timestamp_ntz"):
            return lambda a: a.cast(pa.int64()).to_pylist()
        if t.name == "date":
            return lambda a: a.cast(pa.int32()).to_pylist()
        return lambda a: a.to_pylist()
    if isinstance(t, Decimal):
        return lambda a: a.to_pylist()
    if isinstance(t, Struct):
        children = [to_values(f.type) for f in t.fields]

        def struct(a: pa.Array) -> list[Any]:
            valid = a.is_valid().to_pylist()
            fields = [c(a.field(i)) for i, c in enumerate(children)]
            rows = list(zip(*fields, strict=True)) if fields else [()] * len(a)
            return [r if ok else None for r, ok in zip(rows, valid, strict=True)]

        return struct
    if isinstance(t, Array):
        element = to_values(t.element)
        return lambda a: _split(a, element(_flat(a)))
    if isinstance(t, Map):
        keys, values = to_values(t.key), to_values(t.value)

        def entries(a: pa.Array) -> list[Any]:
            flat = _flat(a)
            pairs = list(zip(keys(flat.field(0)), values(flat.field(1)), strict=True))
            return _split(a, pairs)

        return entries
    raise SparkCheckpointError(f"no values for type {t}")  # pragma: no cover


def _flat(a: Any) -> Any:
    """A list or map array's elements, of its slice only."""
    offsets = a.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    return a.values.slice(first, last - first)


def _split(a: Any, flat: list[Any]) -> list[Any]:
    offsets = a.offsets.to_pylist()
    base = offsets[0]
    valid = a.is_valid().to_pylist()
    return [flat[s - base:e - base] if ok else None
            for s, e, ok in zip(offsets, offsets[1:], valid, strict=False)]
