"""Writing the HDFS-backed provider's state files as Spark writes them: the inverse of
`state_files.decompressed` and `state_records.records`.

A ``N.snapshot`` is, before compression, each record as the key's size (big-endian int),
the key's UnsafeRow, the value's size and the value's UnsafeRow, then a key size of -1.
Spark compresses it with the store's codec; statehold writes lz4, the default, as
lz4-java's ``LZ4BlockOutputStream`` does with Spark's settings: blocks of at most 32 KiB
(``spark.io.compression.lz4.blockSize``), each ``LZ4Block``, a token (method and block
size level), the compressed and decompressed lengths and the block's xxHash32 (seed
0x9747b28c, low 28 bits), little-endian, then the block, stored raw when lz4 does not
make it smaller; an empty block ends the stream. Spark's reader checks each checksum.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import lz4.block
import xxhash

_MAGIC = b"LZ4Block"
_HEADER = struct.Struct("<Biii")
_RAW, _LZ4 = 0x10, 0x20
_BLOCK_SIZE = 32 << 10
#: The token's low bits: log2(block size) - 10 (lz4-java's compression level).
_LEVEL = (_BLOCK_SIZE - 1).bit_length() - 10
_SEED = 0x9747B28C
_CHECKSUM_MASK = 0xFFFFFFF
_INT = struct.Struct(">i")


class Lz4BlockWriter:
    """lz4-java's block stream over a binary file; `close` writes the end block (and does
    not close the file)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._buffer = bytearray()
        self.written = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _BLOCK_SIZE:
            self._block(bytes(self._buffer[:_BLOCK_SIZE]))
            del self._buffer[:_BLOCK_SIZE]

    def _block(self, raw: bytes) -> None:
        check = xxhash.xxh32_intdigest(raw, _SEED) & _CHECKSUM_MASK
        packed: bytes = lz4.block.compress(raw, store_size=False)
        if len(packed) >= len(raw):
            method, packed = _RAW, raw
        else:
            method = _LZ4
        self._emit(_MAGIC + _HEADER.pack(method | _LEVEL, len(packed), len(raw), check) + packed)

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self.written += len(data)

    def close(self) -> None:
        if self._buffer:
            self._block(bytes(self._buffer))
            self._buffer.clear()
        self._emit(_MAGIC + _HEADER.pack(_RAW | _LEVEL, 0, 0, 0))


class SnapshotWriter:
    """The records of one HDFS-backed ``N.snapshot``, compressed as they are added."""

    def __init__(self, out: BinaryIO) -> None:
        self._stream = Lz4BlockWriter(out)
        self.records = 0

    def add(self, key: bytes, value: bytes) -> None:
        self._stream.write(_INT.pack(len(key)) + key + _INT.pack(len(value)) + value)
        self.records += 1

    def close(self) -> int:
        """End the records and the stream; the compressed size written."""
        self._stream.write(_INT.pack(-1))
        self._stream.close()
        return self._stream.written
