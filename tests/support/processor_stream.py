"""A Structured Streaming driver for the processor tests: the sessions example's processor
(`statehold.examples.sessions.Sessions`) over a file source, through
``writeStream.foreachBatch(job.foreach_batch(processor, ...))`` with
``trigger(availableNow=True)``.

    PYTHONPATH=. python tests/support/processor_stream.py INPUT OUTPUT CHECKPOINTS
        [--spark-checkpoint DIR] [--gap-seconds S] [--watermark-delay-seconds S]
        [--azure-ca PEM] [--java-options OPTS]

One file per micro-batch (Spark's file source takes files in modification-time order);
the job's phase hook is `pause_hooks.pause_when_asked`, so ``STATEHOLD_TEST_PAUSE_AT`` stops the
driver where a test kills it. Prints one ``batch <checkpoint id> ...`` line per batch.

On an ``az://`` job directory Spark's own checkpoint goes through Hadoop's ABFS connector:
hadoop-azure (tests/support/infra/jvm.py) on the class path, `abfs_conf` from the
``AZURE_STORAGE_*`` variables; ``--azure-ca`` is the CA an emulator's TLS certificate is
signed by (for statehold's client; the JVM trusts it through ``--java-options``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from statehold.examples.sessions import EVENT_MS, INPUT_SCHEMA, OUTPUT_SCHEMA, Sessions
from statehold.spark import (
    BatchResult,
    StatefulJob,
    abfs_conf,
    local_session,
    replace_output,
)
from tests.support.pause_hooks import pause_when_asked


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("checkpoints")
    p.add_argument("--spark-checkpoint")
    p.add_argument("--gap-seconds", type=int, default=300)
    p.add_argument("--watermark-delay-seconds", type=int, default=120)
    p.add_argument("--azure-ca")
    p.add_argument("--java-options")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F

    conf: dict[str, str] = {}
    storage_options: dict[str, Any] = {}
    if args.checkpoints.startswith("az://"):
        from tests.support.infra import jvm

        # appended, so this driver's JVM maps Spark's archived classes (jvm.py says why)
        os.environ.update(jvm.appended_classpath(jvm.fetch(jvm.hadoop_azure())))
        conf.update(abfs_conf())
        if args.azure_ca:
            storage_options["root_certificate"] = Path(args.azure_ca).read_text()
    if args.java_options:
        conf["spark.driver.extraJavaOptions"] = args.java_options
        conf["spark.executor.extraJavaOptions"] = args.java_options
    spark = local_session("statehold-processor-stream", conf=conf)
    job = StatefulJob(spark, args.checkpoints, "sessions", max_parallelism=16, parallelism=2,
                      on_phase=pause_when_asked, storage_options=storage_options or None)
    print(f"spark checkpoint: {job.spark_checkpoint_location}", flush=True)

    def said(result: BatchResult) -> None:
        print(f"batch {result.checkpoint_id}: {result.rows_in} rows, {result.timers_fired} "
              f"timers, watermark {result.watermark_ms}", flush=True)

    events = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
              .json(args.input).withColumn(EVENT_MS, F.col("ts") * 1000))
    run = job.foreach_batch(
        Sessions(args.gap_seconds), OUTPUT_SCHEMA, key="user", sink=replace_output(args.output),
        time_mode="EventTime", event_time_column=EVENT_MS,
        watermark_delay=args.watermark_delay_seconds * 1000, on_batch=said,
    )
    query = (events.writeStream.foreachBatch(run)
             .option("checkpointLocation", args.spark_checkpoint or job.spark_checkpoint_location)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        job.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
