"""Restore downloads on a cluster: bytes each batch downloads to restore state, beside the
bytes of state, when Spark moves tasks between executors.

    python bench/cluster_locality.py                        # local-cluster[2,1,1024]
    python bench/cluster_locality.py --master spark://127.0.0.1:7077 --keys 400000

Batch 0 writes `--keys` keys (the running-totals example's state: count, sum, last
values); each of the next `--batches` batches updates `--changed` of them. Parallelism 2 on
two single-core executors: Spark places the two stateful tasks on whichever executor
offers a slot first, so a task often runs where its range was not. Every executor keeps
its local snapshots in its own scratch directory (``SPARK_EXECUTOR_DIRS``), as on
separate machines. Per batch it prints the bytes downloaded (summed over the tasks, as the
driver's `BatchResult` and the checkpoint history report them) and the state's bytes; the
summary is the steady state (from batch 2 on: batch 1 is the first restore anywhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--changed", type=float, default=0.02, help="share of keys per batch")
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--checkpoints", default=None, help="default: a temp directory")
    args = p.parse_args(argv)

    os.environ.pop("STATEHOLD_LOCAL_DIR", None)  # each executor's own scratch directory
    from pyspark.sql import functions as F

    from statehold.examples.totals import OUTPUT_SCHEMA, update_totals
    from statehold.spark import StatefulJob, local_session

    spark = local_session("statehold-cluster-locality", master=args.master)
    root = args.checkpoints or tempfile.mkdtemp(prefix="statehold-locality-")
    job = StatefulJob(spark, root, "locality", max_parallelism=64, parallelism=2, retain=2)
    n, changed = args.keys, max(1, int(args.keys * args.changed))
    rows = []
    try:
        for batch in range(args.batches + 1):
            count = n if batch == 0 else changed
            # a different, spread-out slice of the keys each batch (a stride coprime to n)
            ids = spark.range(count).select(((F.col("id") * 7919 + batch * 104729) % n)
                                            .alias("i"))
            df = ids.select(F.concat(F.lit("k"), F.col("i").cast("string")).alias("key"),
                            (F.col("i") % 100).alias("value"))
            started = time.perf_counter()
            result = job.run_batch(df, update_totals, OUTPUT_SCHEMA, key="key",
                                   batch_id=batch)
            row = {"batch": batch, "state_bytes": result.state_size,
                   "downloaded_bytes": result.bytes_downloaded,
                   "downloaded_files": result.files_downloaded,
                   "uploaded_bytes": result.bytes_uploaded,
                   "seconds": round(time.perf_counter() - started, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        job.close()
        spark.stop()
    steady = rows[2:]
    shares = [r["downloaded_bytes"] / r["state_bytes"] for r in steady if r["state_bytes"]]
    summary = {
        "master": args.master, "keys": n, "changed_per_batch": changed,
        "batches": len(steady), "state_bytes_last": rows[-1]["state_bytes"],
        "downloaded_mean_bytes": round(statistics.mean(r["downloaded_bytes"] for r in steady)),
        "downloaded_max_bytes": max(r["downloaded_bytes"] for r in steady),
        "download_share_mean": round(statistics.mean(shares), 4),
        "download_share_max": round(max(shares), 4),
        "batches_with_downloads": sum(1 for r in steady if r["downloaded_bytes"]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
    }
    print("summary " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
