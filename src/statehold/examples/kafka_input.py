"""The running-totals example reading a Kafka topic with Structured Streaming.

    python -m statehold.examples.running_totals --kafka HOST:PORT --topic T \\
        --jars <spark-sql-kafka and its dependencies, comma-separated>

Each record's value is one JSON object as in the file input (``{"key": ..., "value": ...}``;
the record's own Kafka key is not used, but producing with the same key keeps one key's
records in one partition, in order). ``readStream.format("kafka")`` reads at most
``--records-per-batch`` records per micro-batch; ``StatefulJob`` turns batch N into
checkpoint N, and Spark's streaming checkpoint (the Kafka offsets of each batch) is
``<job directory>/_spark/``, so the job directory alone is a complete restore point. On
S3 that needs the hadoop-aws connector on the class path (``--jars``) for ``s3a://``.

Exactly once across a crash: Spark replays its last uncommitted batch with the same
offsets; a batch statehold already checkpointed is skipped, any other restores from the
previous checkpoint, and the sink replaces the batch's output.

Without ``--keep-running`` the query processes what the topic holds when it starts
(``Trigger.AvailableNow``, in batches of ``--records-per-batch``) and stops. With it, the
query runs until ^C or a stop asked from outside (``statehold stop JOB``), served after a
micro-batch or while the topic is idle (``job.stream_batches``), as ``statehold savepoint``
is; a stop prints one ``stopped from outside ...`` line and exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from statehold.examples.common import human, output_sink, stopped_line
from statehold.examples.totals import MalformedRowError, parse_line, totals_batch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from statehold.spark import BatchResult, PhaseHook, StatefulJob

KAFKA_PARSED = "key string, value long, partition int, offset long, _error string"


def parse_records(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark stage (mapInArrow) over Kafka records (``_text``, ``partition``, ``offset``):
    one row per record, or an ``_error`` row naming what is wrong with it."""
    import pyarrow as pa

    schema = pa.schema([("key", pa.string()), ("value", pa.int64()), ("partition", pa.int32()),
                        ("offset", pa.int64()), ("_error", pa.string())])
    for batch in batches:
        out: dict[str, list[Any]] = {name: [] for name in schema.names}
        for text, partition, offset in zip(
            batch.column("_text").to_pylist(), batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(), strict=True,
        ):
            key: str | None
            value: int | None
            error: str | None = None
            try:
                key, value = parse_line(text or "")
            except ValueError as e:
                key, value, error = None, None, f"{e}: {(text or '')[:300]!r}"
            for col, v in zip(schema.names, (key, value, partition, offset, error), strict=True):
                out[col].append(v)
        yield pa.RecordBatch.from_pydict(out, schema=schema)


def kafka_rows(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The topic as a stream of (key, value, partition, offset, _error) rows."""
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.kafka)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.records_per_batch))
        .option("failOnDataLoss", "true")
        .load()
    )
    return raw.select(
        F.col("value").cast("string").alias("_text"), "partition", "offset"
    ).mapInArrow(parse_records, KAFKA_PARSED)


def check_records(rows: DataFrame, topic: str) -> None:
    from pyspark.sql import functions as F

    bad = rows.where(F.col("_error").isNotNull()).orderBy("partition", "offset").limit(1)
    for row in bad.collect():
        raise MalformedRowError(
            f"malformed record in {topic} partition {row['partition']} offset "
            f"{row['offset']}: {row['_error']} (needs a JSON object with a non-null string "
            "'key' and an integer 'value'); nothing was checkpointed"
        )


def describe(result: BatchResult, topic: str) -> str:
    return (
        f"batch {result.checkpoint_id}: checkpoint {result.checkpoint_id}, "
        f"{result.rows_in} records from {topic}, {result.keys} keys, uploaded "
        f"{human(result.bytes_uploaded)} in {result.files_uploaded} files (state "
        f"{human(result.state_size)}), {result.duration:.2f} s, {result.checkpoint_uri}"
    )


def run_kafka(
    spark: SparkSession,
    job: StatefulJob,
    args: argparse.Namespace,
    on_phase: PhaseHook | None = None,
) -> int:
    """Run the streaming query until the topic's records at start are processed (or, with
    --keep-running, until ^C). 1 on a malformed record; the error that failed a batch is
    raised as itself (not as the streaming query's failure, whose message carries it
    inside a Python traceback, the query's plan and JVM stack traces)."""
    sink = output_sink(args)
    malformed: list[MalformedRowError] = []
    failed: list[Exception] = []

    def per_batch(batch_df: DataFrame, batch_id: int) -> None:
        try:
            job.check_replay(batch_id)
            result = totals_batch(job, batch_df, lambda rows: check_records(rows, args.topic),
                                  sink, batch_id, ["partition", "offset"],
                                  {"topic": args.topic}, on_phase)
        except MalformedRowError as e:
            malformed.append(e)
            raise
        except Exception as e:  # a statehold error, or Spark's from a job of the batch
            failed.append(e)
            raise
        if result.skipped:
            print(f"batch {batch_id}: already checkpointed (a replay): skipped", flush=True)
        else:
            print(describe(result, args.topic), flush=True)

    print(f"checkpoints: {job.job_dir}  (Spark's offsets in {job.spark_checkpoint_location})",
          flush=True)
    writer = (
        kafka_rows(spark, args).writeStream.foreachBatch(job.stream_batches(per_batch))
        .option("checkpointLocation", job.spark_checkpoint_location)
    )
    if args.keep_running:
        writer = writer.trigger(processingTime=f"{args.poll_seconds} seconds")
    else:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception:
        if job.stop_requested and not malformed and not failed:
            pass  # a micro-batch that began as a stop while idle stopped the query: not run
        elif malformed:
            import sys

            print(f"error: {malformed[0]}", file=sys.stderr)
            return 1
        elif failed:
            raise failed[-1] from None
        else:
            raise
    finally:
        if query.isActive:
            query.stop()
    stopped = stopped_line(job)
    if stopped is not None:
        print(stopped, flush=True)
    elif on_phase is not None:
        latest = job.latest_checkpoint_id()
        on_phase("job-end", -1 if latest is None else latest)
    return 0
