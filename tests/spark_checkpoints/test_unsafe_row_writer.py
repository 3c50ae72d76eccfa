"""statehold's UnsafeRow writer (spark_checkpoints.unsafe_row_writer): every record Spark
wrote in the committed HDFS-backed fixtures (keys and values of every query, all three
PySparks) written again byte for byte from its decoded values; Hypothesis' rows of every
supported type (nested, with nulls and extremes) decode back to themselves; the layout
details only a writer knows (a null large decimal's 16 reserved bytes) written by hand;
values that do not fit their type refused in one line."""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Context
from decimal import Decimal as D
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statehold.spark_checkpoints.spark_types import (
    Array,
    Atomic,
    Decimal,
    Field,
    Map,
    SparkType,
    Struct,
)
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_records import records
from statehold.spark_checkpoints.state_schema import read_state_schema
from statehold.spark_checkpoints.unsafe_row import decode_row, row_decoder
from statehold.spark_checkpoints.unsafe_row_writer import UnencodableValue, encode_row
from tests.support.spark_locations.committed_fixtures import fixture, manifests

_EXACT = Context(prec=80)
_INTS = {"byte": 8, "short": 16, "integer": 32, "date": 32, "long": 64, "timestamp": 64,
         "timestamp_ntz": 64}


def test_every_record_spark_wrote_is_written_again_byte_for_byte(
    extracted: Callable[[str], Path]
) -> None:
    count = 0
    for version, manifest in sorted(manifests().items()):
        for loc in manifest["locations"]:
            if loc["provider"] != "hdfs":
                continue
            ckpt = fixture(extracted(version), version, loc["query"], "hdfs").checkpoint
            for schema_file in ckpt.glob("state/*/0/**/_metadata/schema"):
                store_dir = schema_file.parent.parent
                schema = read_state_schema(schema_file.read_bytes(), str(schema_file))
                rel = store_dir.relative_to(ckpt / "state")
                op, name = rel.parts[0], rel.parts[2:]
                for path in ckpt.glob(f"state/{op}/*/{'/'.join(name)}"):
                    for f in [*path.glob("*.delta"), *path.glob("*.snapshot")]:
                        data = f.read_bytes()
                        for key, value in records(decompressed(iter([data]), str(f)), str(f),
                                                  deletes=True):
                            decoded = decode_row(key, schema.key, "k")
                            assert encode_row(decoded, schema.key) == key, f
                            assert row_decoder(schema.key, "k")(key) == decoded, f
                            if value is not None:
                                decoded = decode_row(value, schema.value, "v")
                                assert encode_row(decoded, schema.value) == value, f
                                assert row_decoder(schema.value, "v")(value) == decoded, f
                            count += 1
    assert count > 500


def _atomic() -> st.SearchStrategy[SparkType]:
    names = [*_INTS, "boolean", "float", "double", "string", "binary"]
    decimals = st.builds(lambda p, s: Decimal(p, min(s, p)), st.integers(1, 38),
                         st.integers(0, 38))
    return st.one_of(st.sampled_from(names).map(Atomic), decimals)


def _struct_of(children: st.SearchStrategy[SparkType]) -> st.SearchStrategy[Struct]:
    return st.lists(children, min_size=1, max_size=5).map(
        lambda ts: Struct(tuple(Field(f"f{i}", t) for i, t in enumerate(ts))))


def _types() -> st.SearchStrategy[SparkType]:
    return st.recursive(
        _atomic(),
        lambda children: st.one_of(
            _struct_of(children),
            children.map(Array),
            st.tuples(_atomic(), children).map(lambda kv: Map(kv[0], kv[1])),
        ),
        max_leaves=8,
    )


def _values(t: SparkType, nullable: bool = True) -> st.SearchStrategy[Any]:
    inner: st.SearchStrategy[Any]
    if isinstance(t, Atomic):
        if t.name in _INTS:
            bits = _INTS[t.name]
            inner = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        elif t.name == "boolean":
            inner = st.booleans()
        elif t.name == "float":
            inner = st.floats(width=32, allow_nan=False)
        elif t.name == "double":
            inner = st.floats(allow_nan=False)
        elif t.name == "string":
            inner = st.text(max_size=20)
        else:
            inner = st.binary(max_size=20)
    elif isinstance(t, Decimal):
        top = 10**t.precision - 1
        # exact: the default context's 28 digits would round a 36-digit value up past
        # its precision
        inner = st.integers(-top, top).map(lambda n: D(n).scaleb(-t.scale, _EXACT))
    elif isinstance(t, Struct):
        inner = st.tuples(*[_values(f.type) for f in t.fields])
    elif isinstance(t, Array):
        inner = st.lists(_values(t.element), max_size=6)
    else:
        assert isinstance(t, Map)
        inner = st.lists(st.tuples(_values(t.key, nullable=False), _values(t.value)),
                         max_size=4)
    return st.one_of(st.none(), inner) if nullable else inner


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=_struct_of(_types()))
def test_hypothesis_rows_round_trip(data: st.DataObject, schema: Struct) -> None:
    values = data.draw(st.tuples(*[_values(f.type) for f in schema.fields]))
    row = encode_row(values, schema)
    assert len(row) % 8 == 0
    assert decode_row(row, schema, "r") == values
    assert row_decoder(schema, "r")(row) == values  # a flat schema's fast path too
    assert row_decoder(schema, "r", 3)(b"\x00\x01\x02" + row) == values  # after a prefix


def test_a_null_large_decimal_reserves_its_16_bytes() -> None:
    """Spark writes a null decimal of more than 18 digits as a null bit and a slot
    pointing at 16 zero bytes (so the value can be set in place later); in an array,
    a null element is the null bit alone."""
    schema = Struct((Field("d", Decimal(38, 2)), Field("s", Atomic("string"))))
    row = encode_row((None, "ab"), schema)
    assert row == (struct.pack("<q", 0b01) + struct.pack("<q", 24 << 32)
                   + struct.pack("<q", 40 << 32 | 2) + bytes(16) + b"ab" + bytes(6))
    filled = encode_row((D("-1.28"), None), schema)  # unscaled -128: one byte, 0x80
    assert filled == (struct.pack("<q", 0b10) + struct.pack("<q", 24 << 32 | 1)
                      + bytes(8) + b"\x80" + bytes(15))
    arrays = Struct((Field("a", Array(Decimal(38, 0))),))
    assert encode_row(([None],), arrays) == (bytes(8) + struct.pack("<q", 16 << 32 | 24)
                                             + struct.pack("<q", 1) + struct.pack("<q", 1)
                                             + bytes(8))


@pytest.mark.parametrize(("t", "value", "message"), [
    (Atomic("integer"), 2**31, "field 'f0'"),
    (Decimal(4, 2), D("123.45"), "more than 4 digits"),
    (Atomic("string"), b"bytes", "bytes for a string"),
    (Struct((Field("x", Atomic("long")),)), (1, 2), "2 values for 1 fields"),
])
def test_a_value_that_does_not_fit_is_refused_in_one_line(t: SparkType, value: Any,
                                                          message: str) -> None:
    schema = Struct((Field("f0", t),))
    with pytest.raises(UnencodableValue, match=message) as refused:
        encode_row((value,), schema)
    assert "\n" not in str(refused.value)
