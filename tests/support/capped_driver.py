"""A Spark driver whose Python workers run under a real memory cap, for
tests/spark/test_task_memory.py (a process of its own: the cap and the Arrow batch size
are session settings, and the shared test session must keep its own).

``spark.executor.pyspark.memory`` makes each Python worker set ``RLIMIT_AS`` (its address
space) to the cap before it runs a task. The workers get ``MALLOC_ARENA_MAX=2`` and
Arrow's system allocator from the environment, so their address space at rest (~0.4 GB)
is close to what they use, not reserved arenas.

It runs, each printing one ``RESULT <json>`` line:

* ``control``: a task that holds its whole partition of the batch in Python (what a
  task did before it streamed) fails under the cap;
* ``function``: `run_batch` with a per-key function over the batch, output per key;
* ``hot``: a stateful processor with ``input_chunks`` over a batch where one key has most
  of the rows.

Usage: python -m tests.support.capped_driver WORKDIR CAP_MB ROWS_PER_KEY KEYS HOT_ROWS
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from statehold.processor import StatefulProcessor

PAYLOAD = 8000
BATCH_ROWS = 500


def batch(spark: Any, keys: int, rows_per_key: int, hot_rows: int) -> Any:
    """`keys` keys of `rows_per_key` rows and one key ``hot`` of `hot_rows` rows, each
    row with a PAYLOAD-byte payload (made on the JVM side)."""
    from pyspark.sql import functions as F

    plain = spark.range(keys * rows_per_key).select(
        F.format_string("k%05d", (F.col("id") % keys).cast("int")).alias("key"),
        F.col("id").alias("seq"),
    )
    hot = spark.range(hot_rows).select(F.lit("hot").alias("key"), F.col("id").alias("seq"))
    both = plain.unionByName(hot) if hot_rows else plain
    return both.withColumn("payload", F.expr(f"repeat('x', {PAYLOAD})"))


def per_key(key: Any, rows: Any, state: Any) -> Any:
    seen = state.value("rows")
    seen.update((seen.get() or 0) + len(rows))
    return [(key, len(rows), sum(len(r["payload"]) for r in rows))]


class ChunkCounter(StatefulProcessor):
    """Counts a key's rows and payload bytes chunk by chunk, keeping them in state."""

    input_chunks = True

    def init(self, handle: Any) -> None:
        self.total = handle.get_value_state("total", "rows long, bytes long")

    def handle_input_rows(self, key: Any, rows: Any, timer_values: Any) -> Any:
        n = size = chunks = 0
        for chunk in rows:
            chunks += 1
            n += len(chunk)
            size += sum(len(r["payload"]) for r in chunk)
        before = self.total.get() or (0, 0)
        self.total.update((before[0] + n, before[1] + size))
        return [(key, n, size, chunks)]



def hold_all(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = pa.Table.from_batches(list(batches)).to_pylist()
    yield pa.RecordBatch.from_pydict({"n": [len(rows)]})


def report(name: str, value: Any) -> None:
    print("RESULT " + json.dumps({"name": name, **value}), flush=True)


def main(argv: list[str]) -> None:
    import os

    from statehold.spark import StatefulJob
    from tests.support.spark_session import make_session

    workdir, cap_mb, rows_per_key, keys, hot_rows = argv[0], *map(int, argv[1:5])
    os.environ["MALLOC_ARENA_MAX"] = "2"
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    spark = make_session({
        "spark.executor.pyspark.memory": f"{cap_mb}m",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(BATCH_ROWS),
        "spark.sql.adaptive.enabled": "false",
    })
    spark.sparkContext.setLogLevel("ERROR")
    df = batch(spark, keys, rows_per_key, 0)
    try:
        held = df.repartition(2).mapInArrow(hold_all, "n long").collect()
        report("control", {"failed": False, "rows": sum(r.n for r in held)})
    except Exception as exc:  # noqa: BLE001 (the control is expected to fail)
        text = str(exc)
        memory = any(w in text for w in ("MemoryError", "Cannot allocate", "std::bad_alloc"))
        report("control", {"failed": True, "memory_error": memory, "error": text[-1500:]})

    job = StatefulJob(spark, f"{workdir}/ckpt", "capped", max_parallelism=16, parallelism=2,
                      local_dir=f"{workdir}/local", task_batch_rows=BATCH_ROWS)
    result = job.run_batch(df, per_key, "key string, n long, bytes long", key="key")
    out = {r.key: [r.n, r.bytes] for r in result.output.collect()}
    report("function", {"rows_in": result.rows_in, "keys": result.keys, "out": out})

    hot_df = batch(spark, keys, 2, hot_rows)
    pjob = StatefulJob(spark, f"{workdir}/ckpt", "capped-hot", max_parallelism=16,
                       parallelism=2, local_dir=f"{workdir}/local",
                       task_batch_rows=BATCH_ROWS)
    res = pjob.transform_with_state(hot_df, ChunkCounter(), "key string, n long, bytes long, "
                                    "chunks long", key="key")
    out = {r.key: [r.n, r.bytes, r.chunks] for r in res.output.collect()}
    report("hot", {"rows_in": res.rows_in, "keys": res.keys, "out": out})
    job.end()
    pjob.end()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
