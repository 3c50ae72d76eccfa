"""The UnsafeRow decoder (statehold.spark_checkpoints.unsafe_row) on rows built by hand: one
literal row written byte by byte from Spark's layout, then every type Spark allows in state
(with nulls, extremes, nesting) through tests/support/spark_locations/unsafe_rows.py's
writer, then damaged rows refused in one line. The state schema types' parsing and Arrow
types too."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal as D
from typing import Any

import pytest

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import (
    Array,
    Atomic,
    Decimal,
    Field,
    Map,
    Struct,
    parse_struct,
    to_arrow,
)
from statehold.spark_checkpoints.state_reader import arrow_batch
from statehold.spark_checkpoints.state_schema import StateSchema
from statehold.spark_checkpoints.unsafe_row import BadRow, decode_row, row_decoder
from tests.support.spark_locations.unsafe_rows import encode_array, encode_row


def struct_of(*types: Any) -> Struct:
    return Struct(tuple(Field(f"f{i}", t) for i, t in enumerate(types)))


def test_a_row_written_byte_by_byte() -> None:
    """(long 7, null string, string "héllo"): bitset with bit 1 set, three slots, the
    string at offset 32 (8 + 3 * 8), 6 bytes, padded to 8."""
    text = "héllo".encode()
    row = (
        struct.pack("<q", 0b010)
        + struct.pack("<q", 7)
        + struct.pack("<q", 0)
        + struct.pack("<q", 32 << 32 | len(text))
        + text + b"\x00\x00"
    )
    schema = struct_of(Atomic("long"), Atomic("string"), Atomic("string"))
    assert decode_row(row, schema, "r") == (7, None, "héllo")
    assert encode_row((7, None, "héllo"), schema) == row


@pytest.mark.parametrize(("type_", "values"), [
    (Atomic("boolean"), [True, False]),
    (Atomic("byte"), [-128, 127, 0]),
    (Atomic("short"), [-32768, 32767]),
    (Atomic("integer"), [-(2**31), 2**31 - 1]),
    (Atomic("long"), [-(2**63), 2**63 - 1, 1_700_000_000]),
    (Atomic("float"), [1.5, -0.25]),
    (Atomic("double"), [1e300, -2.5]),
    (Atomic("date"), [19_000, -1]),
    (Atomic("timestamp"), [1_699_999_800_000_000, -5]),
    (Atomic("timestamp_ntz"), [0, 2**62]),
    (Atomic("string"), ["", "k0", "ü" * 100]),
    (Atomic("binary"), [b"", b"\x00\xff" * 9]),
    (Decimal(10, 2), [D("12345678.90"), D("-0.01")]),
    (Decimal(18, 0), [D("999999999999999999"), D("-999999999999999999")]),
    (Decimal(38, 6), [D("12345678901234567890123456789012.123456"), D("-1.000001"), D("0")]),
    (Decimal(20, 0), [D("-128"), D("127"), D("255"), D("-129")]),
    (Atomic("void"), [None]),
    (struct_of(Atomic("string"), Atomic("long")), [("a", 1), (None, None), ("bb", -2)]),
    (Array(Atomic("integer")), [[], [1, None, 3], list(range(70))]),
    (Array(Atomic("string")), [["x", None, "yz"]]),
    (Array(Atomic("boolean")), [[True, False, None, True]]),
    (Array(Decimal(30, 1)), [[D("1.5"), None]]),
    (Array(struct_of(Atomic("short"))), [[(1,), None, (2,)]]),
    (Map(Atomic("string"), Atomic("long")), [[], [("a", 1), ("b", None)]]),
    (Map(Atomic("integer"), Array(Atomic("double"))), [[(1, [0.5, None])]]),
])
def test_every_type_round_trips(type_: Any, values: list[Any]) -> None:
    schema = struct_of(Atomic("long"), type_, Atomic("string"))
    for value in values:
        row = (42, value, "after")
        assert decode_row(encode_row(row, schema), schema, "r") == row
        assert decode_row(encode_row((None, None, None), schema), schema, "r") == (None,) * 3


def test_more_than_64_fields_use_a_second_null_word() -> None:
    schema = struct_of(*[Atomic("integer")] * 70)
    values = tuple(None if i in (3, 64, 69) else i for i in range(70))
    row = encode_row(values, schema)
    assert len(row) == 16 + 70 * 8
    assert decode_row(row, schema, "r") == values


def test_a_struct_nested_three_deep() -> None:
    inner = struct_of(Atomic("string"), Decimal(25, 3))
    middle = struct_of(inner, Array(inner))
    schema = struct_of(middle, Atomic("date"))
    value = ((("a", D("1.500")), [("b", None), None]), 7)
    assert decode_row(encode_row(value, schema), schema, "r") == value


def _bad(data: bytes, schema: Struct) -> str:
    """The one-line refusal of `data`, the same from `decode_row` and from the decoder
    `row_decoder` makes for the schema (a flat one's own fast path), of the row alone or
    after a version byte."""
    messages = []
    prefixed = row_decoder(schema, "state/0/0/3.delta (a key)", 1)
    for decode in (lambda d: decode_row(d, schema, "state/0/0/3.delta (a key)"),
                   row_decoder(schema, "state/0/0/3.delta (a key)"),
                   lambda d: prefixed(b"\x00" + d)):
        with pytest.raises(BadRow) as caught:
            decode(data)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("state/0/0/3.delta (a key): ")
        assert isinstance(caught.value, SparkCheckpointError)
        messages.append(message)
    assert messages[0] == messages[1] == messages[2]
    return messages[0]


def test_damaged_rows_are_refused_in_one_line() -> None:
    strings = struct_of(Atomic("long"), Atomic("string"))
    good = encode_row((1, "abcdef"), strings)
    assert "needs 24 bytes" in _bad(good[:20], strings)
    assert "outside" in _bad(good[:-8], strings)  # the string's bytes cut off
    past = good[:16] + struct.pack("<q", 1000 << 32 | 4) + good[24:]
    assert "offset 1000" in _bad(past, strings)
    into_slots = good[:16] + struct.pack("<q", 8 << 32 | 4) + good[24:]
    assert "outside" in _bad(into_slots, strings)
    huge = good[:16] + struct.pack("<q", 24 << 32 | 0xFFFFFFFF) + good[24:]
    assert "outside" in _bad(huge, strings)

    arrays = struct_of(Array(Atomic("long")))
    row = bytearray(encode_row(([1, 2],), arrays))
    row[16:24] = struct.pack("<q", 2**40)  # the element count
    assert "claims" in _bad(bytes(row), arrays)
    row[16:24] = struct.pack("<q", -1)
    assert "claims -1" in _bad(bytes(row), arrays)

    maps = struct_of(Map(Atomic("integer"), Atomic("integer")))
    row = bytearray(encode_row(([(1, 2)],), maps))
    row[16:24] = struct.pack("<q", 10**6)  # the key array's size
    assert "key array" in _bad(bytes(row), maps)

    digits = struct_of(Decimal(4, 0))
    assert "digits" in _bad(struct.pack("<qq", 0, 12345), digits)
    wide = struct_of(Decimal(30, 0))
    assert "decimal(30) of 0 bytes" in _bad(struct.pack("<qq", 0, 16 << 32), wide)


def test_spark_json_types_parse_and_become_arrow_types() -> None:
    doc = {"type": "struct", "fields": [
        {"name": "w", "type": {"type": "struct", "fields": [
            {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}}]},
         "nullable": False, "metadata": {}},
        {"name": "d", "type": "decimal(20,4)", "nullable": True, "metadata": {}},
        {"name": "c", "type": "varchar(10)", "nullable": True, "metadata": {}},
        {"name": "a", "type": {"type": "array", "elementType": "date", "containsNull": False}},
        {"name": "m", "type": {"type": "map", "keyType": "string", "valueType": "timestamp_ntz",
                               "valueContainsNull": True}},
        {"name": "n", "type": "void"},
    ]}
    parsed = parse_struct(doc, "s")
    assert parsed.fields[1].type == Decimal(20, 4)
    assert parsed.fields[2].type == Atomic("string")
    arrow = to_arrow(parsed)
    assert str(arrow) == (
        "struct<w: struct<start: timestamp[us, tz=UTC]>, d: decimal128(20, 4), c: string, "
        "a: list<element: date32[day] not null>, m: map<string, timestamp[us]>, n: null>")


@pytest.mark.parametrize("doc", [
    {"type": "struct", "fields": [{"name": "i", "type": "interval"}]},
    {"type": "struct", "fields": [{"name": "i", "type": "decimal(40,2)"}]},
    {"type": "struct", "fields": [{"name": "i", "type": "decimal(5,7)"}]},
    {"type": "struct", "fields": [{"type": "long"}]},
    {"type": "struct", "fields": "long"},
    {"type": "array"},
    {"type": "udt", "class": "x"},
    ["long"],
])
def test_types_not_read_are_refused_in_one_line(doc: Any) -> None:
    with pytest.raises(SparkCheckpointError) as caught:
        parse_struct(doc, "state/0/0/_metadata/schema")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("state/0/0/_")


def test_deep_nesting_is_refused() -> None:
    doc: Any = "long"
    for _ in range(40):
        doc = {"type": "array", "elementType": doc}
    with pytest.raises(SparkCheckpointError, match="nests more than"):
        parse_struct({"type": "struct", "fields": [{"name": "a", "type": doc}]}, "s")


def test_decoded_rows_become_an_arrow_batch_of_key_then_value_columns() -> None:
    key = Struct((Field("w", struct_of(Atomic("timestamp"))), Field("k", Atomic("string"))))
    value = Struct((Field("d", Atomic("date")), Field("x", Decimal(30, 2)),
                    Field("m", Map(Atomic("string"), Atomic("long"))),
                    Field("__dummy__", Atomic("void"))))
    schema = StateSchema(key, value)
    rows = [((5_000_000,), "a", 1, D("1.25"), [("z", 9)], None),
            (None, None, None, None, None, None)]
    batch = arrow_batch(rows, schema.arrow(), "store")
    assert batch.schema.names == ["w", "k", "d", "x", "m", "__dummy__"]
    assert batch.schema.metadata == {b"statehold.key_columns": b"2"}
    first = batch.to_pylist()[0]
    assert first["w"]["f0"] == datetime.datetime(1970, 1, 1, 0, 0, 5, tzinfo=datetime.UTC)
    assert first["d"] == datetime.date(1970, 1, 2)
    assert first["x"] == D("1.25") and first["m"] == [("z", 9)]
    with pytest.raises(SparkCheckpointError, match="does not fit its column"):
        arrow_batch([((1,), 2, 3, 4, 5, 6)], schema.arrow(), "store")


def test_the_test_writer_lays_an_array_out_as_spark_does() -> None:
    """[1, null] of int: count 2, bitset 0b10, two 4-byte elements padded to 8."""
    assert encode_array([1, None], Atomic("integer")) == (
        struct.pack("<qq", 2, 0b10) + struct.pack("<ii", 1, 0))
