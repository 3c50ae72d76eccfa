"""Many UnsafeRows of one flat schema (fixed-width, string, binary and void fields: most
state keys and values) decoded column by column into Arrow arrays, with numpy over the rows'
bytes instead of a Python call per value: the offline read's fast path.

The rows are joined into one buffer; every row's null words and slots are gathered into
one matrix of 64-bit words (a row's slots lie at the same place from its start), each
fixed-width column is a view of its word, and each string or binary column's bytes are
joined into Arrow's value buffer by the offsets and sizes in its slots. Anything this
path does not take as it is, a row too short, an offset outside its row, a state
encoding version byte that is not 0, a string that is not UTF-8, makes `flat_columns`
answer None: the caller decodes those rows one by one (`unsafe_row.row_decoder`), which
refuses in one line or replaces what is not UTF-8, as it always has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statehold.spark_checkpoints.spark_types import Atomic, Struct

#: The numpy type each fixed-width value is read as from the low bytes of its word.
_NUMPY = {"byte": np.int8, "short": np.int16, "integer": np.int32, "date": np.int32,
          "float": np.float32, "long": np.int64, "timestamp": np.int64,
          "timestamp_ntz": np.int64, "double": np.float64}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_VARIABLE = ("string", "binary")
_MAX_VALUES = (1 << 31) - 1  # an Arrow string or binary array's 32-bit offsets


def is_flat(schema: Struct) -> bool:
    """Whether every field is fixed-width, a string, a binary or void (``dropDuplicates``'
    value), and there is one."""
    return bool(schema.fields) and all(
        isinstance(f.type, Atomic) and (f.type.name in _NUMPY or f.type.name in _VARIABLE
                                        or f.type.name in ("boolean", "void"))
        for f in schema.fields)


@dataclass
class FlatRows:
    """Rows of one flat schema joined, with every row's null words and slots gathered
    into one matrix of 64-bit words (`slots`, a row per line)."""

    joined: bytes
    data: np.ndarray
    #: Where each row starts in `joined` (after its `skip` bytes), and its size from there.
    starts: np.ndarray
    sizes: np.ndarray
    slots: np.ndarray
    words: int
    fixed: int

    @classmethod
    def gather(cls, rows: list[bytes], fields: int, skip: int) -> FlatRows | None:
        """None where a row is too short or (`skip` 1) its version byte is not 0."""
        words = (fields + 63) // 64
        fixed = 8 * (words + fields)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        if not len(rows) or int(lengths.min()) < skip + fixed:
            return None
        joined = b"".join(rows)
        data = np.frombuffer(joined, dtype=np.uint8)
        starts = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        if skip and np.any(data[starts] != 0):
            return None
        starts += skip
        slots = data[starts[:, None] + np.arange(fixed)].view("<u8")
        return cls(joined, data, starts, lengths - skip, slots, words, fixed)

    def nulls(self, i: int) -> np.ndarray:
        return ((self.slots[:, i // 64] >> np.uint64(i % 64)) & np.uint64(1)).astype(bool)

    def word(self, i: int) -> np.ndarray:
        """Field `i`'s 8-byte slot of every row."""
        return self.slots[:, self.words + i]

    def extents(self, i: int, nulls: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """A string or binary field's first byte in `joined` and size, per row (0 for a
        null); None where one lies outside its row."""
        word = self.word(i)
        offsets = (word >> np.uint64(32)).astype(np.int64)
        lengths = (word & np.uint64(0xFFFFFFFF)).astype(np.int64)
        lengths[nulls] = 0
        if np.any(~nulls & ((offsets < self.fixed) | (offsets + lengths > self.sizes))):
            return None
        return self.starts + offsets, lengths


def all_decode(rows: list[bytes], schema: Struct, skip: int) -> bool:
    """Whether every one of `rows` (of a flat schema) decodes with `unsafe_row.row_decoder`
    without a refusal: long enough, a version byte 0 where `skip` is 1, every string and
    binary inside its row. Nothing is built: `verify --deep`'s check of many rows at once
    (False: the rows are decoded one by one, which names the first that is refused)."""
    if not rows:
        return True
    flat = FlatRows.gather(rows, len(schema.fields), skip)
    if flat is None:
        return False
    for i, field in enumerate(schema.fields):
        assert isinstance(field.type, Atomic)
        if field.type.name in _VARIABLE and flat.extents(i, flat.nulls(i)) is None:
            return False
    return True


def flat_columns(rows: list[bytes], schema: Struct, arrow: list[pa.DataType], skip: int
                 ) -> list[pa.Array] | None:
    """The columns of `rows` (each after `skip` bytes, a byte 0 where `skip` is 1) as
    Arrow arrays of the types `arrow`; None where a row must be decoded alone."""
    flat = FlatRows.gather(rows, len(schema.fields), skip)
    if flat is None:
        return None
    columns = []
    for i, field in enumerate(schema.fields):
        assert isinstance(field.type, Atomic)
        name = field.type.name
        nulls = flat.nulls(i)
        word = flat.word(i)
        if name == "void":
            columns.append(pa.nulls(len(rows), arrow[i]))
            continue
        if name in _VARIABLE:
            column = _variable(flat, i, nulls, arrow[i])
            if column is None:
                return None
        elif name == "boolean":
            column = pa.array((word & np.uint64(0xFF)) != 0, mask=nulls)
        else:
            kind = _NUMPY[name]
            width = np.dtype(kind).itemsize
            values = word.astype(_UNSIGNED[width]).view(kind) if width < 8 else word.view(kind)
            column = pa.array(values, mask=nulls)
        if column.type != arrow[i]:
            column = column.view(arrow[i])
        columns.append(column)
    return columns


def _variable(flat: FlatRows, i: int, nulls: np.ndarray, arrow: pa.DataType
              ) -> pa.Array | None:
    """A string or binary column's values joined into one buffer; None where one lies
    outside its row or a string is not UTF-8."""
    extents = flat.extents(i, nulls)
    if extents is None:
        return None
    firsts, lengths = extents
    ends = np.cumsum(lengths)
    if int(ends[-1]) > _MAX_VALUES:
        return None
    # one slice per value: cheaper than a numpy index per byte once values pass a few bytes
    joined = flat.joined
    values = b"".join([joined[f : f + n] for f, n in zip(firsts.tolist(), lengths.tolist(),
                                                          strict=True)])
    arrow_offsets = np.concatenate(([0], ends)).astype(np.int32)
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    column = pa.Array.from_buffers(arrow, len(nulls), [
        validity, pa.py_buffer(arrow_offsets), pa.py_buffer(values)],
        null_count=int(nulls.sum()))
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return column


__all__ = ["FlatRows", "flat_columns", "all_decode", "is_flat"]
