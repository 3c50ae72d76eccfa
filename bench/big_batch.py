"""One big micro-batch: each Python worker's peak RSS (sampled from /proc, not estimated)
and the wall time, statehold against Spark's ``applyInPandasWithState`` on the same input.

    python bench/big_batch.py                      # 20,000,000 rows, 1,000,000 keys
    python bench/big_batch.py --rows 2000000 --keys 100000 --hot-rows 500000

Input: `--rows` rows over `--keys` keys with a 100-byte payload, written once as Parquet;
then the hot-key case: one key with `--hot-rows` rows. statehold reads it as one batch
(`run_batch` with a per-key function; the hot key through a processor with
``input_chunks`` and pandas chunks, as Spark's function gets); Spark reads the same files
as one streaming trigger (``applyInPandasWithState``, RocksDB state store). local[2],
parallelism 2, a new Spark session per system and case. Each session first runs its
system once on a tiny input (10,000 rows; untimed), as a pipeline's big batch meets a
warm JVM and started Python workers; ``--cold`` skips that. A thread samples the VmRSS of
every PySpark worker this benchmark started (``pyspark.daemon`` processes descending from
its own) every 100 ms; the peak per worker is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from statehold.processor import StatefulProcessor

PAYLOAD = 100
#: rows of the untimed run that warms a session up
WARM_ROWS = 10_000


class RssSampler:
    """Peak VmRSS (bytes) per PySpark worker process, sampled from /proc."""

    def __init__(self, every: float = 0.1) -> None:
        self.every = every
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            parents: dict[int, int] = {}
            for pid_dir in Path("/proc").iterdir():
                if pid_dir.name.isdigit():
                    try:  # "pid (comm) state ppid ...": comm may hold spaces, split after ")"
                        stat = (pid_dir / "stat").read_text()
                        parents[int(pid_dir.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        continue
            for pid in parents:
                if not _descends(pid, me, parents):
                    continue  # another program's Spark workers on the same machine
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"pyspark.daemon" not in cmd and b"pyspark/worker" not in cmd:
                        continue
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            rss = int(line.split()[1]) * 1024
                            self.peaks[pid] = max(self.peaks.get(pid, 0), rss)
                except (OSError, ValueError):
                    continue
            self._stop.wait(self.every)

    def summary(self) -> dict[str, Any]:
        peaks = sorted(self.peaks.values(), reverse=True)
        return {"max_worker_rss_mb": round(peaks[0] / 2**20) if peaks else 0,
                "workers": len(peaks), "peaks_mb": [round(p / 2**20) for p in peaks[:4]]}


def _descends(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    seen = 0
    while pid in parents and seen < 64:
        pid = parents[pid]
        if pid == ancestor:
            return True
        seen += 1
    return False


def write_input(spark: Any, path: Path, rows: int, keys: int, hot_rows: int) -> None:
    from pyspark.sql import functions as F

    df = spark.range(rows).select(
        F.format_string("k%07d", (F.col("id") % keys).cast("int")).alias("key"),
        F.col("id").alias("value"),
        F.expr(f"repeat('p', {PAYLOAD})").alias("payload"),
    )
    df.repartition(2).write.mode("overwrite").parquet(str(path / "plain"))
    hot = spark.range(hot_rows).select(F.lit("hot").alias("key"), F.col("id").alias("value"),
                                       F.expr(f"repeat('p', {PAYLOAD})").alias("payload"))
    hot.repartition(2).write.mode("overwrite").parquet(str(path / "hot"))
    warm = spark.range(WARM_ROWS).select(
        F.format_string("k%07d", (F.col("id") % 100).cast("int")).alias("key"),
        F.col("id").alias("value"), F.expr(f"repeat('p', {PAYLOAD})").alias("payload"))
    warm.repartition(2).write.mode("overwrite").parquet(str(path / "warm"))


def per_key(key: Any, rows: Any, state: Any) -> Any:
    total = state.value("total")
    before = total.get() or [0, 0]
    total.update([before[0] + len(rows), before[1] + sum(r["value"] for r in rows)])
    return [(key, before[0] + len(rows))]


class ChunkTotals(StatefulProcessor):
    input_chunks = True

    def init(self, handle: Any) -> None:
        self.total = handle.get_value_state("total", "n long, s long")

    def handle_input_rows(self, key: Any, rows: Any, timer_values: Any) -> Any:
        n = s = 0
        for chunk in rows:  # pandas DataFrames of at most task_batch_rows rows
            n += len(chunk)
            s += int(chunk["value"].sum())
        before = self.total.get() or (0, 0)
        self.total.update((before[0] + n, before[1] + s))
        return [(key, before[0] + n)]


def spark_update(key: Any, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    n, s = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        s += int(pdf["value"].sum())
    state.update((n, s))
    yield pd.DataFrame({"key": [key[0]], "n": [n]})


def run_statehold(spark: Any, src: Path, work: Path, name: str, hot: bool) -> dict[str, Any]:
    from statehold.spark import StatefulJob

    df = spark.read.parquet(str(src))
    job = StatefulJob(spark, str(work / "ckpt"), name, parallelism=2,
                      local_dir=str(work / "local"))
    started = time.perf_counter()
    with RssSampler() as rss:
        if hot:
            res = job.transform_with_state(df, ChunkTotals(), "key string, n long", key="key",
                                           input_format="pandas")
        else:
            res = job.run_batch(df, per_key, "key string, n long", key="key")
        assert res.output is not None
        out_rows = res.output.count()
    seconds = time.perf_counter() - started
    job.end()
    return {"seconds": round(seconds, 2), "rows_in": res.rows_in, "out_rows": out_rows,
            **rss.summary()}


def run_spark(spark: Any, src: Path, work: Path, name: str) -> dict[str, Any]:
    from pyspark.sql.streaming.state import GroupStateTimeout

    schema = spark.read.parquet(str(src)).schema
    stream = spark.readStream.schema(schema).parquet(str(src))
    query_df = stream.groupBy("key").applyInPandasWithState(
        spark_update, "key string, n long", "n long, s long", "update",
        GroupStateTimeout.NoTimeout,
    )
    started = time.perf_counter()
    with RssSampler() as rss:
        query = (query_df.writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", str(work / f"spark-{name}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), **rss.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--hot-rows", type=int, default=5_000_000)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--cases", default="plain,hot", help="plain, hot or both")
    parser.add_argument("--cold", action="store_true",
                        help="time each system's first run in its session (no warm-up)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = args.work or Path(tempfile.mkdtemp(prefix="big-batch-"))
    try:
        with session() as spark:
            write_input(spark, work / "input", args.rows, args.keys, args.hot_rows)
        results: dict[str, Any] = {
            "rows": args.rows, "keys": args.keys, "hot_rows": args.hot_rows,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, local[2]",
            "warmed_up": not args.cold,
        }
        for case in args.cases.split(","):
            hot = case == "hot"
            suffix = "_hot" if hot else ""
            # A new session (new Python workers) per run, so no run's peak RSS includes
            # what an earlier run left in a reused worker.
            warm = work / "input" / "warm"
            with session() as spark:
                if not args.cold:
                    run_statehold(spark, warm, work, f"warm-{case}", hot)
                results[f"statehold{suffix}"] = run_statehold(
                    spark, work / "input" / case, work, case, hot)
            if not args.skip_spark:
                with session() as spark:
                    if not args.cold:
                        run_spark(spark, warm, work, f"warm-{case}")
                    results[f"spark{suffix}"] = run_spark(spark, work / "input" / case, work,
                                                          case)
        print(json.dumps(results, indent=2))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def session() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("big-batch")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
