"""Cost of one typed state value: statehold's compact row encoding against JSON (the
untyped fallback) and against Arrow IPC of a one-row record batch (with and without the
schema message), per value encoded and decoded, and bytes stored.

    python bench/state_codec.py

Times are the best of 7 repeats (the machine may be shared; the best is the least
disturbed), in microseconds per value.
"""

from __future__ import annotations

import argparse
import datetime as dt
import timeit
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from statehold.state.json_codec import JsonCodec
from statehold.state.schema import codec_for, data_type

CASES: dict[str, tuple[str, tuple[Any, ...], Any]] = {
    "session state (3 BIGINT/INT)": (
        "start BIGINT, end BIGINT, events INT", (1700000000, 1700000300, 12),
        [1700000000, 1700000300, 12],
    ),
    "rich (9 fields, nested)": (
        "ts TIMESTAMP, d DATE, dec DECIMAL(10,2), b BINARY, s STRUCT<x: INT, y: STRING>, "
        "a ARRAY<BIGINT>, m MAP<STRING, DOUBLE>, name STRING, f DOUBLE",
        (dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.date(2020, 2, 29), Decimal("1.50"),
         b"\x00\x01" * 8, (1, "a"), [1, 2, 3], {"k": 1.5}, "hello world", 0.25),
        None,  # JSON cannot hold it
    ),
}


def per_value_us(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def arrow_row(schema: pa.Schema, value: tuple[Any, ...]) -> dict[str, Any]:
    row = {}
    for field, v in zip(schema, value, strict=True):
        if pa.types.is_struct(field.type):
            v = dict(zip([f.name for f in field.type], v, strict=True))
        elif pa.types.is_map(field.type):
            v = list(v.items())
        row[field.name] = v
    return row


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n", 1)[0]).parse_args()
    print("| value | encoding | bytes | encode µs | decode µs |")
    print("|---|---|---|---|---|")
    for name, (ddl, value, json_value) in CASES.items():
        for label, size, enc, dec in measure(ddl, value, json_value):
            print(f"| {name} | {label} | {size} | {enc:.1f} | {dec:.1f} |")


def measure(
    ddl: str, value: tuple[Any, ...], json_value: Any
) -> list[tuple[str, int, float, float]]:
    """(encoding, bytes, encode µs, decode µs) of one value."""
    codec = codec_for(ddl)
    data = codec.encode(value)
    rows = [("statehold compact", len(data), per_value_us(lambda: codec.encode(value), 20000),
             per_value_us(lambda: codec.decode(data), 20000))]
    dtype = data_type(ddl)
    assert isinstance(dtype, StructType)
    schema = to_arrow_schema(dtype, timezone="UTC")
    row = arrow_row(schema, value)

    def ipc_stream() -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            w.write_batch(pa.RecordBatch.from_pylist([row], schema=schema))
        return bytes(sink.getvalue().to_pybytes())

    stream = ipc_stream()
    rows.append(("Arrow IPC stream, 1 row", len(stream), per_value_us(ipc_stream, 2000),
                 per_value_us(lambda: pa.ipc.open_stream(stream).read_next_batch()
                              .to_pylist()[0], 2000)))

    def ipc_batch() -> bytes:
        return bytes(pa.RecordBatch.from_pylist([row], schema=schema).serialize()
                     .to_pybytes())

    batch = ipc_batch()
    rows.append(("Arrow IPC batch only (schema known)", len(batch),
                 per_value_us(ipc_batch, 2000),
                 per_value_us(lambda: pa.ipc.read_record_batch(pa.py_buffer(batch), schema)
                              .to_pylist()[0], 2000)))
    if json_value is not None:
        j = JsonCodec()
        jdata = j.encode(json_value)
        rows.append(("JSON (untyped)", len(jdata), per_value_us(lambda: j.encode(json_value),
                     20000), per_value_us(lambda: j.decode(jdata), 20000)))
    return rows


if __name__ == "__main__":
    main()
