"""A compact binary encoding of one value of a Spark `DataType`, built once per schema.

Why not one Arrow IPC record batch per value: a state value is read and written one at a
time, by key, and an IPC message of one row costs about 400 bytes of framing and tens of
microseconds to build and parse (docs/design.md has the measurements). This encoding is
Spark's own value model written out field by field (`statehold.state.types` has each leaf type's),
so it is exact, about the size of the data, and a few microseconds per value; pyarrow
remains the representation of whole batches. Values come back as PySpark's Python objects
do from `transformWithStateInPandas`: a top-level struct as a tuple, nested structs as
`Row`, arrays as lists, maps as dicts.

Layout: a struct is a varint field count, a null bitmap and its non-null fields in order;
arrays and maps are a varint count, a null bitmap (values only; map keys are never null)
and the elements. Because every struct states how many fields it holds, a value written
before a nullable field was appended still reads: the missing fields are None. Never
pickle; decoding only ever builds plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, Row, StructType

from statehold.errors import InvalidArgumentError
from statehold.state.json_codec import StateDecodeError, StateValueError
from statehold.state.types import BY_CLASS, Codec, get_varint, put_varint

#: The first byte of every encoded value: the layout below, so it can change later.
FORMAT = 1


def build(dtype: DataType) -> Codec:
    """The encoder and decoder of non-null values of `dtype` (nested nulls are handled by
    the enclosing struct, array or map)."""
    return _build(dtype, top=True)


def _build(dtype: DataType, top: bool = False) -> Codec:
    if isinstance(dtype, ArrayType):
        return _array(dtype)
    if isinstance(dtype, MapType):
        return _map(dtype)
    if isinstance(dtype, StructType):
        return _struct(dtype, top)
    leaf = BY_CLASS.get(type(dtype))
    if leaf is None or leaf.codec is None:
        raise InvalidArgumentError(
            f"state schemas cannot hold {dtype.simpleString()} values (supported: numbers, "
            "boolean, string, binary, decimal, date, timestamp, timestamp_ntz, day-time and "
            "year-month intervals, and arrays, maps and structs of them)"
        )
    return leaf.codec(dtype)


def _nulls(values: Sequence[Any]) -> int:
    """The null bitmap of `values`: bit i set where values[i] is None."""
    return sum(1 << i for i, item in enumerate(values) if item is None)


def _put_head(out: bytearray, count: int, nulls: int) -> None:
    """What a struct, array or map starts with: its count, then its null bitmap."""
    put_varint(out, count)
    out += nulls.to_bytes((count + 7) // 8, "little")


def _get_head(buf: bytes, pos: int) -> tuple[int, int, int]:
    """The count and null bitmap at `pos`, and the position after them."""
    count, pos = get_varint(buf, pos)
    end = pos + (count + 7) // 8
    return count, int.from_bytes(buf[pos:end], "little"), end


def _array(dtype: ArrayType) -> Codec:
    enc_e, dec_e = _build(dtype.elementType)
    may_be_null = dtype.containsNull

    def enc(v: Any, out: bytearray) -> None:
        if isinstance(v, str | bytes | dict) or not hasattr(v, "__iter__"):
            raise StateValueError(f"array needs a list, not {v!r}")
        items = list(v)
        nulls = _nulls(items)
        if nulls and not may_be_null:
            raise StateValueError("array<... not null> got a None element")
        _put_head(out, len(items), nulls)
        for item in items:
            if item is not None:
                enc_e(item, out)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, nulls, pos = _get_head(buf, pos)
        items: list[Any] = []
        for i in range(n):
            if nulls >> i & 1:
                items.append(None)
            else:
                item, pos = dec_e(buf, pos)
                items.append(item)
        return items, pos

    return enc, dec


def _map(dtype: MapType) -> Codec:
    if isinstance(dtype.keyType, ArrayType | MapType):
        raise InvalidArgumentError(
            f"state schemas cannot hold maps keyed by {dtype.keyType.simpleString()} "
            "(a Python dict needs hashable keys)"
        )
    enc_k, dec_k = _build(dtype.keyType)
    values: ArrayType = ArrayType(dtype.valueType, dtype.valueContainsNull)
    enc_vs, dec_vs = _array(values)

    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, dict):
            raise StateValueError(f"map needs a dict, not {v!r}")
        put_varint(out, len(v))
        for key in v:
            if key is None:
                raise StateValueError("map keys cannot be None")
            enc_k(key, out)
        enc_vs(list(v.values()), out)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = get_varint(buf, pos)
        keys = []
        for _ in range(n):
            key, pos = dec_k(buf, pos)
            keys.append(key)
        vals, pos = dec_vs(buf, pos)
        return dict(zip(keys, vals, strict=True)), pos

    return enc, dec


def _struct(dtype: StructType, top: bool) -> Codec:
    names = tuple(dtype.names)
    codecs = [_build(f.dataType) for f in dtype.fields]
    encoders = [c[0] for c in codecs]
    decoders = [c[1] for c in codecs]
    not_null = [i for i, f in enumerate(dtype.fields) if not f.nullable]
    count = len(names)
    index = {n: i for i, n in enumerate(names)}
    shape = dtype.simpleString()

    def fields_of(v: Any) -> tuple[Any, ...] | list[Any]:
        if isinstance(v, dict):
            unknown = set(v) - set(index)
            if unknown:
                raise StateValueError(f"{shape} has no field(s) {sorted(unknown)}")
            return [v.get(n) for n in names]
        if isinstance(v, Row) and hasattr(v, "__fields__") and set(v.__fields__) == set(names):
            return [v[v.__fields__.index(n)] for n in names]
        if not isinstance(v, tuple | list):
            raise StateValueError(f"{shape} needs a tuple, list, Row or dict, not {v!r}")
        if len(v) != count:
            raise StateValueError(f"{shape} has {count} field(s), got {len(v)}: {v!r}")
        return v

    def enc(v: Any, out: bytearray) -> None:
        values = fields_of(v)
        nulls = _nulls(values)
        for i in not_null:
            if nulls >> i & 1:
                raise StateValueError(f"field {names[i]!r} of {shape} is NOT NULL, got None")
        _put_head(out, count, nulls)
        for i, item in enumerate(values):
            if item is not None:
                try:
                    encoders[i](item, out)
                except StateValueError as e:
                    raise StateValueError(f"field {names[i]!r}: {e}") from None

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, nulls, pos = _get_head(buf, pos)
        if n > count:
            raise StateDecodeError(f"a value with {n} fields does not fit {shape}")
        values: list[Any] = [None] * count
        for i in range(n):
            if not nulls >> i & 1:
                values[i], pos = decoders[i](buf, pos)
        if top:
            return tuple(values), pos
        row = Row(*values)
        row.__fields__ = list(names)
        return row, pos

    return enc, dec

