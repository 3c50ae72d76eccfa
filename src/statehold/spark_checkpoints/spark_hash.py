"""Spark SQL's ``hash`` (Murmur3Hash, seed 42) of typed values, and the partition Spark's
HashPartitioning sends a row to: ``pmod(hash(columns), partitions)``. Repartitioning a
checkpoint's state puts every key where the restarted query's shuffle will send its rows.

Per type, as Spark's interpreted hash computes it: boolean, byte, short, integer and date
hash as a 4-byte int (true is 1); long, timestamp and timestamp_ntz as an 8-byte long;
a float as its IEEE bits (``floatToIntBits``: every NaN is one NaN, and -0.0 hashes as 0),
a double likewise as a long; a string by its UTF-8 bytes and a binary by its bytes (the
tail after the last 4-byte word mixed in a signed byte at a time: Spark's own variant of
Murmur3); a decimal of at most 18 digits as its unscaled long, a larger one by the bytes
of Java's ``BigInteger.toByteArray`` of its unscaled value; a struct, an array and a map
(key then value, entry by entry) by their elements in order, each hashed with the hash so
far as its seed. A null leaves the hash as it was. Strings with a collation other than
UTF8_BINARY hash their collation key: refused by the schema parser before this.
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Sequence
from typing import Any

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.spark_types import Array, Atomic, Decimal, SparkType, Struct

#: The seed Spark's HashPartitioning gives Murmur3Hash.
SEED = 42
_MASK = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_INT_TYPES = {"boolean", "byte", "short", "integer", "date"}
_LONG_TYPES = {"long", "timestamp", "timestamp_ntz"}
_WIDE = decimal.Context(prec=80)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 & _MASK) * _C1 & _MASK
    return _rotl(k1, 15) * _C2 & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    return (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    return h1 ^ (h1 >> 16)


def hash_int(value: int, seed: int) -> int:
    """Murmur3_x86_32.hashInt, unsigned 32 bits in and out."""
    return _fmix(_mix_h1(seed, _mix_k1(value)), 4)


def hash_long(value: int, seed: int) -> int:
    """Murmur3_x86_32.hashLong: the low word, then the high word."""
    h1 = _mix_h1(seed, _mix_k1(value & _MASK))
    h1 = _mix_h1(h1, _mix_k1((value >> 32) & _MASK))
    return _fmix(h1, 8)


def hash_bytes(data: bytes, seed: int) -> int:
    """Murmur3_x86_32.hashUnsafeBytes: little-endian 4-byte words, then each remaining
    byte as a signed int of its own."""
    aligned = len(data) - len(data) % 4
    h1 = seed
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for byte in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1(byte - 256 if byte > 127 else byte))
    return _fmix(h1, len(data))


def _java_bytes(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the shortest big-endian two's complement."""
    length = (n if n >= 0 else ~n).bit_length() // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def hash_value(value: Any, t: SparkType, seed: int) -> int:
    """The hash of `value` (as `unsafe_row.decode_row` gives it) of type `t`, from `seed`
    (unsigned 32 bits)."""
    if value is None:
        return seed
    if isinstance(t, Atomic):
        name = t.name
        if name in _INT_TYPES:
            return hash_int(int(value), seed)
        if name in _LONG_TYPES:
            return hash_long(value, seed)
        if name == "float":
            bits = 0 if value == 0.0 else struct.unpack("<I", struct.pack("<f", value))[0]
            if value != value:  # NaN: Java's canonical one
                bits = 0x7FC00000
            return hash_int(bits, seed)
        if name == "double":
            bits = 0 if value == 0.0 else struct.unpack("<Q", struct.pack("<d", value))[0]
            if value != value:
                bits = 0x7FF8000000000000
            return hash_long(bits, seed)
        if name == "string":
            return hash_bytes(value.encode("utf-8", "surrogatepass"), seed)
        if name == "binary":
            return hash_bytes(bytes(value), seed)
        if name == "void":
            return seed
    elif isinstance(t, Decimal):
        unscaled = int(decimal.Decimal(value).scaleb(t.scale, _WIDE))
        if t.compact:
            return hash_long(unscaled, seed)
        return hash_bytes(_java_bytes(unscaled), seed)
    elif isinstance(t, Struct):
        return hash_row(value, [f.type for f in t.fields], seed)
    elif isinstance(t, Array):
        for element in value:
            seed = hash_value(element, t.element, seed)
        return seed
    else:  # Map: key, value, entry by entry
        for k, v in value:
            seed = hash_value(v, t.value, hash_value(k, t.key, seed))
        return seed
    raise SparkCheckpointError(f"no Spark hash for type {t}")


def hash_row(values: Sequence[Any], types: Sequence[SparkType], seed: int = SEED) -> int:
    """Murmur3Hash of several columns: each hashed with the previous one's hash as seed."""
    for value, t in zip(values, types, strict=True):
        seed = hash_value(value, t, seed)
    return seed


def spark_hash(values: Sequence[Any], types: Sequence[SparkType]) -> int:
    """What Spark SQL's ``hash(col, ...)`` returns: a signed 32-bit int."""
    h = hash_row(values, types)
    return h - (1 << 32) if h & 0x80000000 else h


def partition_of(values: Sequence[Any], types: Sequence[SparkType], partitions: int) -> int:
    """The partition HashPartitioning(columns, `partitions`) sends a row to."""
    return spark_hash(values, types) % partitions  # Python's % is Spark's pmod here
