"""A Structured Streaming driver operated from outside (``statehold savepoint JOB NAME``,
``statehold stop JOB``): Spark's ``rate-micro-batch`` source (every micro-batch the next
`ROWS` values, contiguous from 0, the same across restarts) through
``writeStream.foreachBatch(job.foreach_batch(...))``, with nothing in this code about
requests: the job serves them itself.

    PYTHONPATH=. python tests/support/operated_stream.py CHECKPOINTS JOB_ID OUTPUT [INPUT]

With INPUT, a JSON file source over that directory instead (``{"value": N}`` lines, one
file per micro-batch): a query that is idle until a test adds a file.

Per key (value % KEYS) the state holds the count of values and the largest one seen, so
a reader can tell exactly-once: every value 0..max counted once. Prints ``batch <id>``
per batch and ``ended <message>`` when the query ends.
"""

from __future__ import annotations

import sys
from typing import Any

from statehold.spark import BatchResult, KeyedState, StatefulJob, local_session, replace_output

KEYS = 5
ROWS = 10
OUTPUT_SCHEMA = "key long, n long, top long"


def count(key: Any, rows: list[dict[str, Any]], state: KeyedState) -> list[tuple[Any, int, int]]:
    """Per key: how many values so far, and the largest."""
    n, top = state.value("n"), state.value("top")
    n.update((n.get() or 0) + len(rows))
    top.update(max([top.get() or -1, *(int(r["value"]) for r in rows)]))
    return [(key, n.get(), top.get())]


def main(argv: list[str]) -> int:
    checkpoints, job_id, output, *files = argv
    spark = local_session("statehold-operated-stream")
    job = StatefulJob(spark, checkpoints, job_id, max_parallelism=8, parallelism=2, retain=2)

    def said(result: BatchResult) -> None:
        print(f"batch {result.checkpoint_id}", flush=True)

    from pyspark.sql import functions as F

    if files:
        source = (spark.readStream.schema("value long").option("maxFilesPerTrigger", 1)
                  .json(files[0]))
    else:
        source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS).load()
    rows = source.select((F.col("value") % KEYS).alias("key"), "value")
    query = (rows.writeStream
             .foreachBatch(job.foreach_batch(count, OUTPUT_SCHEMA, sink=replace_output(output),
                                             on_batch=said))
             .option("checkpointLocation", job.spark_checkpoint_location)
             .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    try:
        query.awaitTermination()
        print(f"ended {job.stopped.message if job.stopped else 'without a stop'}", flush=True)
    finally:
        job.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
