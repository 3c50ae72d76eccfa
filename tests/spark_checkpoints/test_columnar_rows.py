"""The offline read's column-by-column decoding of flat rows (`columnar_rows`) gives the
Arrow arrays the row-by-row decoder's rows make (`arrow_batch`), for Hypothesis rows of
every flat type with nulls, more than 64 fields and RocksDB's version byte; and it hands
back (None) every batch it must not take as it is: a row cut short, an offset outside its
row, a version byte not 0, a string that is not UTF-8. `all_decode` (verify --deep's
check of many rows at once) says True exactly where the row decoder takes every row,
for rows damaged at random. The read of every committed
fixture through it: test_spark_state_read.py."""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statehold.spark_checkpoints.columnar_rows import all_decode, flat_columns, is_flat
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import Atomic, Decimal, Field, Struct, arrow_fields
from statehold.spark_checkpoints.state_reader import arrow_batch
from statehold.spark_checkpoints.unsafe_row import decode_row, row_decoder
from tests.spark_checkpoints.test_unsafe_row_writer import _INTS, _values
from tests.support.spark_locations.unsafe_rows import encode_row

_FLAT = [*_INTS, "boolean", "float", "double", "string", "binary", "void"]


def _schemas(max_size: int = 6) -> st.SearchStrategy[Struct]:
    return st.lists(st.sampled_from(_FLAT), min_size=1, max_size=max_size).map(
        lambda names: Struct(tuple(Field(f"f{i}", Atomic(n)) for i, n in enumerate(names))))


def _value(t: Any) -> st.SearchStrategy[Any]:
    return st.none() if t.name == "void" else _values(t)


def _expected(rows: list[bytes], schema: Struct, skip: int) -> pa.RecordBatch:
    arrow = pa.schema(arrow_fields(schema))
    return arrow_batch([decode_row(r[skip:], schema, "r") for r in rows], arrow, "store")


def _columns(rows: list[bytes], schema: Struct, skip: int) -> list[pa.Array] | None:
    return flat_columns(rows, schema, [f.type for f in arrow_fields(schema)], skip)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=_schemas(), skip=st.sampled_from([0, 1]))
def test_flat_rows_decode_to_the_row_decoders_arrays(data: st.DataObject, schema: Struct,
                                                     skip: int) -> None:
    assert is_flat(schema)
    values = data.draw(st.lists(st.tuples(*[_value(f.type) for f in schema.fields]),
                                min_size=1, max_size=40))
    rows = [b"\x00" * skip + encode_row(v, schema) for v in values]
    columns = _columns(rows, schema, skip)
    assert columns is not None
    assert pa.RecordBatch.from_arrays(columns, schema=pa.schema(arrow_fields(schema))).equals(
        _expected(rows, schema, skip))


def test_more_than_64_fields_and_nulls_past_the_first_word() -> None:
    schema = Struct(tuple(Field(f"f{i}", Atomic("long" if i % 3 else "string"))
                          for i in range(70)))
    rows = [encode_row(tuple(None if (i + r) % 5 == 0 else (i if i % 3 else f"s{i}")
                             for i in range(70)), schema) for r in range(7)]
    columns = _columns(rows, schema, 0)
    assert columns is not None and columns[66].null_count > 0
    assert pa.RecordBatch.from_arrays(columns, schema=pa.schema(arrow_fields(schema))).equals(
        _expected(rows, schema, 0))


def test_what_is_not_taken_as_it_is_goes_back_to_the_row_decoder() -> None:
    schema = Struct((Field("n", Atomic("long")), Field("s", Atomic("string"))))
    good = encode_row((1, "abcdef"), schema)
    assert _columns([good, good], schema, 0) is not None
    outside = good[:8] + good[8:16] + struct.pack("<q", 1000 << 32 | 4) + good[24:]
    for rows, skip in [
        ([good, good[:20]], 0),  # a row cut short
        ([good, good[:-8]], 0),  # a string's bytes cut off
        ([outside], 0),  # an offset past the row
        ([good[:16] + struct.pack("<q", 8 << 32 | 4) + good[24:]], 0),  # into the slots
        ([b"\x00" + good, b"\x01" + good], 1),  # a state encoding version not 0
        ([encode_row((1, "ok"), schema)[:24] + b"\xff\xfe" + b"\x00" * 6], 0),  # not UTF-8
        ([], 0),
    ]:
        assert _columns(rows, schema, skip) is None, rows


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=_schemas(), skip=st.sampled_from([0, 1]))
def test_all_decode_is_whether_the_row_decoder_takes_every_row(
    data: st.DataObject, schema: Struct, skip: int
) -> None:
    values = data.draw(st.lists(st.tuples(*[_value(f.type) for f in schema.fields]),
                                min_size=1, max_size=20))
    rows = [b"\x00" * skip + encode_row(v, schema) for v in values]
    for i in data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=3)):
        row = bytearray(rows[i] or b"\x00")  # a byte changed anywhere, then cut
        row[data.draw(st.integers(0, len(row) - 1))] = data.draw(st.integers(0, 255))
        rows[i] = bytes(row[: data.draw(st.integers(0, len(row)))])
    decode = row_decoder(schema, "r", skip)

    def takes(row: bytes) -> bool:
        if skip and row[:1] != b"\x00":  # as the reader's RocksDB decoders refuse it
            return False
        try:
            decode(row)
        except SparkCheckpointError:
            return False
        return True

    assert all_decode(rows, schema, skip) == all(takes(r) for r in rows)


@pytest.mark.parametrize("schema", [
    Struct((Field("d", Decimal(10, 2)),)),
    Struct((Field("s", Struct((Field("a", Atomic("long")),))),)),
    Struct(()),
])
def test_nested_decimal_and_empty_schemas_are_not_flat(schema: Struct) -> None:
    assert not is_flat(schema)
