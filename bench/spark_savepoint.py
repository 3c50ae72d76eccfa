"""A savepoint of a Spark checkpoint location with over 1 GB of RocksDB state, timed
against ``cp -r`` of the whole location, with the bytes it copied against the state's.

    python bench/spark_savepoint.py [--state-gb 1.0] [--partitions 4] [--versions 20]
                                    [--work DIR]

The location is synthesised the way Spark's RocksDB provider (changelog checkpointing
off) lays it out: ``metadata``, ``offsets/N`` and ``commits/N`` of batches 0..V-1, a
file source's log, operator metadata and schemas, and per partition one ``V.zip`` per
version whose ``metadata`` lists the SSTs under ``SSTs/``: a large set shared by every
version (the bulk of the state) plus one small SST each version added, as RocksDB's
incremental uploads do. The savepoint takes the newest batch: its zips and every SST
they list (hard links), and the logs; ``cp -r`` copies every byte of every version.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.savepoint import savepoint

_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_SMALL_SST = 1 << 20
_BLOCK = os.urandom(8 << 20)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _random_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(uuid.uuid4().bytes)  # distinct files
        left = size - 16
        while left > 0:
            f.write(_BLOCK[: min(left, len(_BLOCK))])
            left -= len(_BLOCK)


def _zip(ssts: list[tuple[str, str, int]]) -> bytes:
    meta = {
        "sstFiles": [
            {"localFileName": local, "dfsSstFileName": dfs, "sizeBytes": size}
            for local, dfs, size in ssts
        ],
        "numKeys": 1000 * len(ssts),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("metadata", "v1\n" + json.dumps(meta))
        z.writestr("CURRENT", "MANIFEST-000005\n")
        z.writestr("MANIFEST-000005", os.urandom(2048))
        z.writestr("OPTIONS-000007", "# RocksDB options\n" * 200)
    return buf.getvalue()


def synthesise(root: Path, state_bytes: int, partitions: int, versions: int) -> int:
    """Write the location; the bytes of its state (SSTs and zips)."""
    _write(root / "metadata", json.dumps({"id": str(uuid.uuid4())}).encode())
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.stateStore.providerClass": _PROVIDER,
    }
    for batch in range(versions):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": conf}
        offsets = f'v1\n{json.dumps(meta)}\n{{"logOffset":{batch}}}'
        _write(root / "offsets" / str(batch), offsets.encode())
        _write(root / "commits" / str(batch), b'v1\n{"nextBatchWatermarkMs":0}')
        entry = {"path": f"file:///data/in/{batch:05d}.json", "timestamp": 0, "batchId": batch}
        _write(root / "sources" / "0" / str(batch), f"v1\n{json.dumps(entry)}".encode())
    info = {
        "operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
        "stateStoreInfo": [
            {"storeName": "default", "numColsPrefixKey": 0, "numPartitions": partitions}
        ],
    }
    _write(root / "state/0/_metadata/metadata", f"v1\n{json.dumps(info)}".encode())
    per_partition = state_bytes // partitions
    shared_count = 16
    shared_size = (per_partition - versions * _SMALL_SST) // shared_count
    total = 0
    for p in range(partitions):
        store = root / "state" / "0" / str(p)
        _write(store / "_metadata" / "schema", b"\x00\x02v2" + os.urandom(200))
        listed: list[tuple[str, str, int]] = []
        for i in range(shared_count):
            local = f"{i + 1:06d}.sst"
            dfs = f"{i + 1:06d}-{uuid.uuid4()}.sst"
            _random_file(store / "SSTs" / dfs, shared_size)
            listed.append((local, dfs, shared_size))
            total += shared_size
        for v in range(1, versions + 1):
            local = f"{shared_count + v:06d}.sst"
            dfs = f"{shared_count + v:06d}-{uuid.uuid4()}.sst"
            _random_file(store / "SSTs" / dfs, _SMALL_SST)
            listed.append((local, dfs, _SMALL_SST))
            total += _SMALL_SST
            data = _zip(listed)
            _write(store / f"{v}.zip", data)
            total += len(data)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-gb", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="statehold-spark-savepoint-", dir=args.work))
    try:
        t0 = time.perf_counter()
        size = int(args.state_gb * (1 << 30))
        state = synthesise(work / "ckpt", size, args.partitions, args.versions)
        made = time.perf_counter() - t0
        subprocess.run(["sync"], check=True)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(work / "ckpt"), str(work / "cp")], check=True)
        subprocess.run(["sync"], check=True)
        cp_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = savepoint(open_spark_checkpoint(str(work / "ckpt")), str(work / "sp"))
        subprocess.run(["sync"], check=True)
        sp_seconds = time.perf_counter() - t0
        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            "state_bytes": state,
            "location_bytes": report.source_bytes,
            "synthesised_seconds": round(made, 1),
            "cp_r_seconds": round(cp_seconds, 3),
            "savepoint_seconds": round(sp_seconds, 3),
            "ratio_cp_over_savepoint": round(cp_seconds / sp_seconds, 1),
            "savepoint_files": report.files,
            "savepoint_bytes": report.bytes,
            "savepoint_bytes_written": report.bytes_written,
            "savepoint_linked": report.linked,
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
