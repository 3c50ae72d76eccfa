"""Spark's own state read and repartitioned offline, side by side with what it is weighed
against, in one run:

    python bench/spark_state_rewrite.py [--keys 1000000] [--value-bytes 0] [--partitions 8]
                                        [--to 32] [--provider rocksdb_changelog] [--runs 3]
                                        [--work DIR] [--out FILE]

A local Spark session runs `bench/verify_deep.py`'s streaming aggregation (``groupBy(key)``
with a count, a sum and, with ``--value-bytes B``, the largest of a B-character payload per
key, so the state grows to about keys × B bytes) over ``--partitions`` shuffle partitions
on the chosen state store layout, then, on the location it left, in turns, ``--runs``
times each:

* **read:** statehold's ``read_state`` of the newest batch (every partition, every row
  decoded into Arrow batches, in this process) against Spark's
  ``spark.read.format("statestore")`` of the same batch written to the ``noop`` sink (every
  row loaded and materialised by Spark's own provider). Rows per second of each, and the
  ratio (issue 43: statehold's at least Spark's);
* **repartition:** ``statehold repartition`` of that batch to ``--to`` partitions, in a
  child process (its peak resident memory read from the kernel), against ``cp -r`` of
  the whole location. The ratio (issue 43: at most 5), and each side's CPU seconds from
  the kernel (what the machine's other load does not change); the peak memory is also
  taken on a location with a quarter of the keys, so whether it grows with the state
  shows.

Medians, ratios and the machine are printed as one JSON document (also to ``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verify_deep import _PROVIDERS, _session, add_run_options, emit  # noqa: E402 - the bench folder on the path

_REPARTITION = """
import sys
from statehold.spark_checkpoints import open_spark_checkpoint
open_spark_checkpoint(sys.argv[1]).repartition(sys.argv[2], partitions=int(sys.argv[3]))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct keys in the state")
    p.add_argument("--value-bytes", type=int, default=0,
                   help="payload characters per key (0: count and sum only)")
    p.add_argument("--batches", type=int, default=2, help="batches the query runs")
    p.add_argument("--partitions", type=int, default=8, help="the query's shuffle partitions")
    p.add_argument("--to", type=int, default=32, help="partitions to repartition to")
    add_run_options(p)
    return p.parse_args(argv)


def write_inputs(folder: Path, keys: int, batches: int, value_bytes: int) -> None:
    """Batch i: its share of the keys, one JSON line each; the payload, where asked, is
    random hex (distinct per key and not compressible by lz4, so the files hold about
    `value_bytes` per key)."""
    folder.mkdir(parents=True)
    share = -(-keys // batches)
    for i in range(batches):
        with (folder / f"in-{i:04d}.json").open("w") as f:
            for k in range(i * share, min(keys, (i + 1) * share)):
                payload = os.urandom(-(-value_bytes // 2)).hex()[:value_bytes]
                f.write(f'{{"key":"k{k:09d}","value":{k % 97},"payload":"{payload}"}}\n')


def run_query(spark: Any, provider: str, inputs: Path, ckpt: Path, with_payload: bool) -> int:
    """The aggregation run to the end of its input; its last committed batch."""
    from pyspark.sql import functions as F

    for key, value in _PROVIDERS[provider].items():
        spark.conf.set(key, value)
    aggregates = [F.count("*").alias("count"), F.sum("value").alias("sum")]
    if with_payload:
        aggregates.append(F.max("payload").alias("payload"))
    stream = (spark.readStream.schema("key string, value long, payload string")
              .option("maxFilesPerTrigger", 1).json(str(inputs))
              .groupBy("key").agg(*aggregates))
    query = (stream.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination()
    last = query.lastProgress["batchId"]
    query.stop()
    return int(last)


def time_read(ckpt: Path, batch: int) -> tuple[float, int]:
    """statehold's offline read of every row: seconds, rows."""
    from statehold.spark_checkpoints import open_spark_checkpoint

    start = time.perf_counter()
    rows = sum(b.num_rows for b in open_spark_checkpoint(str(ckpt)).read_state(batch))
    return time.perf_counter() - start, rows


def time_spark_read(spark: Any, ckpt: Path, batch: int) -> float:
    start = time.perf_counter()
    (spark.read.format("statestore").option("batchId", batch).load(str(ckpt))
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


def _child(argv: list[str]) -> tuple[float, float, int]:
    """A child process run to its end: wall seconds, its CPU seconds (user and system,
    from the kernel, so the machine's other load does not count) and peak resident KiB."""
    start = time.perf_counter()
    pid = subprocess.Popen(argv).pid
    _pid, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{argv[0]} failed (status {status})")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def time_repartition(ckpt: Path, dest: Path, partitions: int) -> tuple[float, float, int]:
    """A repartition in a child process: wall and CPU seconds, peak resident KiB."""
    shutil.rmtree(dest, ignore_errors=True)
    return _child([sys.executable, "-c", _REPARTITION, str(ckpt), str(dest), str(partitions)])


def time_copy(ckpt: Path, dest: Path) -> tuple[float, float]:
    """`cp -r` of the location: wall and CPU seconds."""
    shutil.rmtree(dest, ignore_errors=True)
    seconds, cpu, _peak = _child(["cp", "-r", str(ckpt), str(dest)])
    return seconds, cpu


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import pyspark

    work = Path(tempfile.mkdtemp(prefix="statehold-bench-rewrite-", dir=args.work))
    try:
        spark = _session(args.partitions)
        payload = args.value_bytes > 0
        small = max(1, args.keys // 4)
        write_inputs(work / "in", args.keys, args.batches, args.value_bytes)
        write_inputs(work / "in-small", small, args.batches, args.value_bytes)
        batch = run_query(spark, args.provider, work / "in", work / "ckpt", payload)
        small_batch = run_query(spark, args.provider, work / "in-small", work / "small",
                                payload)
        shutil.rmtree(work / "in")
        shutil.rmtree(work / "in-small")
        time_spark_read(spark, work / "ckpt", batch)  # warm: the JVM's classes and code
        ours, spark_read, repart, copies, peaks = [], [], [], [], []
        repart_cpu, copy_cpu = [], []
        rows = 0
        for _ in range(args.runs):  # in turns, so a slower phase of the machine hits both
            seconds, rows = time_read(work / "ckpt", batch)
            ours.append(seconds)
            spark_read.append(time_spark_read(spark, work / "ckpt", batch))
            seconds, cpu, peak = time_repartition(work / "ckpt", work / "dest", args.to)
            repart.append(seconds)
            repart_cpu.append(cpu)
            peaks.append(peak)
            seconds, cpu = time_copy(work / "ckpt", work / "copy")
            copies.append(seconds)
            copy_cpu.append(cpu)
        spark.stop()
        _s, _cpu, small_peak = time_repartition(work / "small", work / "dest-small", args.to)
        assert rows == args.keys, (rows, args.keys)
        assert small_batch >= 0
        result = {
            "provider": args.provider,
            "keys": args.keys,
            "value_bytes": args.value_bytes,
            "partitions": args.partitions,
            "to": args.to,
            "batch": batch,
            "location_bytes": tree_bytes(work / "ckpt"),
            "read_s": [round(s, 3) for s in ours],
            "spark_read_s": [round(s, 3) for s in spark_read],
            "read_rows_per_s": round(rows / statistics.median(ours)),
            "spark_read_rows_per_s": round(rows / statistics.median(spark_read)),
            "read_speed_vs_spark": round(statistics.median(spark_read)
                                         / statistics.median(ours), 2),
            "repartition_s": [round(s, 3) for s in repart],
            "cp_r_s": [round(s, 3) for s in copies],
            "repartition_median_s": _median(repart),
            "cp_r_median_s": _median(copies),
            "repartition_vs_cp_r": round(statistics.median(repart) / statistics.median(copies),
                                         2),
            "repartition_cpu_s": [round(s, 3) for s in repart_cpu],
            "cp_r_cpu_s": [round(s, 3) for s in copy_cpu],
            "repartition_peak_rss_mib": round(max(peaks) / 1024, 1),
            "repartition_peak_rss_mib_quarter_keys": round(small_peak / 1024, 1),
            "pyspark": pyspark.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return emit(result, args.out)


if __name__ == "__main__":
    main()
