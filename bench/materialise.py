"""What keeping a batch's staged result costs: ``persist(MEMORY_AND_DISK)`` (what statehold
does: a block lost with its executor is recomputed from lineage) against
``localCheckpoint(eager=True)`` (what it did: lost blocks fail the batch).

    python bench/materialise.py                             # local-cluster[2,1,1024]
    python bench/materialise.py --keys 100000 --batches 10

One job on `--master`; batch 0 writes `--keys` keys, each later batch updates `--changed`
of them and its output goes to a Parquet sink. The two ways take turns in the order
ABBA BAAB ... from batch 1 on (the same job, state and load; a machine warming up or
getting busier favours neither); per batch it prints the duration, and at the end the
median of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MODES = ("persist", "localCheckpoint")


def abba(i: int) -> int:
    """0 or 1 for the i-th measured batch: ABBA BAAB ABBA ..."""
    quad, pos = divmod(i, 4)
    first = (0, 1, 1, 0)[pos]
    return first if quad % 2 == 0 else 1 - first


@contextmanager
def local_checkpoints() -> Iterator[None]:
    """Make the staged result's ``persist`` a ``localCheckpoint(eager=True)`` meanwhile."""
    from pyspark.sql import DataFrame

    persist = DataFrame.persist
    DataFrame.persist = lambda self, *_a, **_k: self.localCheckpoint(eager=True)  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataFrame.persist = persist  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--changed", type=float, default=0.2, help="share of keys per batch")
    p.add_argument("--batches", type=int, default=8, help="after batch 0; of 4")
    args = p.parse_args(argv)

    os.environ.pop("STATEHOLD_LOCAL_DIR", None)
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from statehold.examples.running_totals import OUTPUT_SCHEMA, update_totals
    from statehold.spark import StatefulJob, checkpoint_run, local_session

    spark = local_session("statehold-materialise", master=args.master)
    root = tempfile.mkdtemp(prefix="statehold-materialise-")
    job = StatefulJob(spark, root, "materialise", max_parallelism=64, parallelism=2, retain=2)
    stage = checkpoint_run.stage
    mode = {"now": "persist"}

    def staged(*a: Any, **k: Any) -> DataFrame:
        if mode["now"] == "persist":
            return stage(*a, **k)
        with local_checkpoints():
            return stage(*a, **k)

    checkpoint_run.stage = staged  # type: ignore[assignment]

    def sink(output: DataFrame, batch_id: int) -> None:
        output.write.mode("overwrite").parquet(f"{root}/output/batch-{batch_id}")

    n, changed = args.keys, max(1, int(args.keys * args.changed))
    seconds: dict[str, list[float]] = {"persist": [], "localCheckpoint": []}
    write: Callable[[str], None] = print
    try:
        for batch in range(args.batches + 1):
            count = n if batch == 0 else changed
            ids = spark.range(count).select(((F.col("id") * 7919 + batch * 104729) % n)
                                            .alias("i"))
            df = ids.select(F.concat(F.lit("k"), F.col("i").cast("string")).alias("key"),
                            (F.col("i") % 100).alias("value"))
            mode["now"] = MODES[abba(batch - 1)] if batch else "localCheckpoint"
            started = time.perf_counter()
            job.run_batch(df, update_totals, OUTPUT_SCHEMA, key="key", batch_id=batch,
                          sink=sink)
            took = time.perf_counter() - started
            if batch:
                seconds[mode["now"]].append(took)
            write(json.dumps({"batch": batch, "mode": mode["now"], "seconds": round(took, 2)}))
        job.end()
    finally:
        job.close()
        spark.stop()
    medians = {m: statistics.median(s) for m, s in seconds.items()}
    write(json.dumps({"median_seconds": {m: round(v, 2) for m, v in medians.items()},
                      "persist_over_localCheckpoint":
                          round(medians["persist"] / medians["localCheckpoint"], 3),
                      "keys": n, "changed": changed, "master": args.master,
                      "load": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
