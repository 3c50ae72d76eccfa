"""Incremental checkpoints: bytes uploaded per checkpoint vs. the changed and total state.

    python bench/incremental.py                 # backend (100k keys, ~32 MB) + Spark (20k keys)
    python bench/incremental.py --mode backend --keys 200000

Batch 0 writes every key; each of the next `--batches` batches rewrites `--changed` of the
keys (random, new random values). Per checkpoint it prints the bytes uploaded, the changed
state (the key + value bytes written in the batch: an estimate of what must be uploaded at
least), the size of a full (non-incremental) snapshot (all files the checkpoint references,
i.e. what a non-incremental snapshot would upload) and the ratios.

`backend`: the executor-side path exactly as a Spark task runs it (restore from the previous
checkpoint into a fresh working DB, update, snapshot, close), without Spark's overhead.
`spark`: the same through `StatefulJob.run_batch` on local Spark.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from statehold.backend import TaskStateBackend, sources_from_metadata, task_range
from statehold.backend.rocks import RestoreSource
from statehold.format import layout
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupState,
    OperatorState,
    encode,
    read_metadata,
)
from statehold.storage import Storage, open_storage

MAXP = 128
OP = "state"


def mib(n: float) -> str:
    return f"{n / (1 << 20):8.2f}"


def header() -> None:
    print(f"{'ckpt':>4} {'uploaded MiB':>12} {'changed MiB':>11} {'full MiB':>9} "
          f"{'up/changed':>10} {'up/full':>8} {'files up':>8} {'reused':>6} {'secs':>6}")


def row(cid: int, up: int, changed: int, full: int, files: int, reused: int, secs: float) -> None:
    print(f"{cid:>4} {mib(up):>12} {mib(changed):>11} {mib(full):>9} "
          f"{up / max(changed, 1):>10.2f} {up / max(full, 1):>8.3f} {files:>8} "
          f"{reused if reused >= 0 else '-':>6} "
          f"{secs:>6.2f}", flush=True)


def summary(ups: list[int], changed: list[int], fulls: list[int]) -> None:
    print(f"batches 1..{len(ups)}: uploaded mean {mib(statistics.mean(ups)).strip()} MiB, "
          f"median {mib(statistics.median(ups)).strip()}, max {mib(max(ups)).strip()}; "
          f"changed mean {mib(statistics.mean(changed)).strip()} MiB; full snapshot mean "
          f"{mib(statistics.mean(fulls)).strip()} MiB; total uploaded / total changed = "
          f"{sum(ups) / sum(changed):.2f}, mean uploaded / full = "
          f"{statistics.mean(ups) / statistics.mean(fulls):.3f}")


def _checkpoint(storage: Storage, cid: int, kgs: KeyGroupState) -> list[RestoreSource]:
    key = layout.checkpoint_metadata_key(cid)
    meta = CheckpointMetadata(job_id="bench", checkpoint_id=cid, epoch=1, max_parallelism=MAXP,
                              operators=[OperatorState(operator=OP, ranges=[kgs])])
    storage.write(key, encode(meta, key))
    return sources_from_metadata(storage, key, read_metadata(storage, key), OP)


def run_backend(work: Path, keys: int, batches: int, changed: float, value_bytes: int) -> None:
    print(f"\n== backend: {keys} keys, {value_bytes}-byte values, {batches} batches x "
          f"{changed:.0%} of keys, 1 task (key groups 0..{MAXP - 1})")
    storage = open_storage(str(work / "job"))
    rng = random.Random(1)
    names = [f"user-{i:07d}" for i in range(keys)]
    sources: list[RestoreSource] | None = None
    ups, chs, fulls = [], [], []
    header()
    for cid in range(batches + 1):
        started = time.time()
        b = TaskStateBackend.open(work / "local", OP, task_range(0, 1, MAXP), MAXP, sources)
        todo = names if cid == 0 else rng.sample(names, int(keys * changed))
        written = 0
        for k in todo:
            value = rng.randbytes(value_bytes // 2).hex()
            b.value_state("v", k).update(value)
            written += len(k) + len(value) + 2  # key, JSON quotes
        kgs = b.snapshot(storage, 1, cid, layout.checkpoint_metadata_key(cid))
        compaction = b.close_after_compactions()  # as a Spark task closes
        if compaction is not None:
            compaction.join()  # repeatable: the next batch opens its result
        sources = _checkpoint(storage, cid, kgs)
        s = b.last_snapshot
        assert s is not None
        row(cid, s.bytes_uploaded, written, s.state_size, s.files_uploaded, s.files_reused,
            time.time() - started)
        if cid:
            ups.append(s.bytes_uploaded)
            chs.append(written)
            fulls.append(s.state_size)
    summary(ups, chs, fulls)


def _update(key: str, rows: list[dict[str, Any]], state: Any) -> list[tuple[str]]:
    state.value("v").update(rows[-1]["value"])
    return []


def run_spark(work: Path, keys: int, batches: int, changed: float, value_bytes: int) -> None:
    from statehold.spark import StatefulJob, local_session

    print(f"\n== spark: {keys} keys, {value_bytes}-byte values, {batches} batches x "
          f"{changed:.0%} of keys, StatefulJob.run_batch, local[2], parallelism 2")
    spark = local_session("statehold-bench", shuffle_partitions=2)
    job = StatefulJob(spark, str(work / "ckpt"), "bench", max_parallelism=MAXP,
                      parallelism=2, retain=2, local_dir=str(work / "local"))
    rng = random.Random(2)
    names = [f"user-{i:07d}" for i in range(keys)]
    ups, chs, fulls = [], [], []
    header()
    try:
        for cid in range(batches + 1):
            todo = names if cid == 0 else rng.sample(names, int(keys * changed))
            rows = [(k, rng.randbytes(value_bytes // 2).hex()) for k in todo]
            written = sum(len(k) + len(v) + 2 for k, v in rows)
            df = spark.createDataFrame(rows, "key string, value string")
            r = job.run_batch(df, _update, "key string", batch_id=cid)
            row(cid, r.bytes_uploaded, written, r.state_size, r.files_uploaded, -1, r.duration)
            if cid:
                ups.append(r.bytes_uploaded)
                chs.append(written)
                fulls.append(r.state_size)
    finally:
        job.close()
        spark.stop()
    summary(ups, chs, fulls)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mode", choices=["backend", "spark", "both"], default="both")
    p.add_argument("--keys", type=int, default=100_000, help="keys (backend mode)")
    p.add_argument("--spark-keys", type=int, default=20_000, help="keys (spark mode)")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--changed", type=float, default=0.05, help="fraction of keys per batch")
    p.add_argument("--value-bytes", type=int, default=300)
    p.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    args = p.parse_args(argv)
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path(
                "/proc/cpuinfo").exists() else platform.processor()
    print(f"machine: nproc {os.cpu_count()}, CPU {cpu}, Python {sys.version.split()[0]}, "
          f"{platform.system()} {platform.machine()}")
    work = args.dir or Path(tempfile.mkdtemp(prefix="statehold-bench-"))
    try:
        if args.mode in ("backend", "both"):
            run_backend(work / "backend", args.keys, args.batches, args.changed, args.value_bytes)
        if args.mode in ("spark", "both"):
            run_spark(work / "spark", args.spark_keys, args.batches, args.changed,
                      args.value_bytes)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
