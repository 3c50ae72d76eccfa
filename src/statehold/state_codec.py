"""A compact binary encoding of one value of a Spark `DataType`, built once per schema.

Why not one Arrow IPC record batch per value: a state value is read and written one at a
time, by key, and an IPC message of one row costs about 400 bytes of framing and tens of
microseconds to build and parse (docs/design.md has the measurements). This encoding is
Spark's own value model written out field by field — the same integers Spark keeps
internally (microseconds, days, unscaled decimals) — so it is exact, about the size of
the data, and a few microseconds per value; pyarrow remains the representation of whole
batches. Values come back as PySpark's Python objects do from `transformWithStateInPandas`:
a top-level struct as a tuple, nested structs as `Row`, arrays as lists, maps as dicts,
binary as bytes, decimals with the type's scale, TIMESTAMP as a naive local datetime
(Spark's semantics: an aware datetime is an instant, a naive one is local time).

Layout: a struct is a varint field count, a null bitmap and its non-null fields in order;
arrays and maps are a varint count, a null bitmap (values only; map keys are never null)
and the elements. Because every struct states how many fields it holds, a value written
before a nullable field was appended still reads: the missing fields are None. Never
pickle; decoding only ever builds plain values.
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import struct
import time
from collections.abc import Callable
from decimal import Context, Decimal
from numbers import Integral, Real
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
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
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    YearMonthIntervalType,
)

from statehold.errors import InvalidArgumentError

#: The first byte of every encoded value: the layout below, so it can change later.
FORMAT = 1

Encoder = Callable[[Any, bytearray], None]
Decoder = Callable[[bytes, int], tuple[Any, int]]

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)
#: Wide enough that scaling a decimal(38) never rounds (the default context keeps 28 digits).
_EXACT = Context(prec=80)
_FIXED: dict[type[DataType], struct.Struct] = {
    ByteType: struct.Struct("<b"),
    ShortType: struct.Struct("<h"),
    IntegerType: struct.Struct("<i"),
    LongType: struct.Struct("<q"),
    DateType: struct.Struct("<i"),
    YearMonthIntervalType: struct.Struct("<i"),
}
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


class StateValueError(InvalidArgumentError, TypeError):
    """A value that does not fit its state variable's schema (nothing was written)."""


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _get_varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    n, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 140:  # decimal(38) needs 128 bits
            raise ValueError("varint too long")


def _bitmap(nulls: int, count: int) -> bytes:
    return nulls.to_bytes((count + 7) // 8, "little")


def build(dtype: DataType) -> tuple[Encoder, Decoder]:
    """The encoder and decoder of non-null values of `dtype` (nested nulls are handled by
    the enclosing struct, array or map)."""
    return _build(dtype, top=True)


def _build(dtype: DataType, top: bool = False) -> tuple[Encoder, Decoder]:  # noqa: C901
    kind = type(dtype)
    if kind in _FIXED:
        return _fixed(dtype)
    if kind is BooleanType:
        return _boolean()
    if kind is FloatType:
        return _float(_F32)
    if kind is DoubleType:
        return _float(_F64)
    if kind in (StringType, CharType, VarcharType):
        return _string()
    if kind is BinaryType:
        return _binary()
    if kind is DecimalType:
        assert isinstance(dtype, DecimalType)
        return _decimal(dtype.precision, dtype.scale)
    if kind is TimestampType:
        return _timestamp(local=True)
    if kind is TimestampNTZType:
        return _timestamp(local=False)
    if kind is DayTimeIntervalType:
        return _interval()
    if kind is ArrayType:
        assert isinstance(dtype, ArrayType)
        return _array(dtype)
    if kind is MapType:
        assert isinstance(dtype, MapType)
        return _map(dtype)
    if kind is StructType:
        assert isinstance(dtype, StructType)
        return _struct(dtype, top)
    raise InvalidArgumentError(
        f"state schemas cannot hold {dtype.simpleString()} values (supported: numbers, "
        "boolean, string, binary, decimal, date, timestamp, timestamp_ntz, day-time and "
        "year-month intervals, and arrays, maps and structs of them)"
    )


def _plain(v: Any) -> Any:
    """A NumPy scalar as the Python value it holds (pandas hands processors those)."""
    item = getattr(v, "item", None)
    return item() if item is not None and type(v).__module__ == "numpy" else v


def _fixed(dtype: DataType) -> tuple[Encoder, Decoder]:
    packer = _FIXED[type(dtype)]
    pack, unpack, size = packer.pack, packer.unpack_from, packer.size
    is_date = isinstance(dtype, DateType)
    name = dtype.simpleString()

    def enc(v: Any, out: bytearray) -> None:
        if is_date:
            if not isinstance(v, dt.date) or isinstance(v, dt.datetime):
                raise StateValueError(f"{name} needs a datetime.date, not {v!r}")
            v = v.toordinal() - _EPOCH_ORDINAL
        elif isinstance(v, bool) or not isinstance(v, Integral):
            v = _plain(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise StateValueError(f"{name} needs an int, not {v!r}")
        try:
            out += pack(int(v))
        except struct.error:
            raise StateValueError(f"{v!r} is out of range for {name}") from None

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        (n,) = unpack(buf, pos)
        if is_date:
            return dt.date.fromordinal(n + _EPOCH_ORDINAL), pos + size
        return n, pos + size

    return enc, dec


def _boolean() -> tuple[Encoder, Decoder]:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, bool):
            v = _plain(v)
            if not isinstance(v, bool):
                raise StateValueError(f"boolean needs a bool, not {v!r}")
        out.append(1 if v else 0)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return buf[pos] != 0, pos + 1

    return enc, dec


def _float(packer: struct.Struct) -> tuple[Encoder, Decoder]:
    pack, unpack, size = packer.pack, packer.unpack_from, packer.size

    def enc(v: Any, out: bytearray) -> None:
        if isinstance(v, bool) or not isinstance(v, Real):
            v = _plain(v)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise StateValueError(f"a floating-point field needs a float, not {v!r}")
        try:
            out += pack(float(v))
        except (OverflowError, struct.error):
            raise StateValueError(f"{v!r} is out of range for float") from None

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return enc, dec


def _string() -> tuple[Encoder, Decoder]:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, str):
            raise StateValueError(f"string needs a str, not {v!r}")
        try:
            data = v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise StateValueError(f"string is not valid Unicode: {e}") from None
        _put_varint(out, len(data))
        out += data

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = _get_varint(buf, pos)
        end = pos + n
        return str(buf[pos:end], "utf-8"), end

    return enc, dec


def _binary() -> tuple[Encoder, Decoder]:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, bytes | bytearray | memoryview):
            raise StateValueError(f"binary needs bytes, not {v!r}")
        _put_varint(out, len(v))
        out += v

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = _get_varint(buf, pos)
        end = pos + n
        return bytes(buf[pos:end]), end

    return enc, dec


def _decimal(precision: int, scale: int) -> tuple[Encoder, Decoder]:
    """The unscaled integer, as Spark keeps it; a value that would need rounding or more
    than `precision` digits is refused rather than changed."""
    name = f"decimal({precision},{scale})"
    limit = 10**precision

    def enc(v: Any, out: bytearray) -> None:
        if isinstance(v, bool) or not isinstance(v, Decimal | Integral):
            raise StateValueError(f"{name} needs a Decimal, not {v!r}")
        d = Decimal(int(v)) if isinstance(v, Integral) else v
        if not d.is_finite():
            raise StateValueError(f"{name} cannot hold {v!r}")
        sign, digits, exponent = d.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0")
        shift = exponent + scale
        if unscaled == 0:
            pass
        elif shift > precision or -shift > len(digits):  # cheap refusals of huge exponents
            raise StateValueError(f"{v!r} does not fit {name} exactly")
        elif shift >= 0:
            unscaled *= 10**shift
        elif unscaled % 10**-shift:
            raise StateValueError(f"{v!r} has more than {scale} decimal places for {name}")
        else:
            unscaled //= 10**-shift
        if unscaled >= limit:
            raise StateValueError(f"{v!r} has more than {precision} digits for {name}")
        _put_varint(out, 2 * unscaled - 1 if sign and unscaled else 2 * unscaled)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        z, pos = _get_varint(buf, pos)  # zigzag: 2n for n >= 0, 2|n| - 1 for n < 0
        unscaled = -((z + 1) >> 1) if z & 1 else z >> 1
        return Decimal(unscaled).scaleb(-scale, _EXACT), pos

    return enc, dec


def _timestamp(local: bool) -> tuple[Encoder, Decoder]:
    """Microseconds since the epoch. TIMESTAMP: an instant; a naive datetime is local time
    and reads back as a naive local datetime (as PySpark's TimestampType). TIMESTAMP_NTZ:
    wall-clock time, any tzinfo ignored (as PySpark's TimestampNTZType)."""
    name = "timestamp" if local else "timestamp_ntz"

    def enc(v: Any, out: bytearray) -> None:
        if hasattr(v, "to_pydatetime"):  # pandas.Timestamp
            if getattr(v, "nanosecond", 0):
                raise StateValueError(f"{name} holds microseconds; {v!r} has nanoseconds")
            v = v.to_pydatetime()
        if not isinstance(v, dt.datetime):
            raise StateValueError(f"{name} needs a datetime.datetime, not {v!r}")
        try:
            if not local:
                micros = (v.replace(tzinfo=None) - _EPOCH_NAIVE) // _MICRO
            elif v.tzinfo is not None:
                seconds = calendar.timegm(v.utctimetuple())
                micros = seconds * 1_000_000 + v.microsecond
            else:
                micros = int(time.mktime(v.timetuple())) * 1_000_000 + v.microsecond
        except (OverflowError, ValueError) as e:
            raise StateValueError(f"{v!r} is out of range for {name}: {e}") from None
        out += _I64.pack(micros)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        (micros,) = _I64.unpack_from(buf, pos)
        if local:
            seconds, rest = divmod(micros, 1_000_000)
            return dt.datetime.fromtimestamp(seconds).replace(microsecond=rest), pos + 8
        return _EPOCH_NAIVE + dt.timedelta(microseconds=micros), pos + 8

    return enc, dec


def _interval() -> tuple[Encoder, Decoder]:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, dt.timedelta):
            raise StateValueError(f"a day-time interval needs a datetime.timedelta, not {v!r}")
        out += _I64.pack(v // _MICRO)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return dt.timedelta(microseconds=_I64.unpack_from(buf, pos)[0]), pos + 8

    return enc, dec


def _array(dtype: ArrayType) -> tuple[Encoder, Decoder]:
    enc_e, dec_e = _build(dtype.elementType)
    may_be_null = dtype.containsNull

    def enc(v: Any, out: bytearray) -> None:
        if isinstance(v, str | bytes | dict) or not hasattr(v, "__iter__"):
            raise StateValueError(f"array needs a list, not {v!r}")
        items = list(v)
        nulls = 0
        for i, item in enumerate(items):
            if item is None:
                if not may_be_null:
                    raise StateValueError("array<... not null> got a None element")
                nulls |= 1 << i
        _put_varint(out, len(items))
        out += _bitmap(nulls, len(items))
        for item in items:
            if item is not None:
                enc_e(item, out)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = _get_varint(buf, pos)
        width = (n + 7) // 8
        nulls = int.from_bytes(buf[pos : pos + width], "little")
        pos += width
        items: list[Any] = []
        for i in range(n):
            if nulls >> i & 1:
                items.append(None)
            else:
                item, pos = dec_e(buf, pos)
                items.append(item)
        return items, pos

    return enc, dec


def _map(dtype: MapType) -> tuple[Encoder, Decoder]:
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
        _put_varint(out, len(v))
        for key in v:
            if key is None:
                raise StateValueError("map keys cannot be None")
            enc_k(key, out)
        enc_vs(list(v.values()), out)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = _get_varint(buf, pos)
        keys = []
        for _ in range(n):
            key, pos = dec_k(buf, pos)
            keys.append(key)
        vals, pos = dec_vs(buf, pos)
        return dict(zip(keys, vals, strict=True)), pos

    return enc, dec


def _struct(dtype: StructType, top: bool) -> tuple[Encoder, Decoder]:
    names = tuple(dtype.names)
    codecs = [_build(f.dataType) for f in dtype.fields]
    encoders = [c[0] for c in codecs]
    decoders = [c[1] for c in codecs]
    not_null = [i for i, f in enumerate(dtype.fields) if not f.nullable]
    count = len(names)
    width = (count + 7) // 8
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
        nulls = 0
        for i, item in enumerate(values):
            if item is None:
                nulls |= 1 << i
        for i in not_null:
            if nulls >> i & 1:
                raise StateValueError(f"field {names[i]!r} of {shape} is NOT NULL, got None")
        _put_varint(out, count)
        out += nulls.to_bytes(width, "little")
        for i, item in enumerate(values):
            if item is not None:
                try:
                    encoders[i](item, out)
                except StateValueError as e:
                    raise StateValueError(f"field {names[i]!r}: {e}") from None

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = _get_varint(buf, pos)
        if n > count:
            raise ValueError(f"a value with {n} fields does not fit {shape}")
        w = (n + 7) // 8
        nulls = int.from_bytes(buf[pos : pos + w], "little")
        pos += w
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


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN (for tests and checks of round trips)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)
