"""Typed state: values of any supported Spark type round-trip exactly, DDL parses as Spark
parses it, schema evolution accepts appended nullable fields and refuses the rest (naming
the variable and both types), and checkpoint metadata records schemas compatibly."""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from statehold.format import metadata
from statehold.format.metadata import CheckpointMetadata, OperatorSchemas, VariableSchema
from statehold.state.ddl import DDLError, parse_ddl
from statehold.state.json_codec import JsonCodec, StateDecodeError, StateValueError
from statehold.state.schema import (
    SchemaEvolutionError,
    check_compatible,
    check_same_key,
    codec_for,
    from_schema_json,
)


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN (round trips of floats)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)

# -- strategies: a Spark type, a value of it, and the value Spark hands back -----------------
_LOCAL_EPOCH = dt.datetime(1970, 1, 1)
_INTS = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}
names = st.from_regex(r"\A[a-z][a-z0-9_]{0,5}\Z")


def leaf_types() -> st.SearchStrategy[DataType]:
    return st.sampled_from(
        [BooleanType(), ByteType(), ShortType(), IntegerType(), LongType(), FloatType(),
         DoubleType(), StringType(), BinaryType(), DateType(), TimestampType(),
         TimestampNTZType(), DayTimeIntervalType(0, 3)]
    ) | st.builds(
        lambda p, s: DecimalType(p, min(s, p)), st.integers(1, 38), st.integers(0, 38)
    )


def _struct(fields: list[tuple[str, DataType, bool]]) -> StructType:
    seen: set[str] = set()
    unique = [(n, t, null) for n, t, null in fields if not (n in seen or seen.add(n))]
    return StructType([StructField(n, t, null) for n, t, null in unique])


types = st.recursive(
    leaf_types(),
    lambda inner: (
        st.builds(ArrayType, inner, st.booleans())
        | st.builds(MapType, leaf_types(), inner, st.booleans())
        | st.lists(st.tuples(names, inner, st.booleans()), min_size=1, max_size=4).map(_struct)
    ),
    max_leaves=6,
)


def values(t: DataType, nullable: bool) -> st.SearchStrategy[tuple[Any, Any]]:
    """(value to store, the value that reads back) for type `t`."""
    inner = _values(t)
    return (st.just((None, None)) | inner) if nullable else inner


def _same(s: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, Any]]:
    return s.map(lambda v: (v, v))


def _values(t: DataType) -> st.SearchStrategy[tuple[Any, Any]]:  # noqa: C901
    if type(t) in _INTS:
        bits = _INTS[type(t)]
        return _same(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
    if isinstance(t, BooleanType):
        return _same(st.booleans())
    if isinstance(t, FloatType):  # Spark keeps a float32: what reads back is the float32
        return st.floats(width=64).map(lambda f: (f, _f32(f))).filter(lambda p: p[1] is not None)
    if isinstance(t, DoubleType):
        return _same(st.floats())
    if isinstance(t, StringType):
        return _same(st.text(st.characters(exclude_categories=["Cs"]), max_size=20))
    if isinstance(t, BinaryType):
        return _same(st.binary(max_size=20))
    if isinstance(t, DateType):
        return _same(st.dates())
    if isinstance(t, TimestampNTZType):
        return _same(st.datetimes())
    if isinstance(t, TimestampType):  # an instant, read back as naive local time
        aware = st.datetimes(
            min_value=dt.datetime(1900, 1, 2), max_value=dt.datetime(2200, 1, 1),
            timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-7, minutes=-30))]),
        )
        return aware.map(lambda v: (v, v.astimezone().replace(tzinfo=None)))
    if isinstance(t, DayTimeIntervalType):
        return _same(st.timedeltas(min_value=-dt.timedelta(days=10**6),
                                   max_value=dt.timedelta(days=10**6)))
    if isinstance(t, DecimalType):
        p, s = t.precision, t.scale
        return _same(st.integers(-(10**p) + 1, 10**p - 1).map(lambda u: Decimal(f"{u}E-{s}")))
    if isinstance(t, ArrayType):
        return st.lists(values(t.elementType, t.containsNull), max_size=4).map(
            lambda pairs: ([a for a, _ in pairs], [b for _, b in pairs])
        )
    if isinstance(t, MapType):
        return st.lists(
            st.tuples(_values(t.keyType), values(t.valueType, t.valueContainsNull)), max_size=4
        ).map(lambda items: _map_pair(items))
    assert isinstance(t, StructType)
    return st.tuples(*(values(f.dataType, f.nullable) for f in t.fields)).map(
        lambda pairs: (tuple(a for a, _ in pairs), tuple(b for _, b in pairs))
    )


def _map_pair(items: list[tuple[tuple[Any, Any], tuple[Any, Any]]]) -> tuple[Any, Any]:
    stored, read = {}, {}
    for (k_in, k_out), (v_in, v_out) in items:
        if isinstance(k_out, float) and math.isnan(k_out):
            continue  # NaN keys never look themselves up
        if k_out in read:
            continue  # two keys equal once stored (0.0 and 6.7e-149 as FLOAT): one map key
        stored[k_in], read[k_out] = v_in, v_out
    return stored, read


def _f32(f: float) -> float | None:
    try:
        return float(struct.unpack("<f", struct.pack("<f", f))[0])
    except OverflowError:
        return None


# -- round trips ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), t=types)
def test_every_type_round_trips_exactly(data: st.DataObject, t: DataType) -> None:
    stored, expected = data.draw(_values(t))
    codec = codec_for(t)
    decoded = codec.decode(codec.encode(stored))
    assert same_value(decoded, expected), (decoded, expected)
    # and the recorded schema is Spark's canonical JSON, which builds the same codec
    assert codec.schema_json() == t.json()
    again = codec_for(from_schema_json(codec.schema_json() or ""))
    assert same_value(again.decode(codec.encode(stored)), expected)


def test_values_read_back_as_spark_returns_them() -> None:
    """What Spark 4's transformWithStateInPandas hands back for the same value: a tuple at
    the top, Row for nested structs, bytes, the decimal at its scale, float32."""
    codec = codec_for(
        "ts TIMESTAMP, d DATE, dec DECIMAL(10,2), b BINARY, s STRUCT<x: INT, y: STRING>, "
        "a ARRAY<BIGINT>, m MAP<STRING, DOUBLE>, f FLOAT"
    )
    value = (dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), dt.date(2020, 2, 29),
             Decimal("1.5"), b"\x00\x01", (1, "a"), [1, 2], {"k": 1.5}, 0.1)
    got = codec.decode(codec.encode(value))
    assert type(got) is tuple
    assert got[0] == value[0].astimezone().replace(tzinfo=None) and got[0].tzinfo is None
    assert str(got[2]) == "1.50" and type(got[3]) is bytes
    assert isinstance(got[4], Row) and got[4].asDict() == {"x": 1, "y": "a"}
    assert got[7] == struct.unpack("<f", struct.pack("<f", 0.1))[0] != 0.1


def test_inputs_spark_accepts_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    codec = codec_for("n BIGINT, ok BOOLEAN, x DOUBLE, ts TIMESTAMP_NTZ, s STRUCT<a: INT, b: INT>")
    got = codec.decode(codec.encode(
        (np.int64(7), np.bool_(True), np.float32(0.5), pd.Timestamp("2024-01-01 00:00:01"),
         {"b": 2, "a": 1})
    ))
    assert got[:4] == (7, True, 0.5, dt.datetime(2024, 1, 1, 0, 0, 1))
    assert tuple(got[4]) == (1, 2)


@pytest.mark.parametrize(
    ("ddl", "value", "why"),
    [
        ("a INT", (2**31,), "out of range"),
        ("a INT NOT NULL", (None,), "NOT NULL"),
        ("a DECIMAL(5,2)", (Decimal("1.005"),), "decimal places"),
        ("a DECIMAL(5,2)", (Decimal("1234.5"),), "digits"),
        ("a DATE", (dt.datetime(2024, 1, 1),), "datetime.date"),
        ("a STRING", (b"x",), "str"),
        ("a INT, b INT", (1,), "2 field"),
        ("a STRUCT<x: INT>", ({"y": 1},), "no field"),
        ("a STRING", ("\ud800",), "Unicode"),
        ("BIGINT", None, "cannot be None"),
        ("a MAP<STRING, INT>", ({None: 1},), "None"),
    ],
)
def test_values_that_do_not_fit_are_refused(ddl: str, value: Any, why: str) -> None:
    with pytest.raises(StateValueError, match=why):
        codec_for(ddl).encode(value)


def test_corrupt_bytes_name_the_type() -> None:
    codec = codec_for("a BIGINT, b STRING")
    good = codec.encode((1, "x"))
    for bad in (b"", b"\x09" + good[1:], good[:-1], good + b"\x00"):
        with pytest.raises(StateDecodeError, match="struct<a:bigint,b:string>"):
            codec.decode(bad)


def test_json_stays_the_untyped_fallback() -> None:
    codec = codec_for(None)
    assert isinstance(codec, JsonCodec) and codec.schema_json() is None
    assert codec.decode(codec.encode({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}


# -- DDL ------------------------------------------------------------------------------------
DDL_CASES = [
    "a INT, b STRING NOT NULL",
    "a: int, b: timestamp_ntz",
    "BIGINT",
    " map<string , string > ",
    "struct<a: int, `b c`: array<map<string, decimal(20,3)>>>",
    "x INTERVAL DAY TO SECOND, y INTERVAL YEAR, z interval hour to minute",
    "a DEC, b NUMERIC(7), c DECIMAL(38, 38), d TINYINT, e SMALLINT, f REAL, g BYTE, h LONG",
    "a STRING COMMENT 'the a', b BINARY, c DATE, d TIMESTAMP_LTZ, e TIMESTAMP",
    "`we``ird` BOOLEAN, s STRUCT<>",
    "a CHAR(3), b VARCHAR(10)",
]


@pytest.mark.parametrize("text", ["a INT,", "array<int", "a BLAH", "map<int, boolean>>",
                                  "DECIMAL(39)", "INTERVAL SECOND TO DAY", ""])
def test_bad_ddl_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(DDLError, match="schema") as e:
        parse_ddl(text)
    assert "\n" not in str(e.value)


def test_unsupported_types_are_refused() -> None:
    with pytest.raises(Exception, match="cannot hold void"):
        codec_for("a VOID")
    with pytest.raises(Exception, match="hashable"):
        codec_for("m MAP<ARRAY<INT>, INT>")


@pytest.mark.spark
@pytest.mark.matrix  # each PySpark's own parser
def test_ddl_parses_as_spark_parses_it(spark: Any) -> None:
    from pyspark.sql.types import _parse_datatype_string

    for text in DDL_CASES:
        assert parse_ddl(text).json() == _parse_datatype_string(text).json(), text


# -- evolution -------------------------------------------------------------------------------
OLD = "id BIGINT, s STRUCT<x: INT>, events ARRAY<STRUCT<t: TIMESTAMP>>"


@pytest.mark.parametrize(
    "new",
    [
        OLD,
        OLD + ", note STRING",
        "id BIGINT, s STRUCT<x: INT, y: DECIMAL(5,1)>, events ARRAY<STRUCT<t: TIMESTAMP>>",
        "id BIGINT, s STRUCT<x: INT>, events ARRAY<STRUCT<t: TIMESTAMP, n: INT>>, z BINARY",
        "id BIGINT COMMENT 'comments do not matter', s STRUCT<x: INT>, "
        "events ARRAY<STRUCT<t: TIMESTAMP>>",
    ],
)
def test_appending_nullable_fields_is_accepted_and_old_values_read(new: str) -> None:
    old_codec, new_codec = codec_for(OLD), codec_for(new)
    check_compatible("v", old_codec.schema_json(), new_codec.schema_json())
    when = dt.datetime(2024, 5, 6, 7, 8, 9)
    got = new_codec.decode(old_codec.encode((5, (3,), [(when,)])))
    assert got[0] == 5 and got[1][0] == 3 and got[2][0][0] == when
    width = len(parse_ddl(new).fields)  # type: ignore[attr-defined]
    assert len(got) == width and all(v is None for v in got[3:])
    assert all(v is None for v in tuple(got[1])[1:]) and all(
        v is None for v in tuple(got[2][0])[1:]
    )


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("a INT", "a BIGINT", "int became bigint"),
        ("a INT, b STRING", "a INT", "removed"),
        ("a INT, b STRING", "a INT, c STRING", "became 'c'"),
        ("a INT", "b STRING, a INT", "became 'b'"),
        ("a INT", "a INT, b INT NOT NULL", "NOT NULL"),
        ("a INT", "a INT NOT NULL", "NOT NULL"),
        ("a MAP<STRING, INT>", "a MAP<INT, INT>", "map key"),
        ("a DECIMAL(10,2)", "a DECIMAL(10,3)", "decimal"),
        ("a ARRAY<STRUCT<x: INT>>", "a ARRAY<STRUCT<x: STRING>>", "a\\[\\].x"),
        ("a TIMESTAMP", "a TIMESTAMP_NTZ", "timestamp_ntz"),
        ("a STRING", "a STRING COLLATE UTF8_LCASE", "collate"),
    ],
)
def test_incompatible_changes_are_refused_naming_both_types(old: str, new: str, why: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=why) as e:
        check_compatible("sessions", codec_for(old).schema_json(), codec_for(new).schema_json())
    message = str(e.value)
    assert "'sessions'" in message
    assert parse_ddl(old).simpleString() in message and parse_ddl(new).simpleString() in message


def test_typed_and_untyped_do_not_mix() -> None:
    typed = codec_for("a INT").schema_json()
    for recorded, requested in ((None, typed), (typed, None)):
        with pytest.raises(SchemaEvolutionError, match="untyped JSON"):
            check_compatible("v", recorded, requested)
    check_compatible("v", None, None)


def test_key_types_must_not_change_but_names_may() -> None:
    old = codec_for("user STRING, day DATE").schema_json()
    check_same_key("op", old, codec_for("name STRING, d DATE NOT NULL").schema_json())
    with pytest.raises(SchemaEvolutionError, match="'op'.*user:string,day:date.*bigint"):
        check_same_key("op", old, codec_for("user STRING, day BIGINT").schema_json())


@pytest.mark.parametrize("text", ["{", "[1]", '"nope"', "[" * 5000 + "]" * 5000])
def test_a_damaged_record_is_refused(text: str) -> None:
    with pytest.raises(SchemaEvolutionError, match="recorded schema"):
        from_schema_json(text)


# -- metadata ---------------------------------------------------------------------------------


def _meta(**extra: Any) -> CheckpointMetadata:
    return CheckpointMetadata(job_id="j", checkpoint_id=3, epoch=1, max_parallelism=8, **extra)


def test_metadata_records_schemas_as_version_2() -> None:
    record = OperatorSchemas(
        key=codec_for("user STRING").schema_json(),
        variables={"s": VariableSchema(kind="value", value=codec_for("a INT").schema_json()),
                   "m": VariableSchema(kind="map", value=None, map_key=None)},
    )
    key = "chk-3/_metadata"
    data = metadata.encode(_meta(state_schemas={"state": record}), key)
    back = metadata.decode(data, key)
    assert json.loads(data)["version"] == 2 and back.state_schemas == {"state": record}


def test_metadata_without_schemas_is_the_old_document() -> None:
    key = "chk-3/_metadata"
    data = metadata.encode(_meta(), key)
    doc = json.loads(data)
    assert doc["version"] == 1 and "state_schemas" not in doc
    assert metadata.decode(data, key).state_schemas is None


def test_a_newer_schema_record_is_refused() -> None:
    key = "chk-3/_metadata"
    doc = json.loads(metadata.encode(_meta(state_schemas={"state": OperatorSchemas()}), key))
    doc["state_schemas"]["state"]["version"] = 2
    from statehold.format import signed

    doc["checksum"] = signed.digest(doc)
    with pytest.raises(metadata.MetadataError, match="upgrade statehold"):
        metadata.decode(json.dumps(doc).encode(), key)
