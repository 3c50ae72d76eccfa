"""The partition Spark's HashPartitioning sends each of many keys to, computed for a
whole batch of flat key rows at once: `spark_hash`'s Murmur3 (seed 42, each column
hashed with the hash so far as its seed, a null leaving it as it was) in numpy's 32-bit
arithmetic over the rows' slots (`columnar_rows.FlatRows`), instead of a Python call per
value. A string or binary is hashed from its stored bytes, a word at a time in lockstep
over the batch (the rows whose value is shorter keep their hash), then its tail a signed
byte at a time, as Spark's ``hashUnsafeBytes`` does. Types it does not take (decimals,
nested ones) make it answer None: the caller hashes those keys one by one.
"""

from __future__ import annotations

import numpy as np

from statehold.spark_checkpoints.columnar_rows import FlatRows
from statehold.spark_checkpoints.spark_hash import SEED
from statehold.spark_checkpoints.spark_types import Atomic, Struct

_U32 = np.uint32
_C1, _C2 = _U32(0xCC9E2D51), _U32(0x1B873593)
_INTS = {"boolean": np.uint8, "byte": np.int8, "short": np.int16, "integer": np.int32,
         "date": np.int32}
_LONGS = {"long", "timestamp", "timestamp_ntz"}
_HASHED = {*_INTS, *_LONGS, "float", "double", "string", "binary", "void"}
#: A longer string or binary key is hashed one by one (the batch's byte matrix is its
#: rows times its longest value).
_LONGEST = 4096


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _U32(5) + _U32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | np.uint32) -> np.ndarray:
    h1 = h1 ^ length
    h1 ^= h1 >> _U32(16)
    h1 *= _U32(0x85EBCA6B)
    h1 ^= h1 >> _U32(13)
    h1 *= _U32(0xC2B2AE35)
    out: np.ndarray = h1 ^ (h1 >> _U32(16))
    return out


def _hash_int(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(value)), _U32(4))


def _hash_long(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    low = (value & np.uint64(0xFFFFFFFF)).astype(_U32)
    high = (value >> np.uint64(32)).astype(_U32)
    return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), _U32(8))


def _hash_bytes(flat: FlatRows, firsts: np.ndarray, lengths: np.ndarray, seed: np.ndarray
                ) -> np.ndarray:
    longest = int(lengths.max())
    if longest == 0:
        return _fmix(seed, lengths.astype(_U32))
    width = (longest + 3) // 4 * 4
    index = np.minimum(firsts[:, None] + np.arange(width), len(flat.data) - 1)
    matrix = np.ascontiguousarray(flat.data[index])
    words = matrix.view("<u4")
    h1 = seed.copy()
    whole = lengths // 4
    for w in range(longest // 4):
        mixed = _mix_h1(h1, _mix_k1(words[:, w]))
        h1 = np.where(whole > w, mixed, h1)
    rows = np.arange(len(lengths))
    for t in range(3):
        active = lengths % 4 > t
        at = np.minimum(whole * 4 + t, width - 1)
        signed = matrix[rows, at].view(np.int8).astype(np.int32).view(_U32)
        h1 = np.where(active, _mix_h1(h1, _mix_k1(signed)), h1)
    return _fmix(h1, lengths.astype(_U32))


def partitions_of(rows: list[bytes], schema: Struct, columns: tuple[int, ...], partitions: int,
                  skip: int) -> np.ndarray | None:
    """The partition of each row (a key of `schema`, after `skip` bytes) hashed on
    `columns`, as Spark's ``pmod(hash(columns), partitions)``; None where a column's type
    is not one hashed here, or a row must be decoded alone."""
    types = [schema.fields[i].type for i in columns]
    if not all(isinstance(t, Atomic) and t.name in _HASHED for t in types):
        return None
    flat = FlatRows.gather(rows, len(schema.fields), skip)
    if flat is None:
        return None
    h = np.full(len(rows), SEED, dtype=_U32)
    with np.errstate(over="ignore"):
        for i, t in zip(columns, types, strict=True):
            assert isinstance(t, Atomic)
            name = t.name
            if name == "void":
                continue
            nulls = flat.nulls(i)
            word = flat.word(i)
            if name in _INTS:
                kind = _INTS[name]
                width = np.dtype(kind).itemsize
                narrow = word.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[width])
                value = narrow.view(kind).astype(np.int32).view(_U32)
                if name == "boolean":
                    value = (narrow != 0).astype(_U32)
                hashed = _hash_int(value, h)
            elif name in _LONGS:
                hashed = _hash_long(word, h)
            elif name == "float":
                bits = word.astype(_U32)
                number = bits.view(np.float32)
                bits = np.where(number == 0, _U32(0), bits)
                bits = np.where(np.isnan(number), _U32(0x7FC00000), bits)
                hashed = _hash_int(bits, h)
            elif name == "double":
                number = word.view(np.float64)
                bits = np.where(number == 0, np.uint64(0), word)
                bits = np.where(np.isnan(number), np.uint64(0x7FF8000000000000), bits)
                hashed = _hash_long(bits, h)
            else:
                extents = flat.extents(i, nulls)
                if extents is None or int(extents[1].max()) > _LONGEST:
                    return None
                hashed = _hash_bytes(flat, extents[0], extents[1], h)
            h = np.where(nulls, h, hashed)
    signed = h.view(np.int32).astype(np.int64)
    result: np.ndarray = signed % partitions
    return result


__all__ = ["partitions_of"]
