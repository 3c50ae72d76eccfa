"""gc of a Spark checkpoint location holding 100,000 orphan SSTs, against `find -delete`.

    python bench/spark_gc.py                       # 100,000 orphans, 3 runs each
    python bench/spark_gc.py --orphans 10000 --runs 1   # a quick run

The tree (built twice, identical): a checkpoint location with ``metadata``, offsets and
commits of batches 0-4, two stores (``state/0/0`` and ``state/0/1``) of the RocksDB
provider, each with one valid zip per retained version listing three SSTs that exist,
plus `--orphans` orphan SSTs (``orphan-<n>.sst``) spread over the two stores' ``SSTs/``,
every file two hours old. One tree is collected by the library's `gc` in a child process
(``python -c``: the interpreter's start and imports counted, as a CLI would pay them);
the other by ``find <tree>/state -name 'orphan*' -delete``. Both are timed as whole
processes, in turns (find, gc, find, gc, ...), a fresh pair of trees for each turn;
the ratio gc/find is taken pair by pair and its median reported. After each gc the
benchmark checks by listing that every orphan is gone and every needed file is there.

Prints one JSON document (also written to `--out`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

BATCHES = 5
PARTITIONS = 2
AGE = 7200.0

GC_CHILD = """
import json, sys
from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.gc import gc
r = gc(open_spark_checkpoint(sys.argv[1]))
print(json.dumps({"deleted": r.deleted, "problems": r.problems}))
"""


def zip_bytes(ssts: list[str]) -> bytes:
    meta = {
        "sstFiles": [
            {"localFileName": n, "dfsSstFileName": n, "sizeBytes": 64} for n in ssts
        ],
        "logFiles": [],
        "numKeys": 3,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("metadata", "v1\n" + json.dumps(meta))
        z.writestr("CURRENT", "MANIFEST-000001\n")
    return buffer.getvalue()


def build(root: Path, orphans: int) -> set[str]:
    """The tree; returns the keys gc must keep."""
    keep: set[str] = set()

    def put(rel: str, data: bytes) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        keep.add(rel)

    put("metadata", b'{"id":"5f6b2c4e-0000-4000-8000-000000000000"}')
    for b in range(BATCHES):
        conf = {"spark.sql.streaming.minBatchesToRetain": "100"}
        put(f"offsets/{b}", ("v1\n" + json.dumps({"conf": conf}) + "\n-").encode())
        put(f"commits/{b}", b'v1\n{"nextBatchWatermarkMs":0}')
    put("state/0/_metadata/metadata", b'v1\n{"operatorInfo":{"operatorId":0,'
        b'"operatorName":"stateStoreSave"},"stateStoreInfo":[{"storeName":"default",'
        b'"numColsPrefixKey":0,"numPartitions":2}]}')
    for p in range(PARTITIONS):
        for v in range(1, BATCHES + 1):
            ssts = [f"{v:06d}-{p}-{i}.sst" for i in range(3)]
            for name in ssts:
                put(f"state/0/{p}/SSTs/{name}", b"s" * 64)
            put(f"state/0/{p}/{v}.zip", zip_bytes(ssts))
    per = [orphans // PARTITIONS + (1 if p < orphans % PARTITIONS else 0)
           for p in range(PARTITIONS)]
    n = 0
    for p, count in enumerate(per):
        directory = root / f"state/0/{p}/SSTs"
        for _ in range(count):
            fd = os.open(directory / f"orphan-{n:07d}.sst", os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
            n += 1
    old = time.time() - AGE
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))
    return keep


def listed(root: Path) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root) for f in fs
    }


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orphans", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="where the trees go (a tmp dir)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spark-gc-bench-", dir=args.work))
    runs: list[dict[str, Any]] = []
    try:
        for run in range(args.runs):
            a, b = work / f"find-{run}", work / f"gc-{run}"
            build(a, args.orphans)
            keep = build(b, args.orphans)
            os.sync()
            load_before = os.getloadavg()[0]
            find_s, _ = timed(["find", str(a / "state"), "-name", "orphan*", "-delete"])
            gc_s, out = timed([sys.executable, "-c", GC_CHILD, str(b)])
            load_after = os.getloadavg()[0]
            result = json.loads(out)
            left = listed(b)
            assert result["problems"] == [], result
            assert result["deleted"] == args.orphans, result
            assert keep <= left, sorted(keep - left)[:5]
            assert not [k for k in left if "orphan" in k]
            runs.append({"find_s": round(find_s, 3), "gc_s": round(gc_s, 3),
                         "ratio": round(gc_s / find_s, 3),
                         "load": [round(load_before, 2), round(load_after, 2)]})
            print(json.dumps(runs[-1]), file=sys.stderr)
            shutil.rmtree(a)
            shutil.rmtree(b)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "orphans": args.orphans,
        "runs": runs,
        "median_find_s": statistics.median(r["find_s"] for r in runs),
        "median_gc_s": statistics.median(r["gc_s"] for r in runs),
        "median_ratio": statistics.median(r["ratio"] for r in runs),
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
