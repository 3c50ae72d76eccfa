"""Spark checkpoint files made by hand, byte for byte as Spark writes them: the fast
tests' inputs, and the bad inputs (truncated, gapped, unsafe) no real query writes.
Real queries' checkpoints are in `tests.support.spark_locations.queries`."""

from __future__ import annotations

import io
import json
import struct
import uuid
import zipfile
from pathlib import Path

import lz4.block
import xxhash

_END = b"LZ4Block" + struct.pack("<Biii", 0x10, 0, 0, 0)


def lz4_stream(payload: bytes, block: int = 32_768) -> bytes:
    """lz4-java's block stream of `payload` (what Spark's lz4 codec writes)."""
    out = bytearray()
    level = max(0, (block - 1).bit_length() - 10)  # the token's block size, as lz4-java's
    for at in range(0, len(payload), block):
        raw = payload[at : at + block]
        body = lz4.block.compress(raw, store_size=False)
        # lz4-java's checksum: XXH32 (its seed) of the block, 28 bits of it
        check = xxhash.xxh32_intdigest(raw, seed=0x9747B28C) & 0xFFFFFFF
        out += b"LZ4Block" + struct.pack("<Biii", 0x20 | level, len(body), len(raw), check) + body
    return bytes(out + _END)


def records(pairs: list[tuple[bytes, bytes | None]], header: bytes = b"") -> bytes:
    """Changelog/delta records (key size, key, value size or -1, value), then -1."""
    out = bytearray(header)
    for key, value in pairs:
        out += struct.pack(">i", len(key)) + key
        out += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return bytes(out + struct.pack(">i", -1))


def utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def lineage_header(chain: list[tuple[int, str]]) -> bytes:
    """A format-v2 (changelog v3) header naming its lineage."""
    doc = [{"version": v, "checkpointUniqueId": u} for v, u in chain]
    return utf("v3") + utf(json.dumps(doc))


def snapshot_zip(ssts: dict[str, int], version: str = "v1") -> bytes:
    """A RocksDB snapshot zip listing `ssts` (name -> size)."""
    meta = {
        "sstFiles": [
            {"localFileName": n.split("-")[0] + ".sst", "dfsSstFileName": n, "sizeBytes": s}
            for n, s in ssts.items()
        ],
        "numKeys": 1,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("CURRENT", "MANIFEST-000005\n")
        z.writestr("metadata", f"{version}\n{json.dumps(meta)}")
    return buffer.getvalue()


def sst_name(number: int) -> str:
    return f"{number:06d}-{uuid.uuid4()}.sst"


def write(root: Path, key: str, data: bytes | str) -> Path:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def offsets_file(batch: int, sources: list[object], conf: dict[str, str] | None = None) -> bytes:
    """``offsets/N``: the version line, the batch's metadata, one offset per source."""
    meta = {
        "batchWatermarkMs": batch * 1000,
        "batchTimestampMs": 1_700_000_000_000 + batch,
        "conf": conf or {},
    }
    lines = ["v1", json.dumps(meta)] + [
        "-" if s is None else json.dumps(s, separators=(",", ":")) for s in sources
    ]
    return "\n".join(lines).encode()


def commit_file(batch: int, unique_ids: dict[str, list[list[str]]] | None = None) -> bytes:
    """``commits/N`` (v2, naming each store's checkpoint, with `unique_ids`)."""
    if unique_ids is None:
        return f"v1\n{{\"nextBatchWatermarkMs\":{batch * 1000}}}".encode()
    doc = {"nextBatchWatermarkMs": batch * 1000, "stateUniqueIds": unique_ids}
    return f"v2\n{json.dumps(doc, separators=(',', ':'))}".encode()


def file_log(entries: list[tuple[str, int]]) -> bytes:
    """A file source's log file (``sources/I/K`` or ``K.compact``): (path, batch id) each."""
    lines = ["v1"] + [
        json.dumps({"path": path, "timestamp": 1, "batchId": b}) for path, b in entries
    ]
    return "\n".join(lines).encode()


def logs(root: Path, batches: range, conf: dict[str, str] | None = None) -> None:
    """metadata, offsets/N and commits/N for `batches`, one file source with one entry per
    batch. The source's log starts at 0 whatever `batches` start at: Spark purges old
    offsets and commits by its retention, never a file source's log (only a compaction
    replaces its plain files)."""
    write(root, "metadata", json.dumps({"id": str(uuid.uuid4())}))
    for b in batches:
        write(root, f"offsets/{b}", offsets_file(b, [{"logOffset": b}], conf))
        write(root, f"commits/{b}", commit_file(b))
    for b in range(batches.stop):
        write(root, f"sources/0/{b}", file_log([(f"file:///data/in/{b:05d}.json", b)]))


def rocksdb_changelog_store(
    root: Path, prefix: str, versions: range, snapshots: set[int]
) -> dict[int, list[str]]:
    """A RocksDB store with changelog checkpointing: a changelog per version, a zip (and
    its SSTs) at each of `snapshots`. Returns the SSTs of each snapshot."""
    listed: dict[int, list[str]] = {}
    for v in versions:
        write(root, f"{prefix}/{v}.changelog", lz4_stream(records([(b"k%d" % v, b"v")])))
        if v in snapshots:
            ssts = {sst_name(v * 10 + i): 100 + i for i in range(2)}
            for name, size in ssts.items():
                write(root, f"{prefix}/SSTs/{name}", b"s" * size)
            write(root, f"{prefix}/{v}.zip", snapshot_zip(ssts))
            listed[v] = list(ssts)
    return listed


def hdfs_store(root: Path, prefix: str, versions: range, snapshots: set[int]) -> None:
    for v in versions:
        write(root, f"{prefix}/{v}.delta", lz4_stream(records([(b"k%d" % v, b"v")])))
        if v in snapshots:
            write(root, f"{prefix}/{v}.snapshot", lz4_stream(records([(b"k", b"v")])))


def big_hdfs_store(root: Path, rows: int) -> Path:
    """A location whose batch 0 left one HDFS-backed snapshot of `rows` keys (string key,
    long count) in store ``state/0/0``, written the way Spark lays the rows out."""
    from statehold.spark_checkpoints.spark_types import Atomic, Field, Struct
    from tests.support.spark_locations.unsafe_rows import encode_row

    key_schema = Struct((Field("key", Atomic("string")),))
    value_schema = Struct((Field("count", Atomic("long")),))
    logs(root, range(1))
    pairs: list[tuple[bytes, bytes | None]] = [
        (encode_row((f"key-{i:09d}",), key_schema), encode_row((i,), value_schema))
        for i in range(rows)]
    write(root, "state/0/0/1.snapshot", lz4_stream(records(pairs)))
    schema = {"type": "struct", "fields": [{"name": "key", "type": "string"}]}
    value = {"type": "struct", "fields": [{"name": "count", "type": "long"}]}
    write(root, "state/0/0/_metadata/schema",
          utf("v1") + utf(json.dumps(schema)) + utf(json.dumps(value)))
    return root
