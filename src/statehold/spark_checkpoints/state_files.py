"""Reading Spark's state files far enough to prove them whole: a RocksDB snapshot zip and
the SST and log files it lists; a changelog's, delta's or HDFS snapshot's compressed
stream and, for checkpoint format v2, the lineage a changelog names.

Spark compresses changelogs, deltas and HDFS snapshots with the store's codec (lz4 by
default: lz4-java's block stream, ``LZ4Block`` + a header per block, and an empty block
that ends it). A stream is whole when every block decompresses to the size its header
says and the end block is there; a file cut short has no end block. Other codecs are
reported as not checked. `decompressed` hands the blocks to the offline reader
(`state_records`), which interprets the records.
"""

from __future__ import annotations

import io
import mmap
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lz4.block
import xxhash
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from statehold.format.signed import load_json
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.logs import split_versioned
from statehold.storage.base import UnsafePathError, check_names

#: The newest version of a snapshot zip's ``metadata`` statehold reads.
ZIP_METADATA_VERSION = 2
#: The largest file list statehold reads from a snapshot zip (Spark's lists a few hundred
#: bytes per SST file): a bound on what a crafted zip can make it inflate.
ZIP_METADATA_MAX_BYTES = 64 << 20
#: What Python's zipfile raises on a damaged archive, besides BadZipFile: a header
#: pointing before the start (ValueError), a member that is missing (KeyError), encrypted
#: (RuntimeError), of a method it cannot read (NotImplementedError), or that does not
#: inflate (zlib.error, EOFError).
_NOT_A_ZIP = (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError, EOFError,
              OSError, RuntimeError, NotImplementedError, zlib.error, struct.error)
_MAGIC = b"LZ4Block"
_HEADER = struct.Struct("<Biii")  # token, compressed length, decompressed length, checksum
_RAW, _LZ4 = 0x10, 0x20
#: lz4-java's block checksum: XXH32 with this seed, masked to 28 bits (its `Checksum` view).
_XXH32_SEED = 0x9747B28C
_CHECKSUM_BITS = 0xFFFFFFF
#: A block's token says its stream's block size: 2 ** (_LEVEL_BASE + its low 4 bits), at
#: most 32 MiB (lz4-java's `LZ4BlockOutputStream`).
_LEVEL_BASE = 10
#: Bytes of a local file mapped at once (`mapped`): a multiple of any page size.
_WINDOW = 8 << 20
#: The records of a stream end with a key length of -1; those of the typed changelogs
#: (v2, v4: with column families) with a record type of 0.
_END_OF_RECORDS = b"\xff\xff\xff\xff"


class SstFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    localFileName: str = ""  # noqa: N815 - Spark's field names
    dfsSstFileName: str  # noqa: N815
    sizeBytes: int  # noqa: N815


class LogFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    localFileName: str = ""  # noqa: N815
    dfsLogFileName: str  # noqa: N815
    sizeBytes: int  # noqa: N815


class ZipMetadata(BaseModel):
    """The ``metadata`` member of a RocksDB snapshot zip: the SST and log files the
    version needs, stored once under the store's ``SSTs/`` and ``logs/`` and shared
    between versions."""

    model_config = ConfigDict(extra="allow")

    sstFiles: list[SstFile] = Field(default_factory=list)  # noqa: N815
    logFiles: list[LogFile] = Field(default_factory=list)  # noqa: N815
    numKeys: int | None = None  # noqa: N815

    def files(self) -> dict[str, int]:
        """Each listed file's name relative to the store directory, and its size."""
        sst = {f"SSTs/{f.dfsSstFileName}": f.sizeBytes for f in self.sstFiles}
        logs = {f"logs/{f.dfsLogFileName}": f.sizeBytes for f in self.logFiles}
        return sst | logs


def read_zip_metadata(data: bytes, key: str) -> ZipMetadata:
    """A snapshot zip's file list, after checking every member's CRC. Names with a
    directory, ``..`` or an absolute path are refused: Spark writes plain names only."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
            if bad is not None:
                raise SparkCheckpointError(f"{key}: member {bad!r} fails its CRC")
            if archive.getinfo("metadata").file_size > ZIP_METADATA_MAX_BYTES:
                raise SparkCheckpointError(
                    f"{key}: its metadata member is over {ZIP_METADATA_MAX_BYTES} bytes")
            text = archive.read("metadata").decode("utf-8")
    except _NOT_A_ZIP as e:
        raise SparkCheckpointError(
            f"{key}: not a whole snapshot zip ({_one_line(e) or type(e).__name__})") from None
    _version, lines = split_versioned(text, f"{key}!metadata", ZIP_METADATA_VERSION)
    doc = load_json("\n".join(lines).encode("utf-8", "surrogatepass"), where=f"{key}!metadata",
                    error=SparkCheckpointError, max_bytes=ZIP_METADATA_MAX_BYTES)
    try:
        meta = ZipMetadata.model_validate(doc)
    except (ValueError, ValidationError) as e:
        raise SparkCheckpointError(f"{key}!metadata: bad file list ({_one_line(e)})") from None
    try:
        check_names([f.dfsSstFileName for f in meta.sstFiles])
        check_names([f.dfsLogFileName for f in meta.logFiles])
    except UnsafePathError as e:
        raise SparkCheckpointError(f"{key}!metadata: unsafe file name ({e})") from None
    if any(size < 0 for size in meta.files().values()):
        raise SparkCheckpointError(f"{key}!metadata: a negative file size")
    return meta


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """What a compressed stream held: its decompressed size and first bytes."""

    size: int
    head: bytes


def check_stream(chunks: Iterator[bytes | memoryview], key: str, codec: str = "lz4"
                 ) -> StreamCheck | None:
    """Decompress a state file's stream block by block (memory: one block), proving it
    whole; None for a codec statehold does not check."""
    if codec != "lz4":
        return None
    reader = _Blocks(chunks, key)
    size, head, tail = 0, b"", b""
    while (block := reader.next_block()) is not None:
        size += len(block)
        if len(head) < 65_536:
            head += block[: 65_536 - len(head)]
        tail = (tail + block)[-4:]
    header = _utf(head, 0)
    typed = header is not None and header[0] in ("v2", "v4")
    ends = tail.endswith(b"\x00") if typed else tail == _END_OF_RECORDS
    if size and not ends:
        raise SparkCheckpointError(f"{key}: the records do not end (truncated?)")
    return StreamCheck(size, head)


def decompressed(chunks: Iterator[bytes | memoryview], key: str, *, checksums: bool = False
                 ) -> Iterator[bytes]:
    """An lz4 state file's stream, block by block (memory: one block); refused
    (SparkCheckpointError) where it is damaged or ends early. `checksums`: each block's
    checksum is verified as lz4-java's reader does when Spark loads it (`verify --deep`)."""
    reader = _Blocks(chunks, key, checksums)
    while (block := reader.next_block()) is not None:
        yield block


def mapped(path: Path) -> Iterator[memoryview]:
    """A local file's bytes, a window of it mapped at a time: read where they lie in the
    page cache, not copied out by a read (on a machine whose memory is slow to copy, a
    read of a GiB costs about half a second of CPU). A window is unmapped once no view
    of it is left. For files nothing truncates while they are read (Spark never writes
    a file in place; statehold reads its own copies, links or new files): a file cut
    under a mapping would end the process."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, _WINDOW):
            window = mmap.mmap(f.fileno(), min(_WINDOW, size - offset), offset=offset,
                               access=mmap.ACCESS_READ)
            yield memoryview(window)
            del window  # the caller's view, once let go, unmaps it


def lineage(head: bytes, key: str) -> list[tuple[int, str]] | None:
    """The lineage a format-v2 changelog starts with, (version, unique id) from its base
    snapshot on; None for a changelog without one."""
    text = _utf(head, 0)
    if text is None or text[0] not in ("v3", "v4"):
        return None
    body = _utf(head, text[1])
    if body is None:
        raise SparkCheckpointError(f"{key}: the lineage header is cut short")
    entries = load_json(body[0].encode("utf-8", "surrogatepass"), where=f"{key} (lineage)",
                        error=SparkCheckpointError)
    try:
        return [(int(e["version"]), str(e["checkpointUniqueId"])) for e in entries]
    except (ValueError, KeyError, TypeError) as e:
        raise SparkCheckpointError(f"{key}: bad lineage ({e})") from None


def _utf(data: bytes, at: int) -> tuple[str, int] | None:
    """Java's writeUTF at `at`: the string and the offset after it."""
    if len(data) < at + 2:
        return None
    (length,) = struct.unpack_from(">H", data, at)
    end = at + 2 + length
    if len(data) < end:
        return None
    try:
        return data[at + 2 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        return None


class _Blocks:
    """lz4-java's block stream, read from chunks of any size. A chunk may be a view of a
    buffer its iterator reuses: it is read in place (a block's header and body are not
    copied out) and let go before the next chunk is asked for, so only a block split
    between two chunks is copied, joined."""

    def __init__(self, chunks: Iterator[bytes | memoryview], key: str,
                 checksums: bool = False) -> None:
        self._chunks = chunks
        self._view = memoryview(b"")
        self._at = 0
        self._key = key
        self._checksums = checksums

    def _take(self, n: int) -> memoryview | bytes | None:
        """The next `n` bytes: in place where the current chunk holds them, else joined."""
        at, view = self._at, self._view
        if len(view) - at >= n:
            self._at = at + n
            return view[at : at + n]
        joined = bytearray(view[at:])
        while len(joined) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._view, self._at = memoryview(b""), 0
                return None
            used = min(len(chunk), n - len(joined))
            joined += chunk[:used]
            self._view, self._at = memoryview(chunk), used
        return bytes(joined)

    def next_block(self) -> bytes | None:
        header = self._take(len(_MAGIC) + _HEADER.size)
        if header is None or header[: len(_MAGIC)] != _MAGIC:
            what = "cut short" if header is None else "not an lz4 block"
            raise SparkCheckpointError(f"{self._key}: compressed stream {what}")
        token, compressed, decompressed, checksum = _HEADER.unpack_from(header, len(_MAGIC))
        if compressed < 0 or decompressed < 0:
            raise SparkCheckpointError(f"{self._key}: a negative block length")
        if decompressed > 1 << (_LEVEL_BASE + (token & 0x0F)):
            # lz4-java's own reader refuses it too; decompressing would first allocate it
            raise SparkCheckpointError(f"{self._key}: a block longer than its header allows")
        if compressed == 0 and decompressed == 0:  # the end block
            if self._take(1) is not None:
                raise SparkCheckpointError(f"{self._key}: data after the end of the stream")
            return None
        body = self._take(compressed)
        if body is None:
            raise SparkCheckpointError(f"{self._key}: compressed stream cut short")
        method = token & 0xF0
        if method == _RAW and compressed == decompressed:
            return self._checked(bytes(body), checksum)
        if method != _LZ4:
            raise SparkCheckpointError(f"{self._key}: unknown block method {method:#x}")
        try:
            out: bytes = lz4.block.decompress(body, uncompressed_size=decompressed)
        except lz4.block.LZ4BlockError as e:
            raise SparkCheckpointError(f"{self._key}: a block does not decompress ({e})") from None
        if len(out) != decompressed:
            raise SparkCheckpointError(f"{self._key}: a block decompresses to the wrong size")
        return self._checked(out, checksum)

    def _checked(self, block: bytes, checksum: int) -> bytes:
        """lz4-java's check: XXH32 of the block (its seed), of which 28 bits are kept."""
        if self._checksums and (
            xxhash.xxh32_intdigest(block, seed=_XXH32_SEED) & _CHECKSUM_BITS
        ) != (checksum & 0xFFFFFFFF):
            raise SparkCheckpointError(
                f"{self._key}: a block fails its checksum (lz4-java: \"Stream is corrupted\")")
        return block


def _one_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return " ".join(str(e).split())
