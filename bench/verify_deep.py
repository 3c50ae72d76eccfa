"""`verify --deep` timed against Spark's own load of the same store versions.

    python bench/verify_deep.py [--keys 200000] [--batches 4] [--partitions 4]
                                [--provider rocksdb_changelog] [--runs 3] [--work DIR]

A local Spark session runs a streaming aggregation (``groupBy(key)`` with a count and a
sum; the file source, one input file a batch, `--keys` distinct keys spread over the
batches, each batch updating keys of the ones before) on the chosen state store layout
(``hdfs``, ``rocksdb``, ``rocksdb_changelog``, ``rocksdb_v2``: checkpoint format v2,
Spark 4.1+), then stops. On the location it left, in turns, `--runs` times each:

* statehold: ``open_spark_checkpoint(ckpt).verify(deep=True)`` in this process: every
  file a restart needs checked, and every store version loaded (RocksDB's opened by
  RocksDB and iterated, changelogs, deltas and snapshots read to their end, every record
  decoded);
* Spark: ``spark.read.format("statestore").option("batchId", N).load(ckpt)`` written to
  the ``noop`` sink: every partition's version of the same batch loaded by Spark's own
  state store provider and every row materialised (Spark 4.0+; on 3.5 the state data
  source is there too).

Both read the same versions of the same stores. The medians and their ratio are printed
as one JSON document (also written to `--out`), with the state's bytes (the files those
versions need) and the deep verify's rate per GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

_PROVIDERS = {
    "hdfs": {"spark.sql.streaming.stateStore.providerClass":
             "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"},
    "rocksdb": {"spark.sql.streaming.stateStore.providerClass":
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled":
                "false"},
    "rocksdb_changelog": {
        "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"},
    "rocksdb_v2": {
        "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=200_000, help="distinct keys in the state")
    p.add_argument("--batches", type=int, default=4, help="batches the query runs")
    p.add_argument("--partitions", type=int, default=4, help="shuffle partitions (stores)")
    add_run_options(p)
    return p.parse_args(argv)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options every Spark-state bench takes: the layout, the runs, where to write."""
    p.add_argument("--provider", choices=sorted(_PROVIDERS), default="rocksdb_changelog")
    p.add_argument("--runs", type=int, default=3, help="timed runs of each side")
    p.add_argument("--work", type=Path, default=None, help="directory to write under")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")


def _session(partitions: int, conf: dict[str, str] | None = None) -> Any:
    """A local session on every core; `conf`: more settings (class path ones included:
    the JVM starts here)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{os.cpu_count() or 2}]")
        .appName("statehold-bench-verify-deep")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.driver.memory", "2g")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def write_inputs(folder: Path, keys: int, batches: int) -> None:
    """Batch i: the keys of its own share, and every tenth key of the batches before it
    (updates), one JSON line each."""
    folder.mkdir(parents=True)
    share = keys // batches
    for i in range(batches):
        rows = range(i * share, (i + 1) * share if i < batches - 1 else keys)
        updates = range(0, i * share, 10)
        with (folder / f"in-{i:04d}.json").open("w") as f:
            for k in [*rows, *updates]:
                f.write(f'{{"key":"k{k:09d}","value":{k % 97}}}\n')


def run_query(spark: Any, provider: str, inputs: Path, ckpt: Path) -> int:
    """The aggregation run to the end of its input; its last committed batch."""
    from pyspark.sql import functions as F

    for key, value in _PROVIDERS[provider].items():
        spark.conf.set(key, value)
    stream = (spark.readStream.schema("key string, value long")
              .option("maxFilesPerTrigger", 1).json(str(inputs))
              .groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("sum")))
    query = (stream.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination()
    last = query.lastProgress["batchId"]
    query.stop()
    return int(last)


def time_deep(ckpt: Path, batch: int) -> tuple[float, float, Any]:
    """Wall and CPU seconds (this process's: the deep verify runs in it)."""
    from statehold.spark_checkpoints import open_spark_checkpoint

    start, cpu = time.perf_counter(), time.process_time()
    report = open_spark_checkpoint(str(ckpt)).verify(batch, deep=True)
    return time.perf_counter() - start, time.process_time() - cpu, report


def time_spark(spark: Any, ckpt: Path, batch: int) -> float:
    start = time.perf_counter()
    (spark.read.format("statestore").option("batchId", batch).load(str(ckpt))
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


def state_bytes(ckpt: Path, batch: int) -> int:
    """Bytes of the store files a restart after `batch` needs."""
    from statehold.spark_checkpoints import open_spark_checkpoint

    location = open_spark_checkpoint(str(ckpt))
    found = location.scan()
    needs = location.restart_needs(found, batch)
    return sum(found.files[k].size for s in needs.stores for k in s.files if k in found.files)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import pyspark

    work = Path(tempfile.mkdtemp(prefix="statehold-bench-deep-", dir=args.work))
    try:
        spark = _session(args.partitions)
        write_inputs(work / "in", args.keys, args.batches)
        batch = run_query(spark, args.provider, work / "in", work / "ckpt")
        deep: list[float] = []
        deep_cpu: list[float] = []
        native: list[float] = []
        report = None
        time_spark(spark, work / "ckpt", batch)  # warm: the JVM's classes and code
        for _ in range(args.runs):  # in turns, so a slower phase of the machine hits both
            seconds, cpu, report = time_deep(work / "ckpt", batch)
            deep.append(seconds)
            deep_cpu.append(cpu)
            native.append(time_spark(spark, work / "ckpt", batch))
        spark.stop()
        assert report is not None and report.ok, report
        size = state_bytes(work / "ckpt", batch)
        result = {
            "provider": args.provider,
            "keys": args.keys,
            "batches": args.batches,
            "partitions": args.partitions,
            "batch": batch,
            "state_bytes": size,
            "records_read": report.records_read,
            "stores_loaded": report.stores_loaded,
            "deep_verify_s": [round(s, 3) for s in deep],
            "deep_verify_cpu_s": [round(s, 3) for s in deep_cpu],
            "spark_load_s": [round(s, 3) for s in native],
            "deep_verify_median_s": round(statistics.median(deep), 3),
            "spark_load_median_s": round(statistics.median(native), 3),
            "ratio": round(statistics.median(deep) / statistics.median(native), 2),
            "deep_s_per_gib": round(statistics.median(deep) / (size / (1 << 30)), 1),
            "deep_records_per_s": round(report.records_read / statistics.median(deep)),
            "pyspark": pyspark.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return emit(result, args.out)


def emit(result: dict[str, Any], out: Path | None) -> dict[str, Any]:
    """The result as one JSON document on stdout, and in `out` where given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
