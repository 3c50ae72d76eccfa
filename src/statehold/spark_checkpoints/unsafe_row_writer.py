"""Spark's UnsafeRow, written without a JVM: the exact inverse of `unsafe_row.decode_row`,
byte for byte what Spark's UnsafeProjection writes for the same values (the HDFS-backed
provider keys its map by a row's bytes, so a key written here must equal the one the
query computes to be found again).

The layout is the decoder's (see `unsafe_row`); what only a writer must know:

- every slot, element and padding byte not written is zero (a null's slot too);
- a variable-length value is padded with zeros to 8 bytes, its slot holding its unpadded
  size;
- a null decimal of more than 18 digits in a row (not in an array) still reserves its 16
  bytes, its slot holding their offset and size 0: Spark updates such a decimal in place;
  a non-null one takes those 16 bytes too, whatever its length;
- a nested struct, array or map is written where the parent's variable region goes on,
  its offsets relative to its own start; a map is its key array's byte size, the key
  array, then the value array.
"""

from __future__ import annotations

import decimal
import struct
from typing import Any

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import (
    FIXED_WIDTH,
    Array,
    Atomic,
    Decimal,
    Map,
    SparkType,
    Struct,
)
from statehold.spark_checkpoints.unsafe_row import LONG, SLOT_FORMATS, WIDE_DECIMALS

#: The bytes a row reserves for a decimal of more than 18 digits (Spark's, 38 digits at
#: most, fit 16).
_BIG_DECIMAL_BYTES = 16


class UnencodableValue(SparkCheckpointError):
    """A value that does not fit its Spark type (a row of the wrong width, a decimal with
    too many digits, an integer out of range)."""


def encode_row(values: tuple[Any, ...] | list[Any], schema: Struct, where: str = "a row"
               ) -> bytes:
    """The UnsafeRow of `values` (as `decode_row` returns them: str, bytes, ints, floats,
    bools, `decimal.Decimal`, days, microseconds, tuples, lists, lists of pairs, None)."""
    out = bytearray()
    _row(out, values, schema, where)
    return bytes(out)


def _pad(n: int) -> int:
    return (n + 7) // 8 * 8


def _row(out: bytearray, values: Any, schema: Struct, where: str) -> None:
    fields = schema.fields
    if len(values) != len(fields):
        raise UnencodableValue(f"{where}: {len(values)} values for {len(fields)} fields")
    start = len(out)
    words = (len(fields) + 63) // 64
    out += bytes(8 * (words + len(fields)))
    nulls = 0
    for i, (value, f) in enumerate(zip(values, fields, strict=True)):
        slot = start + 8 * (words + i)
        t = f.type
        if value is None:
            nulls |= 1 << i
            if isinstance(t, Decimal) and not t.compact:
                LONG.pack_into(out, slot, (len(out) - start) << 32)
                out += bytes(_BIG_DECIMAL_BYTES)
            continue
        try:
            fixed = _fixed(value, t)
        except (struct.error, TypeError, OverflowError) as e:
            raise UnencodableValue(f"{where}: field {f.name!r} ({e})") from None
        if fixed is not None:
            out[slot : slot + len(fixed)] = fixed
            continue
        at = len(out)
        if isinstance(t, Decimal):
            data = _decimal_bytes(value, t, where)
            out += data + bytes(_BIG_DECIMAL_BYTES - len(data))
            size = len(data)
        else:
            size = _variable(out, value, t, f"{where}.{f.name}")
        LONG.pack_into(out, slot, (at - start) << 32 | size)
    out[start : start + 8 * words] = nulls.to_bytes(8 * words, "little")


def _unscaled(value: Any, t: Decimal, where: str) -> int:
    try:
        unscaled = int(decimal.Decimal(value).scaleb(t.scale, WIDE_DECIMALS).to_integral_exact(
            context=WIDE_DECIMALS))
    except (decimal.InvalidOperation, TypeError, ValueError) as e:
        raise UnencodableValue(f"{where}: {value!r} is not a decimal ({e})") from None
    if abs(unscaled) >= 10**t.precision:
        raise UnencodableValue(f"{where}: {value} has more than {t.precision} digits")
    return unscaled


def _decimal_bytes(value: Any, t: Decimal, where: str) -> bytes:
    n = _unscaled(value, t, where)
    return n.to_bytes((n if n >= 0 else ~n).bit_length() // 8 + 1, "big", signed=True)


def _fixed(value: Any, t: SparkType) -> bytes | None:
    """A value kept in its slot or element (its bytes), or None for a variable one."""
    if isinstance(t, Atomic):
        fmt = SLOT_FORMATS.get(t.name)
        if fmt is not None:
            return fmt.pack(value)
        if t.name == "void":
            return b""
    elif isinstance(t, Decimal) and t.compact:
        return LONG.pack(_unscaled(value, t, "a decimal"))
    return None


def _variable(out: bytearray, value: Any, t: SparkType, where: str) -> int:
    """Append a variable-length value at the end of `out` (padded to 8 bytes); its size
    without the padding."""
    start = len(out)
    if isinstance(t, Atomic):
        if t.name == "string":
            if not isinstance(value, str):
                raise UnencodableValue(f"{where}: {type(value).__name__} for a string")
            data = value.encode("utf-8", "surrogatepass")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        else:
            raise UnencodableValue(f"{where}: {type(value).__name__} for a {t.name}")
        out += data + bytes(_pad(len(data)) - len(data))
        return len(data)
    if isinstance(t, Struct):
        _row(out, value, t, where)
    elif isinstance(t, Array):
        _array(out, list(value), t.element, where)
    elif isinstance(t, Map):
        entries = list(value)
        out += bytes(8)
        _array(out, [k for k, _v in entries], t.key, where)
        LONG.pack_into(out, start, len(out) - start - 8)
        _array(out, [v for _k, v in entries], t.value, where)
    else:
        raise UnencodableValue(f"{where}: no layout for {t}")
    return len(out) - start


def _array(out: bytearray, values: list[Any], element: SparkType, where: str) -> None:
    n = len(values)
    width = FIXED_WIDTH.get(element.name, 8) if isinstance(element, Atomic) else 8
    start = len(out)
    words = (n + 63) // 64
    header = 8 + 8 * words
    out += LONG.pack(n) + bytes(8 * words + _pad(n * width))
    nulls = 0
    for i, value in enumerate(values):
        at = start + header + width * i
        if value is None:
            nulls |= 1 << i
            continue
        try:
            fixed = _fixed(value, element)
        except (struct.error, TypeError, OverflowError) as e:
            raise UnencodableValue(f"{where}[{i}] ({e})") from None
        if fixed is not None:
            out[at : at + len(fixed)] = fixed
            continue
        offset = len(out)
        if isinstance(element, Decimal):
            data = _decimal_bytes(value, element, where)
            out += data + bytes(_pad(len(data)) - len(data))
            size = len(data)
        else:
            size = _variable(out, value, element, f"{where}[{i}]")
        LONG.pack_into(out, at, (offset - start) << 32 | size)
    out[start + 8 : start + header] = nulls.to_bytes(8 * words, "little")
