"""Sessions with timers and TTL churn: statehold against Spark's transformWithStateInPandas
(RocksDB state store), in one run on one local Spark session.

    python bench/sessions.py                       # 2000 users per cohort, 3 active, 12 batches
    python bench/sessions.py --users 34000 --batches 5   # 102,000 live users (9 min)
    python bench/sessions.py --users 500 --batches 6 --ttl-seconds 10    # a quick look

Both systems run the same processor class (bench/_sessions.py: typed session state closed
by event-time timers, a typed profile with a processing-time TTL) over the same Parquet
files through the same streaming file source, one file per trigger; Spark writes to the
noop sink, statehold runs `StatefulJob.transform_with_state` in ``foreachBatch`` (and the
batches without input its timers need). Per input file: rows, wall time of the triggers
it took (Spark: the data batch and its no-data timer batches), checkpoint time (Spark:
the state operator's commit time summed over tasks; statehold: tasks' snapshots + driver
completion), bytes new in the checkpoint location, and the location's size. At the end
the run waits out the TTL and feeds one more batch, so every user that left has expired;
storage then is compared with storage at the batch when the live set was first complete
(`active` cohorts, nothing expired yet): the goal is at most 1.3x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sessions import INPUT_DDL, OUTPUT_DDL, Sessions, SessionsWorkload, write_file
from _workload import listing, make_session, new_bytes

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
Step = dict[str, Any]


def _events(session: Any, source: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        session.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", 1)
        .parquet(str(source)).withColumn("event_time", F.timestamp_seconds("ts"))
    )


def _put(f: Path, source: Path, index: int) -> None:
    tmp = source / f".{f.name}.tmp"
    shutil.copyfile(f, tmp)
    os.utime(tmp, (1_600_000_000 + index, 1_600_000_000 + index))  # the source's order
    os.replace(tmp, source / f.name)


def _drive(
    query: Any, files: list[Path], source: Path, root: Path,
    measure: Callable[[list[dict[str, Any]]], tuple[float, float]], log: Callable[[str], None],
    name: str, before_last: Callable[[], None],
    breakdown: Callable[[], dict[str, int]] | None = None,
) -> list[Step]:
    """Feed the files one at a time; per file, the progress of every trigger it took."""
    steps: list[Step] = []
    seen = 0
    before = listing(root)
    for i, f in enumerate(files):
        if i == len(files) - 1:
            before_last()
        _put(f, source, i)
        query.processAllAvailable()
        if query.exception() is not None:
            raise RuntimeError(f"{name} failed: {query.exception()}")
        progress = [dict(p) for p in query.recentProgress][seen:]
        seen += len(progress)
        after = listing(root)
        up, nfiles = new_bytes(before, after)
        before = after
        seconds, checkpoint = measure(progress)
        step = {"file": i, "rows": sum(int(p["numInputRows"]) for p in progress),
                "triggers": len(progress), "seconds": seconds, "checkpoint_seconds": checkpoint,
                "bytes_uploaded": up, "files_uploaded": nfiles,
                "storage_bytes": sum(after.values())}
        if breakdown is not None:
            step["storage_by_part"] = breakdown()
        steps.append(step)
        log(f"  {name} file {i}: {step['rows']} rows in {step['triggers']} trigger(s) "
            f"{seconds:.2f}s, checkpoint {checkpoint:.2f}s, {up / 2**20:.2f} MiB up, "
            f"storage {step['storage_bytes'] / 2**20:.2f} MiB"
            + (f" {step['storage_by_part']}" if breakdown is not None else ""))
    return steps


def run_spark(spark: Any, w: SessionsWorkload, files: list[Path], work: Path,
              partitions: int, wait: Callable[[], None], log: Callable[[str], None],
              _backend_options: dict[str, Any]) -> list[Step]:
    session = spark.newSession()
    for k, v in {"spark.sql.streaming.stateStore.providerClass": PROVIDER,
                 "spark.sql.shuffle.partitions": str(partitions),
                 "spark.sql.streaming.minBatchesToRetain": "3"}.items():
        session.conf.set(k, v)
    source, checkpoint = work / "source", work / "checkpoint"
    source.mkdir(parents=True)
    out = (
        _events(session, source).withWatermark("event_time", f"{w.delay} seconds")
        .groupBy("user").transformWithStateInPandas(
            statefulProcessor=Sessions(w.gap, w.ttl_ms), outputStructType=OUTPUT_DDL,
            outputMode="Append", timeMode="EventTime")
    )
    query = (out.writeStream.format("noop").outputMode("append")
             .option("checkpointLocation", str(checkpoint)).start())

    def measure(progress: list[dict[str, Any]]) -> tuple[float, float]:
        seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        commit = sum(op.get("commitTimeMs", 0) for p in progress
                     for op in p.get("stateOperators") or []) / 1000
        return seconds, commit

    try:
        return _drive(query, files, source, checkpoint, measure, log, "spark", wait)
    finally:
        query.stop()


def run_statehold(spark: Any, w: SessionsWorkload, files: list[Path], work: Path,
                  partitions: int, wait: Callable[[], None],
                  log: Callable[[str], None], backend_options: dict[str, Any]) -> list[Step]:
    from statehold.spark import StatefulJob

    source = work / "source"
    source.mkdir(parents=True)
    job = StatefulJob(spark, str(work / "jobs"), "sessions", max_parallelism=128,
                      parallelism=partitions, retain=3, local_dir=str(work / "local"),
                      backend_options=backend_options)
    checkpoint_seconds: list[float] = []

    def noop(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    def one(df: Any) -> None:
        r = job.transform_with_state(
            df, Sessions(w.gap, w.ttl_ms), OUTPUT_DDL, key="user", time_mode="EventTime",
            event_time_column="event_time", watermark_delay=w.delay * 1000, sink=noop)
        checkpoint_seconds.append(r.snapshot_seconds + r.complete_seconds)

    def batch(df: Any, _spark_batch_id: int) -> None:
        one(df)
        while job.timers_due():  # the batches without input its timers need
            one(df.limit(0))

    query = (_events(spark, source).writeStream.foreachBatch(batch)
             .option("checkpointLocation", job.spark_checkpoint_location).start())

    def measure(progress: list[dict[str, Any]]) -> tuple[float, float]:
        seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        spent = sum(checkpoint_seconds)
        checkpoint_seconds.clear()
        return seconds, spent

    def breakdown() -> dict[str, int]:
        """Where the job directory's bytes are: the newest checkpoint's files (its live
        state), files only older retained checkpoints hold, Spark's own checkpoint
        (`_spark/`), and the rest (HA pointers, history, metadata documents)."""
        from ttl_churn import compacted_bytes

        from statehold.storage import open_storage
        from statehold.tools import du

        usage = du(str(work / "jobs" / "sessions"))
        held = [c for c in usage.by_checkpoint if c.retained]
        newest = max(held, key=lambda c: c.checkpoint_id or 0) if held else None
        newest_bytes = newest.referenced_bytes if newest else 0
        live = 0 if newest is None else compacted_bytes(
            open_storage(str(work / "jobs" / "sessions")), f"{newest.path}/_metadata",
            work / "compacted")
        spark = usage.by_scope.get("spark", 0)
        return {"live_state": live, "newest_checkpoint": newest_bytes,
                "older_retained": usage.referenced_bytes - newest_bytes,
                "spark_checkpoint": spark,
                "other": usage.total_bytes - usage.referenced_bytes - spark}

    try:
        return _drive(query, files, source, work / "jobs" / "sessions", measure, log,
                      "statehold", wait, breakdown)
    finally:
        query.stop()
        job.coordinator.cleaner.wait_idle(60)
        job.close()


def summary(steps: list[Step], w: SessionsWorkload) -> dict[str, float]:
    steady = steps[1:-1]  # not the first file (empty state), not the one after the wait
    reference = steps[w.active - 1]["storage_bytes"]  # the live set first complete
    return {
        "rows_per_second": sum(s["rows"] for s in steady) / sum(s["seconds"] for s in steady),
        "checkpoint_seconds_median": sorted(s["checkpoint_seconds"] for s in steady)[
            len(steady) // 2],
        "bytes_uploaded_median": sorted(s["bytes_uploaded"] for s in steady)[len(steady) // 2],
        "storage_peak_bytes": max(s["storage_bytes"] for s in steps),
        "storage_live_reference_bytes": reference,
        "storage_end_bytes": steps[-1]["storage_bytes"],
        "storage_end_over_live": steps[-1]["storage_bytes"] / reference,
        **_parts(steps, w),
    }


def _parts(steps: list[Step], w: SessionsWorkload) -> dict[str, float]:
    """statehold's storage by part at the end, and against the live state it holds (the
    newest checkpoint's entries fully compacted) from the first file where expiry runs on:
    the newest checkpoint (the state's own storage) and the job directory."""
    if "storage_by_part" not in steps[-1]:
        return {}
    end = steps[-1]["storage_by_part"]
    steady = [s for s in steps[w.active + 1:] if s["storage_by_part"]["live_state"]]
    newest = [s["storage_by_part"]["newest_checkpoint"] / s["storage_by_part"]["live_state"]
              for s in steady]
    total = [s["storage_bytes"] / s["storage_by_part"]["live_state"] for s in steady]
    return {
        **{f"{k}_end_bytes": end[k] for k in end},
        "newest_over_live_state_median": statistics.median(newest),
        "newest_over_live_state_max": max(newest),
        "storage_over_live_state_median": statistics.median(total),
        "storage_over_live_state_max": max(total),
        "bytes_uploaded_mean": statistics.mean(s["bytes_uploaded"] for s in steps[1:-1]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=2000, help="users per cohort")
    ap.add_argument("--active", type=int, default=3, help="batches a cohort stays active")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--ttl-seconds", type=float, default=0.0,
                    help="profiles' TTL (0: none, the session's timer clears them; Spark "
                    "refuses a TTL with event-time timers)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--systems", default="statehold,spark",
                    help="comma-separated: statehold, spark (default both)")
    ap.add_argument("--max-garbage", type=float, default=None,
                    help="statehold's backend option (default 0.25): garbage share that "
                    "compacts a task's DB")
    ap.add_argument("--work", default=None, help="work directory (default: a temp dir)")
    args = ap.parse_args()
    w = SessionsWorkload(args.users, args.active, args.batches,
                         ttl_ms=int(args.ttl_seconds * 1000) or None)
    work = Path(args.work or f"/tmp/statehold-bench-sessions-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    files = [work / "input" / f"{b:05d}.parquet" for b in range(w.batches + 1)]
    for b, f in enumerate(files):
        write_file(f, w.rows(b))

    def wait() -> None:  # every user that left expires before the last file
        if args.ttl_seconds:
            print(f"  waiting {args.ttl_seconds + 2:.0f}s for the TTL")
            time.sleep(args.ttl_seconds + 2)

    spark = make_session(args.partitions, driver_memory="2g")
    spark.sparkContext.setLogLevel("ERROR")
    started = time.monotonic()
    results = {}
    systems = args.systems.split(",")
    options = {"max_garbage": args.max_garbage} if args.max_garbage else {}
    for name, run in (("statehold", run_statehold), ("spark", run_spark)):
        if name not in systems:
            continue
        t0 = time.monotonic()
        steps = run(spark, w, files, work / name, args.partitions, wait, print, options)
        results[name] = {"steps": steps, "summary": summary(steps, w),
                         "wall_seconds": time.monotonic() - t0}
        print(name, json.dumps(results[name]["summary"], indent=1))
    ratios = {}
    if len(results) == 2:
        sh, sp = results["statehold"]["summary"], results["spark"]["summary"]
        ratios = {k: sh[k] / sp[k] for k in sh if sp.get(k)}
        results["statehold_over_spark"] = ratios
    results["workload"] = {**w.__dict__, "rows": sum(len(w.rows(b)) for b in range(w.batches + 1))}
    results["total_seconds"] = time.monotonic() - started
    (work / "results.json").write_text(json.dumps(results, indent=1))
    if ratios:
        print("statehold / spark:", json.dumps(ratios, indent=1))
    print(f"results in {work / 'results.json'} ({results['total_seconds']:.0f}s)")


if __name__ == "__main__":
    main()
