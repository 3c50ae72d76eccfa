"""An UnsafeRow writer for the tests of the offline state reader: rows of any schema built
by hand, the way Spark's UnsafeRowWriter lays them out (null bitset, 8-byte slots,
variable-length values 8-byte aligned after them, offsets relative to the row or array
that holds them). Written from the layout, not from the decoder, so a test of the
decoder on these rows can fail.
"""

from __future__ import annotations

import decimal
import struct
from typing import Any

from statehold.spark_checkpoints.spark_types import (
    FIXED_WIDTH,
    Array,
    Atomic,
    Decimal,
    Map,
    SparkType,
    Struct,
)

_PACK = {"boolean": "<?", "byte": "<b", "short": "<h", "integer": "<i", "float": "<f",
         "date": "<i", "long": "<q", "double": "<d", "timestamp": "<q", "timestamp_ntz": "<q"}


def _pad(data: bytes) -> bytes:
    return data + b"\x00" * (-len(data) % 8)


def _unscaled(value: decimal.Decimal, t: Decimal) -> int:
    return int(value.scaleb(t.scale, decimal.Context(prec=80)))


def _fixed(value: Any, t: SparkType) -> bytes | None:
    """The bytes of a value kept in its slot or element, or None for a variable one."""
    if isinstance(t, Atomic) and t.name in _PACK:
        return struct.pack(_PACK[t.name], value)
    if isinstance(t, Atomic) and t.name == "void":
        return b""
    if isinstance(t, Decimal) and t.compact:
        return struct.pack("<q", _unscaled(value, t))
    return None


def _variable(value: Any, t: SparkType) -> bytes:
    if isinstance(t, Atomic):
        return value.encode() if t.name == "string" else bytes(value)
    if isinstance(t, Decimal):
        unscaled = _unscaled(value, t)
        length = max(1, (unscaled.bit_length() + 8) // 8)  # Java's BigInteger.toByteArray
        return unscaled.to_bytes(length, "big", signed=True)
    if isinstance(t, Struct):
        return encode_row(tuple(value), t)
    if isinstance(t, Array):
        return encode_array(list(value), t.element)
    assert isinstance(t, Map)
    keys = encode_array([k for k, _v in value], t.key)
    values = encode_array([v for _k, v in value], t.value)
    return struct.pack("<q", len(keys)) + keys + values


def _layout(values: list[Any], types: list[SparkType], width: int, count: bytes) -> bytes:
    n = len(values)
    words = (n + 63) // 64
    nulls = 0
    header = len(count) + 8 * words
    fixed = bytearray(_pad(b"\x00" * (width * n)))
    var = bytearray()
    start = header + len(fixed)
    for i, (value, t) in enumerate(zip(values, types, strict=True)):
        at = width * i
        if value is None:
            nulls |= 1 << i
            continue
        data = _fixed(value, t)
        if data is None:
            payload = _variable(value, t)
            data = struct.pack("<q", (start + len(var)) << 32 | len(payload))
            var += _pad(payload)
        fixed[at : at + len(data)] = data
    return count + nulls.to_bytes(8 * words, "little") + bytes(fixed) + bytes(var)


def encode_row(values: tuple[Any, ...], schema: Struct) -> bytes:
    """The UnsafeRow of `values` (as `decode_row` gives them) in `schema`."""
    types = [f.type for f in schema.fields]
    return _layout(list(values), types, 8, b"")


def encode_array(values: list[Any], element: SparkType) -> bytes:
    """The UnsafeArrayData of `values`."""
    width = FIXED_WIDTH.get(element.name, 8) if isinstance(element, Atomic) else 8
    return _layout(values, [element] * len(values), width, struct.pack("<q", len(values)))
