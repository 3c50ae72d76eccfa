"""The workload through statehold: `StatefulJob.foreach_batch` on the same streaming file
source the Spark variants read, state in RocksDB in the tasks, checkpoints in a local
job directory (the embedded default)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from _workload import (
    INPUT_DDL,
    OUTPUT_DDL,
    BatchStats,
    RunResult,
    Workload,
    feed,
    listing,
    new_bytes,
    wait_for_batch,
)

from statehold.spark import StatefulJob
from statehold.spark.job import BatchResult
from statehold.spark.reader import iter_state

JOB_ID = "bench"
MAX_PARALLELISM = 128
OUTPUT_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64()), ("sum", pa.int64())])


def _fold(agg: Any, rows: list[dict[str, Any]]) -> tuple[int, int]:
    """Fold a key's rows into its ``[count, sum, last payload]`` ValueState."""
    current = agg.get()
    count, total, last = current if current is not None else (0, 0, "")
    for row in rows:
        count += 1
        total += row["value"]
        last = row["payload"]
    agg.update([count, total, last])
    return count, total


def running_total(key: str, rows: list[dict[str, Any]], state: Any) -> list[tuple[str, int, int]]:
    """Per key: (count, sum, last payload) in one ValueState; emits the new totals."""
    count, total = _fold(state.value("agg"), rows)
    return [(key, count, total)]


def running_totals_vectorized(groups: list[tuple[str, Any]], states: Any) -> pa.Table:
    """The same, once per task for all its keys: one output table instead of one per key."""
    keys: list[str] = []
    counts: list[int] = []
    sums: list[int] = []
    for key, rows in groups:
        count, total = _fold(states.for_key(key).value("agg"), rows)
        keys.append(key)
        counts.append(count)
        sums.append(total)
    return pa.table([keys, counts, sums], schema=OUTPUT_SCHEMA)


def _noop_sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def _start(
    spark: Any, job: StatefulJob, source: Path, vectorized: bool,
    on_batch: Callable[[BatchResult], None],
) -> Any:
    fn = running_totals_vectorized if vectorized else running_total
    return (
        spark.readStream.schema(INPUT_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.foreachBatch(
            job.foreach_batch(fn, OUTPUT_DDL, sink=_noop_sink, vectorized=vectorized,
                              on_batch=on_batch)
        )
        .option("checkpointLocation", job.spark_checkpoint_location)
        .start()
    )


def run_statehold(
    spark: Any,
    w: Workload,
    files: list[Path],
    work: Path,
    *,
    retain: int,
    partitions: int,
    vectorized: bool = False,
    backend_options: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> RunResult:
    name = "statehold" + (" (vectorized)" if vectorized else "") + (
        " changelog" if (backend_options or {}).get("changelog") else "")
    result = RunResult(name)
    shutil.rmtree(work, ignore_errors=True)
    source = work / "source"
    source.mkdir(parents=True)
    job_dir = work / "jobs" / JOB_ID
    results: dict[int, BatchResult] = {}

    def make_job(local: str) -> StatefulJob:
        return StatefulJob(spark, str(work / "jobs"), JOB_ID, max_parallelism=MAX_PARALLELISM,
                           parallelism=partitions, retain=retain, local_dir=str(work / local),
                           backend_options=backend_options)

    def keep(r: BatchResult) -> None:
        results[r.checkpoint_id] = r

    job = make_job("local")
    query = _start(spark, job, source, vectorized, keep)
    before = listing(job_dir)

    def on_batch(i: int, progress: dict[str, Any]) -> None:
        nonlocal before
        after = listing(job_dir)
        up, nfiles = new_bytes(before, after)
        before = after
        r = results[progress["batchId"]]
        stats = BatchStats(
            batch=i,
            events=int(progress["numInputRows"]),
            seconds=progress["durationMs"]["triggerExecution"] / 1000,
            checkpoint_seconds=r.snapshot_seconds + r.complete_seconds,
            bytes_uploaded=up,
            files_uploaded=nfiles,
        )
        stats.footprint_bytes, stats.footprint_files = sum(after.values()), len(after)
        result.batches.append(stats)
        log(f"  {name} batch {i}: {stats.events} events in {stats.seconds:.2f}s, checkpoint "
            f"{stats.checkpoint_seconds:.3f}s (tasks' snapshots {r.snapshot_seconds:.3f}s + "
            f"driver {r.complete_seconds:.3f}s), {up / 2**20:.2f} MiB in {nfiles} files")

    try:
        feed(query, files[: w.batches + 1], source, on_batch)
    finally:
        query.stop()
    # Let the asynchronous cleaner finish the subsumed checkpoints' deletes.
    coordinator = job.coordinator
    coordinator.cleaner.wait_idle(60)
    foot = listing(job_dir)
    result.footprint_bytes, result.footprint_files = sum(foot.values()), len(foot)
    job.close()

    # Recovery, as for Spark's store (see _spark_native.py): the next file is already in
    # the source; the clock runs from the query's start to the first batch's progress,
    # with a new driver (new job object, new epoch: HA read, background reconcile) and
    # tasks with an empty local disk, so they download the state as after losing the
    # machine. Same JVM and warm Python workers.
    job = make_job("local-recovery")
    recovery_file = files[w.batches + 1]
    tmp = source / f".{recovery_file.name}.tmp"
    shutil.copyfile(recovery_file, tmp)
    os.replace(tmp, source / recovery_file.name)
    started = time.perf_counter()
    query = _start(spark, job, source, vectorized, keep)
    try:
        wait_for_batch(query, w.batches + 1, time.monotonic() + 3600)
        recovered = [time.perf_counter() - started]
    finally:
        query.stop()
        job.close()
    result.recovery_seconds = recovered[0]
    log(f"  {name} recovery: first batch after restart in {result.recovery_seconds:.2f}s")

    keys = count = total = 0
    for _key, states in iter_state(str(job_dir)):
        c, s, _last = states["agg"]
        keys += 1
        count += c
        total += s
    result.totals = (keys, count, total)
    return result
