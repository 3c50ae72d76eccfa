"""Running totals per key: the statehold example pipeline.

    python -m statehold.examples.running_totals            # demo data under ./statehold-demo/

Reads JSON-lines files (``*.jsonl``; fields ``key``: string, ``value``: integer) from
``--input`` with Structured Streaming, ``--files-per-batch`` files per micro-batch (in
file-name order when the files were written in that order: Spark's file source takes them
oldest first), keeps per key the count, the sum and the last 8 values in RocksDB state,
and writes for each batch the (key, count, sum) of the keys it touched to
``<output>/batch-<N>/`` (a replayed batch replaces its own output). Each batch ends in
checkpoint N in ``<checkpoints>/<job-id>/``, which also holds Spark's own streaming
checkpoint (``_spark/``), so the job directory alone is a complete restore point. It
processes all available input and exits (``--keep-running`` keeps polling); a later run
resumes from the newest checkpoint and picks up files added since.

Malformed rows (a missing or null key, a value that is not an integer, a line that is not
JSON): the batch fails with an error naming the file and the row, before any state is
touched; nothing is checkpointed. Fix the file in place and run again.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from statehold.spark import BatchResult, KeyedState

LAST_N = 8
OUTPUT_SCHEMA = "key string, count long, sum long"
INPUT_SCHEMA = "key string, value long, _corrupt string"
DEFAULT_DIR = Path("statehold-demo")


class MalformedRowError(ValueError):
    """An input row the running totals cannot use."""


def update_totals(key: str, rows: list[dict[str, Any]], state: KeyedState) -> list[tuple[Any, ...]]:
    """The stateful step for one key: rows of this batch in input order."""
    count, total, last = state.value("count"), state.value("sum"), state.list("last")
    values = [int(r["value"]) for r in rows]
    n = (count.get() or 0) + len(values)
    s = (total.get() or 0) + sum(values)
    count.update(n)
    total.update(s)
    last.update((last.get() + values)[-LAST_N:])
    return [(key, n, s)]


def generate_demo(input_dir: Path, files: int = 4, rows: int = 250, keys: int = 40) -> None:
    """A small deterministic data set, so the example runs on a fresh machine."""
    rng = random.Random(42)
    input_dir.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        lines = [
            json.dumps({"key": f"user-{rng.randrange(keys):03d}", "value": rng.randrange(1, 100)})
            for _ in range(rows)
        ]
        (input_dir / f"part-{i:05d}.jsonl").write_text("\n".join(lines) + "\n")


def check_rows(batch: DataFrame) -> None:
    """Fail the batch, naming the file and row, on any row we would have to guess about."""
    from pyspark.sql import functions as F

    bad = batch.where(
        F.col("_corrupt").isNotNull() | F.col("key").isNull() | F.col("value").isNull()
    ).limit(1).collect()
    if bad:
        row = bad[0]
        raw = row["_corrupt"] or json.dumps({"key": row["key"], "value": row["value"]})
        raise MalformedRowError(
            f"malformed input row in {row['_file']}: {raw.strip()[:300]!r} (needs a non-null "
            "string 'key' and an integer 'value'); nothing was checkpointed: fix the file "
            "and run again"
        )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m statehold.examples.running_totals",
        description="Running count, sum and last 8 values per key, checkpointed by statehold.",
    )
    p.add_argument("--input", type=Path, default=DEFAULT_DIR / "input")
    p.add_argument("--output", type=Path, default=DEFAULT_DIR / "output")
    p.add_argument("--checkpoints", default=str(DEFAULT_DIR / "checkpoints"))
    p.add_argument("--job-id", default="running-totals")
    p.add_argument("--retain", type=int, default=3)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--files-per-batch", type=int, default=1)
    p.add_argument("--keep-running", action="store_true", help="keep polling for new files")
    p.add_argument("--restore-from", default=None, help="(not supported yet)")
    p.add_argument("--mode", choices=["resume", "no-claim", "claim"], default="resume")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument(
        "--ha",
        default="embedded",
        help="HA store: embedded (default) or zookeeper://host:port[,host:port]/path",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.restore_from is not None or args.mode != "resume":
        print("error: only --mode resume (the default) is supported so far", file=sys.stderr)
        return 2
    input_dir: Path = args.input.absolute()
    if not any(input_dir.glob("*.jsonl")):
        generate_demo(input_dir)
        print(f"no input in {input_dir}: generated a small demo data set there")

    from pyspark.sql import functions as F

    from statehold.spark import StatefulJob, local_session, replace_output

    spark = local_session("statehold-running-totals", master=args.master)
    job = StatefulJob(
        spark,
        args.checkpoints,
        args.job_id,
        max_parallelism=args.max_parallelism,
        parallelism=args.parallelism,
        retain=args.retain,
        ha=args.ha,
    )
    sink = replace_output(str(args.output.absolute()), "json")

    def on_batch(result: BatchResult) -> None:
        if result.skipped:
            print(f"batch {result.checkpoint_id}: already checkpointed (replay), skipped")
            return
        print(
            f"batch {result.checkpoint_id}: checkpoint {result.checkpoint_id}, "
            f"{result.rows_in} rows, {result.keys} keys, uploaded "
            f"{_human(result.bytes_uploaded)} in {result.files_uploaded} files "
            f"(state {_human(result.state_size)}), {result.duration:.2f} s, "
            f"{result.checkpoint_uri}",
            flush=True,
        )

    def process(batch: DataFrame, batch_id: int) -> None:
        job.check_replay(batch_id)
        # File, block and position give the rows of a key their input order.
        batch = (
            batch.withColumn("_file", F.input_file_name())
            .withColumn("_block", F.input_file_block_start())
            .withColumn("_pos", F.monotonically_increasing_id())
            .persist()
        )
        try:
            if job.latest_checkpoint_id() != batch_id:
                check_rows(batch)
            result = job.run_batch(
                batch.drop("_corrupt"),
                update_totals,
                OUTPUT_SCHEMA,
                key="key",
                batch_id=batch_id,
                order_by=["_file", "_block", "_pos"],
                sink=lambda df, n: sink(df.coalesce(1), n),
            )
        finally:
            batch.unpersist()
        on_batch(result)

    stream = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_batch)
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .json(str(input_dir))
    )
    writer = (
        stream.writeStream.foreachBatch(process)
        .option("checkpointLocation", job.spark_checkpoint_location)
    )
    writer = (
        writer.trigger(processingTime="2 seconds")
        if args.keep_running
        else writer.trigger(availableNow=True)
    )
    print(f"checkpoints: {job.job_dir}  (Spark offsets in {job.spark_checkpoint_location})")
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except Exception as e:  # a failed batch: say why, without the JVM stack trace
        message = str(e).strip().splitlines()
        cause = next((m for m in message if "MalformedRowError" in m), None)
        print(f"error: {cause or (message[0] if message else type(e).__name__)}",
              file=sys.stderr)
        return 1
    finally:
        job.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
