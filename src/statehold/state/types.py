"""The Spark leaf types state can hold, each described once in `TYPES`: the DDL words that
name it (`statehold.state.ddl` parses them), its PySpark `DataType` class, and how one value of it
becomes bytes (`statehold.state.codec` builds arrays, maps and structs of these).

An encoding writes the value Spark keeps internally — microseconds, days, unscaled
decimals as zigzag varints, UTF-8 with a varint length — so it is exact and about the size
of the data. Values read back as PySpark's Python objects do from
`transformWithStateInPandas`: binary as bytes, decimals with the type's scale, FLOAT as
the float32 Spark keeps, TIMESTAMP as a naive local datetime (Spark's semantics: an aware
datetime is an instant, a naive one is local time). Nothing is rounded: a value that
would need it is refused with `StateValueError`.
"""

from __future__ import annotations

import calendar
import datetime as dt
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Context, Decimal
from functools import lru_cache, partial
from numbers import Integral, Real
from typing import Any

from pyspark.sql.types import (
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
    NullType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    YearMonthIntervalType,
)

from statehold.state.json_codec import StateDecodeError, StateValueError

Encoder = Callable[[Any, bytearray], None]
Decoder = Callable[[bytes, int], tuple[Any, int]]
Codec = tuple[Encoder, Decoder]

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)
#: Wide enough that scaling a decimal(38) never rounds (the default context keeps 28 digits).
_EXACT = Context(prec=80)
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


def put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def get_varint(buf: bytes, pos: int) -> tuple[int, int]:
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
            raise StateDecodeError("varint too long")


def _plain(v: Any) -> Any:
    """A NumPy scalar as the Python value it holds (pandas hands processors those)."""
    item = getattr(v, "item", None)
    return item() if item is not None and type(v).__module__ == "numpy" else v


def _integer(packer: struct.Struct, dtype: DataType) -> Codec:
    pack, unpack, size = packer.pack, packer.unpack_from, packer.size
    name = dtype.simpleString()

    def enc(v: Any, out: bytearray) -> None:
        if isinstance(v, bool) or not isinstance(v, Integral):
            v = _plain(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise StateValueError(f"{name} needs an int, not {v!r}")
        try:
            out += pack(int(v))
        except struct.error:
            raise StateValueError(f"{v!r} is out of range for {name}") from None

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return enc, dec


def _date(dtype: DataType) -> Codec:
    """Days since the epoch (every `datetime.date` fits an int32)."""

    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, dt.date) or isinstance(v, dt.datetime):
            raise StateValueError(f"date needs a datetime.date, not {v!r}")
        out += _I32.pack(v.toordinal() - _EPOCH_ORDINAL)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return dt.date.fromordinal(_I32.unpack_from(buf, pos)[0] + _EPOCH_ORDINAL), pos + 4

    return enc, dec


def _boolean(dtype: DataType) -> Codec:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, bool):
            v = _plain(v)
            if not isinstance(v, bool):
                raise StateValueError(f"boolean needs a bool, not {v!r}")
        out.append(1 if v else 0)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return buf[pos] != 0, pos + 1

    return enc, dec


def _float(packer: struct.Struct, dtype: DataType) -> Codec:
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


def _bytes(dtype: DataType) -> Codec:
    """STRING, CHAR and VARCHAR as UTF-8, BINARY as is; either after a varint length."""
    text = not isinstance(dtype, BinaryType)

    def enc(v: Any, out: bytearray) -> None:
        if text:
            if not isinstance(v, str):
                raise StateValueError(f"string needs a str, not {v!r}")
            try:
                v = v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise StateValueError(f"string is not valid Unicode: {e}") from None
        elif not isinstance(v, bytes | bytearray | memoryview):
            raise StateValueError(f"binary needs bytes, not {v!r}")
        put_varint(out, len(v))
        out += v

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        n, pos = get_varint(buf, pos)
        end = pos + n
        return str(buf[pos:end], "utf-8") if text else bytes(buf[pos:end]), end

    return enc, dec


def _decimal(dtype: DecimalType) -> Codec:
    """The unscaled integer, as Spark keeps it; a value that would need rounding or more
    than `precision` digits is refused rather than changed."""
    precision, scale = dtype.precision, dtype.scale
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
        put_varint(out, 2 * unscaled - 1 if sign and unscaled else 2 * unscaled)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        z, pos = get_varint(buf, pos)  # zigzag: 2n for n >= 0, 2|n| - 1 for n < 0
        unscaled = -((z + 1) >> 1) if z & 1 else z >> 1
        return Decimal(unscaled).scaleb(-scale, _EXACT), pos

    return enc, dec


@lru_cache(maxsize=65_536)
def _local_minute(
    zone: tuple[str, str], year: int, month: int, day: int, hour: int, minute: int
) -> int:
    return int(time.mktime((year, month, day, hour, minute, 0, 0, 0, -1)))


def _local_seconds(v: dt.datetime) -> int:
    """A naive local datetime's epoch seconds, as PySpark's ``time.mktime`` gives them,
    with mktime called once per wall-clock minute of the process's time zone and cached
    (it costs about 6 µs, and a state value often holds timestamps). Since 1973 every time
    zone's offsets are whole minutes (Liberia dropped its 44:30 in 1972), so the seconds
    within a minute add as they are."""
    if 1973 <= v.year <= 2100:
        return _local_minute(time.tzname, v.year, v.month, v.day, v.hour, v.minute) + v.second
    return int(time.mktime(v.timetuple()))


def _timestamp(dtype: DataType) -> Codec:
    """Microseconds since the epoch. TIMESTAMP: an instant; a naive datetime is local time
    and reads back as a naive local datetime (as PySpark's TimestampType). TIMESTAMP_NTZ:
    wall-clock time, any tzinfo ignored (as PySpark's TimestampNTZType)."""
    local = isinstance(dtype, TimestampType)
    name = dtype.simpleString()

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
                micros = _local_seconds(v) * 1_000_000 + v.microsecond
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


def _interval(dtype: DataType) -> Codec:
    def enc(v: Any, out: bytearray) -> None:
        if not isinstance(v, dt.timedelta):
            raise StateValueError(f"a day-time interval needs a datetime.timedelta, not {v!r}")
        out += _I64.pack(v // _MICRO)

    def dec(buf: bytes, pos: int) -> tuple[Any, int]:
        return dt.timedelta(microseconds=_I64.unpack_from(buf, pos)[0]), pos + 8

    return enc, dec


@dataclass(frozen=True)
class SparkType:
    """One leaf type. `ddl`: the words that name it, before any parameters (intervals have
    none: DDL spells them INTERVAL and units). `codec` builds the encoder and decoder of a
    non-null value of a `DataType` of this class (None: DDL has it, state cannot hold it)."""

    dtype: type[DataType]
    ddl: tuple[str, ...]
    codec: Callable[[Any], Codec] | None


TYPES = (
    SparkType(BooleanType, ("BOOLEAN",), _boolean),
    SparkType(ByteType, ("TINYINT", "BYTE"), partial(_integer, struct.Struct("<b"))),
    SparkType(ShortType, ("SMALLINT", "SHORT"), partial(_integer, struct.Struct("<h"))),
    SparkType(IntegerType, ("INT", "INTEGER"), partial(_integer, _I32)),
    SparkType(LongType, ("BIGINT", "LONG"), partial(_integer, _I64)),
    SparkType(FloatType, ("FLOAT", "REAL"), partial(_float, struct.Struct("<f"))),
    SparkType(DoubleType, ("DOUBLE",), partial(_float, struct.Struct("<d"))),
    SparkType(StringType, ("STRING",), _bytes),  # [COLLATE name]
    SparkType(CharType, ("CHAR", "CHARACTER"), _bytes),  # (length)
    SparkType(VarcharType, ("VARCHAR",), _bytes),  # (length)
    SparkType(BinaryType, ("BINARY",), _bytes),
    SparkType(DecimalType, ("DECIMAL", "DEC", "NUMERIC"), _decimal),  # [(precision[, scale])]
    SparkType(DateType, ("DATE",), _date),
    SparkType(TimestampType, ("TIMESTAMP", "TIMESTAMP_LTZ"), _timestamp),
    SparkType(TimestampNTZType, ("TIMESTAMP_NTZ",), _timestamp),
    SparkType(DayTimeIntervalType, (), _interval),
    SparkType(YearMonthIntervalType, (), partial(_integer, _I32)),  # months
    SparkType(NullType, ("VOID",), None),
)
#: A leaf `DataType`'s class -> its entry.
BY_CLASS: dict[type[DataType], SparkType] = {t.dtype: t for t in TYPES}
#: A DDL type word (upper case) -> the class it names.
BY_DDL: dict[str, type[DataType]] = {word: t.dtype for t in TYPES for word in t.ddl}
