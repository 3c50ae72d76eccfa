"""Spark's UnsafeRow, decoded without a JVM: the binary row Spark keeps state keys and
values in.

A row of n fields is a null bitset (one bit per field, in little-endian 64-bit words),
then n 8-byte slots, then a variable-length region. A fixed-width value (integers,
floats, boolean, date, timestamps, a decimal of at most 18 digits as its unscaled long)
sits in its slot, little-endian from the slot's first byte. Any other value's slot holds
``offset << 32 | size``, the offset relative to the row's start: a string's UTF-8, a
binary's bytes, a larger decimal's unscaled two's-complement big-endian bytes, a nested
struct (an UnsafeRow itself), an array or a map.

An array (UnsafeArrayData) is its element count (8 bytes), a null bitset, the elements at
their type's width (1, 2, 4 or 8 bytes; 8 for offset-and-size, relative to the array's
start) padded to 8 bytes, then its variable-length region. A map (UnsafeMapData) is the
byte size of its key array (8 bytes), the key array, then the value array.

Every offset and size is checked against the region it must lie in before anything is
read or allocated, so a damaged or crafted row is refused (`SparkCheckpointError`, one
line) and never makes the decoder allocate more than the row's own size.
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable
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

#: Each fixed-width type's 8-byte slot layout (little-endian), shared with the writer.
SLOT_FORMATS = {
    "boolean": struct.Struct("<?"), "byte": struct.Struct("<b"), "short": struct.Struct("<h"),
    "integer": struct.Struct("<i"), "float": struct.Struct("<f"), "date": struct.Struct("<i"),
    "long": struct.Struct("<q"), "double": struct.Struct("<d"),
    "timestamp": struct.Struct("<q"), "timestamp_ntz": struct.Struct("<q"),
}
LONG = struct.Struct("<q")
WIDE_DECIMALS = decimal.Context(prec=80)


class BadRow(SparkCheckpointError):
    """An UnsafeRow (or a value in it) that does not fit its schema or its bytes."""


def decode_row(data: bytes, schema: Struct, where: str) -> tuple[Any, ...]:
    """The values of the UnsafeRow `data` of `schema`, in field order: ints, floats, bools,
    str, bytes, `decimal.Decimal`, dates as days and timestamps as microseconds since
    the epoch, structs as tuples, arrays as lists, maps as lists of (key, value), None
    for null. BadRow names `where` and what is wrong."""
    return _struct(data, 0, len(data), schema, where)


def row_decoder(schema: Struct, where: str, start: int = 0
                ) -> Callable[[bytes], tuple[Any, ...]]:
    """`decode_row` for one schema and place, of the row from byte `start` of the data
    (RocksDB's rows follow a version byte: no copy to skip it); a flat schema's
    (fixed-width, string and binary fields: most keys and values) reads its null words
    and every slot in one unpack, the same values and refusals at several times the
    speed."""
    flat = _flat_decoder(schema, where, start)
    if flat is not None:
        return flat
    return lambda data: _struct(data, start, len(data) - start, schema, where)


def versioned_row_decoder(schema: Struct, where: str) -> Callable[[bytes], tuple[Any, ...]]:
    """`row_decoder` of a RocksDB row: Spark's state encoding version byte (00), checked,
    then the row."""
    decode = row_decoder(schema, where, 1)

    def versioned(data: bytes) -> tuple[Any, ...]:
        if data[:1] != b"\x00":
            raise SparkCheckpointError(
                f"{where}: state encoding version {data[:1].hex() or 'missing'}, not 00")
        return decode(data)

    return versioned


#: A fixed-width value's unpack format within its 8-byte slot.
_SLOT_UNPACK = {"boolean": "?7x", "byte": "b7x", "short": "h6x", "integer": "i4x",
                "float": "f4x", "date": "i4x", "long": "q", "double": "d",
                "timestamp": "q", "timestamp_ntz": "q"}


def _flat_decoder(schema: Struct, where: str, start: int
                  ) -> Callable[[bytes], tuple[Any, ...]] | None:
    """The decoder of a schema whose fields are all fixed-width, string or binary; None
    for any other (nested, decimal, void: `_struct` decodes those)."""
    names = [f.type.name for f in schema.fields if isinstance(f.type, Atomic)
             and (f.type.name in _SLOT_UNPACK or f.type.name in ("string", "binary"))]
    if not names or len(names) != len(schema.fields):
        return None
    n = len(names)
    words = (n + 63) // 64
    fixed = 8 * (words + n)
    layout = struct.Struct("<" + "Q" * words + "".join(_SLOT_UNPACK.get(t, "q") for t in names))
    strings = [i for i, t in enumerate(names) if t == "string"]
    binaries = [i for i, t in enumerate(names) if t == "binary"]
    variable = sorted(strings + binaries)
    text = set(strings)

    def decode(data: bytes) -> tuple[Any, ...]:
        size = len(data) - start
        if size < fixed:
            raise BadRow(f"{where}: a row of {n} fields needs {fixed} bytes, it has {size}")
        unpacked = layout.unpack_from(data, start)
        nulls = unpacked[0] if words == 1 else int.from_bytes(
            data[start : start + 8 * words], "little")
        values = list(unpacked[words:])
        for i in variable:
            if (nulls >> i) & 1:
                continue
            pointer = values[i]
            offset, length = (pointer >> 32) & 0xFFFFFFFF, pointer & 0xFFFFFFFF
            if offset < fixed or offset + length > size:
                raise BadRow(
                    f"{where}: a value at offset {offset}, {length} bytes, lies outside its "
                    f"{size}-byte region (variable part from {fixed})")
            raw = data[start + offset : start + offset + length]
            values[i] = raw.decode("utf-8", "replace") if i in text else raw
        if nulls:
            for i in range(n):
                if (nulls >> i) & 1:
                    values[i] = None
        return tuple(values)

    return decode


def _bits(data: bytes, start: int, words: int) -> int:
    return int.from_bytes(data[start : start + 8 * words], "little")


def _struct(data: bytes, start: int, size: int, schema: Struct, where: str) -> tuple[Any, ...]:
    n = len(schema.fields)
    words = (n + 63) // 64
    fixed = 8 * (words + n)
    if size < fixed:
        raise BadRow(f"{where}: a row of {n} fields needs {fixed} bytes, it has {size}")
    nulls = _bits(data, start, words)
    slots = start + 8 * words
    return tuple(
        None if (nulls >> i) & 1 else
        _value(data, start, size, fixed, slots + 8 * i, f.type, where)
        for i, f in enumerate(schema.fields)
    )


def _value(data: bytes, base: int, size: int, fixed: int, at: int, t: SparkType,
           where: str) -> Any:
    """The value of type `t` whose slot (or element) is at `at`, in the region
    [`base`, `base` + `size`) whose variable-length part starts `fixed` bytes in."""
    if isinstance(t, Atomic):
        fmt = SLOT_FORMATS.get(t.name)
        if fmt is not None:
            return fmt.unpack_from(data, at)[0]
        if t.name == "void":
            return None
    elif isinstance(t, Decimal) and t.compact:
        return _decimal(LONG.unpack_from(data, at)[0], t, where)
    (pointer,) = LONG.unpack_from(data, at)
    offset, length = (pointer >> 32) & 0xFFFFFFFF, pointer & 0xFFFFFFFF
    if offset < fixed or offset + length > size:
        raise BadRow(
            f"{where}: a value at offset {offset}, {length} bytes, lies outside its "
            f"{size}-byte region (variable part from {fixed})")
    start = base + offset
    if isinstance(t, Atomic):
        raw = data[start : start + length]
        return raw.decode("utf-8", "replace") if t.name == "string" else raw
    if isinstance(t, Decimal):
        if not 0 < length <= 17:
            raise BadRow(f"{where}: a decimal({t.precision}) of {length} bytes")
        return _decimal(int.from_bytes(data[start : start + length], "big", signed=True),
                        t, where)
    if isinstance(t, Struct):
        return _struct(data, start, length, t, where)
    if isinstance(t, Array):
        return _array(data, start, length, t.element, where)
    return _map(data, start, length, t, where)


def _decimal(unscaled: int, t: Decimal, where: str) -> decimal.Decimal:
    if abs(unscaled) >= 10**t.precision:
        raise BadRow(f"{where}: {unscaled} has more than the {t.precision} digits of its "
                     "decimal")
    return decimal.Decimal(unscaled).scaleb(-t.scale, WIDE_DECIMALS)


def _width(t: SparkType) -> int:
    if isinstance(t, Atomic):
        return FIXED_WIDTH.get(t.name, 8)
    return 8


def _array(data: bytes, start: int, size: int, element: SparkType, where: str) -> list[Any]:
    if size < 8:
        raise BadRow(f"{where}: an array of {size} bytes has no element count")
    (n,) = LONG.unpack_from(data, start)
    width = _width(element)
    # an element takes at least `width` bytes (plus a bit): a count the region cannot
    # hold is refused before anything is built for it
    if n < 0 or n * width > size:
        raise BadRow(f"{where}: an array of {size} bytes claims {n} elements")
    words = (n + 63) // 64
    header = 8 + 8 * words
    fixed = header + (n * width + 7) // 8 * 8
    if fixed > size:
        raise BadRow(f"{where}: an array of {n} elements needs {fixed} bytes, it has {size}")
    nulls = _bits(data, start + 8, words)
    first = start + header
    return [
        None if (nulls >> i) & 1 else
        _value(data, start, size, fixed, first + width * i, element, where)
        for i in range(n)
    ]


def _map(data: bytes, start: int, size: int, t: Map, where: str) -> list[tuple[Any, Any]]:
    if size < 8:
        raise BadRow(f"{where}: a map of {size} bytes has no key array size")
    (keys_size,) = LONG.unpack_from(data, start)
    if not 0 <= keys_size <= size - 8:
        raise BadRow(f"{where}: a map of {size} bytes claims a {keys_size}-byte key array")
    keys = _array(data, start + 8, keys_size, t.key, where)
    values = _array(data, start + 8 + keys_size, size - 8 - keys_size, t.value, where)
    if len(keys) != len(values):
        raise BadRow(f"{where}: a map of {len(keys)} keys and {len(values)} values")
    return list(zip(keys, values, strict=True))
