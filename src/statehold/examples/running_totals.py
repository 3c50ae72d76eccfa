"""Running totals per key: the statehold example pipeline.

    python -m statehold.examples.running_totals            # demo data under ./statehold-demo/
    python -m statehold.examples.running_totals --kafka HOST:PORT --topic T --jars ...

Reads JSON-lines files (``*.jsonl``; fields ``key``: string, ``value``: integer) from
``--input`` in file-name order, ``--files-per-batch`` files per micro-batch, keeps per key
the count, the sum and the last 8 values in RocksDB state, and writes for each batch the
(key, count, sum) of the keys it touched to ``<output>/batch-<N>/`` (a replayed batch
replaces its own output). Each batch ends in checkpoint N in ``<checkpoints>/<job-id>/``
(a local directory or ``s3://bucket/prefix``; S3 settings from the usual ``AWS_*``
environment variables).

Where the input stands is part of each checkpoint: its ``source_position`` names the
files of the batch and the last file read. A run resumes after the last file of the
newest retained checkpoint, with batch id = that checkpoint's id + 1, so the job
directory alone is a complete restore point on any storage (this example does not use
Spark's streaming checkpoint, which on S3 would need the hadoop-aws connector and whose
file source orders files by modification time, not by name). Files added later with
names after the last file read are picked up by a later run (or, with
``--keep-running``, by the next poll); a file added with an earlier name is never read.
While it polls, it serves the savepoints and stops asked from outside (``statehold
savepoint JOB NAME``, ``statehold stop JOB [--savepoint NAME]``) as it does after each
batch; a stop ends the run with one ``stopped from outside ...`` line and exit status 0.

Malformed rows (a line that is not a JSON object, a missing or null key, a key that is
not a string, a value that is not an integer): the batch fails with an error naming the
file and the line, before any state is touched; nothing is checkpointed. Fix the file in
place and run again. Blank lines are skipped. Each file is read whole into one task's
memory (Spark's ``wholetext``), which gives exact line numbers and input order.

``main(argv, on_phase=hook)`` reports progress to a `statehold.spark.PhaseHook`: the
job's phases, plus ``in-task`` (in the Spark task, before a key's state is updated; the
hook is pickled to the executors) and ``job-end`` (all input processed, the job not yet
closed), e.g. for metrics, or for tests that kill the driver at a known point.

With ``--kafka BOOTSTRAP --topic T`` the input is a Kafka topic read with Structured
Streaming, and Spark's own checkpoint (the offsets) lives in ``<job>/_spark/``
(`statehold.examples.kafka_input`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from statehold.examples import common
from statehold.examples.kafka_input import run_kafka
from statehold.examples.totals import MalformedRowError, parse_line, totals_batch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from statehold.spark import BatchResult, PhaseHook, StatefulJob

PARSED_SCHEMA = "key string, value long, _file string, _line long, _error string"
DEFAULT_DIR = Path("statehold-demo")


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


# -- the source: files in name order, position kept in statehold's checkpoints -----------
def resume_point(job: StatefulJob) -> tuple[int, str | None]:
    """(next batch id, last file read) from the newest retained checkpoint."""
    latest = job.coordinator.latest()
    if latest is None:
        return 0, None
    key, meta = latest
    last_file = meta.source_position.get("last_file")
    if not isinstance(last_file, str):
        raise SystemExit(
            f"error: {job.job_dir}/{key} has no 'last_file' in its source position: it was "
            "not written by this example (or by an older version that kept Spark's offsets)"
        )
    return meta.checkpoint_id + 1, last_file


def parse_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark stage (mapInArrow) over whole files (columns ``value``, ``_path``): one row
    per non-blank line, or an ``_error`` row naming the line."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("key", pa.string()),
            ("value", pa.int64()),
            ("_file", pa.string()),
            ("_line", pa.int64()),
            ("_error", pa.string()),
        ]
    )
    for batch in batches:
        out: dict[str, list[Any]] = {name: [] for name in schema.names}
        for text, path in zip(
            batch.column("value").to_pylist(), batch.column("_path").to_pylist(), strict=True
        ):
            name = unquote(str(path).rsplit("/", 1)[-1])
            for number, line in enumerate((text or "").splitlines(), 1):
                if not line.strip():
                    continue
                key: str | None
                value: int | None
                error: str | None = None
                try:
                    key, value = parse_line(line)
                except ValueError as e:
                    key, value, error = None, None, f"{e}: {line.strip()[:300]!r}"
                for col, v in zip(schema.names, (key, value, name, number, error), strict=True):
                    out[col].append(v)
        yield pa.RecordBatch.from_pydict(out, schema=schema)


def read_files(spark: SparkSession, input_dir: Path, names: list[str]) -> DataFrame:
    """The rows of `names` (key, value, _file, _line, _error), read by Spark."""
    from pyspark.sql import functions as F

    whole = spark.read.text([str(input_dir / n) for n in names], wholetext=True)
    return whole.withColumn("_path", F.input_file_name()).mapInArrow(parse_files, PARSED_SCHEMA)


def check_rows(rows: DataFrame) -> None:
    """Fail the batch, naming the file and line, on any row we would have to guess about."""
    from pyspark.sql import functions as F

    bad = rows.where(F.col("_error").isNotNull()).orderBy("_file", "_line").limit(1).collect()
    if bad:
        row = bad[0]
        raise MalformedRowError(
            f"malformed input row in {row['_file']} line {row['_line']}: {row['_error']} "
            "(needs a non-null string 'key' and an integer 'value'); nothing was "
            "checkpointed: fix the file and run again"
        )


# -- running ---------------------------------------------------------------------------
def describe(result: BatchResult, files: list[str]) -> str:
    """The per-batch line: checkpoint id, bytes uploaded, duration, where it is."""
    return (
        f"batch {result.checkpoint_id}: checkpoint {result.checkpoint_id}, "
        f"{len(files)} file(s) {files[0]}..{files[-1]}, {result.rows_in} rows, "
        f"{result.keys} keys, uploaded {common.human(result.bytes_uploaded)} in "
        f"{result.files_uploaded} files (state {common.human(result.state_size)}), "
        f"{result.duration:.2f} s, {result.checkpoint_uri}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m statehold.examples.running_totals",
        description="Running count, sum and last 8 values per key, checkpointed by statehold.",
    )
    common.add_options(p, "running-totals", DEFAULT_DIR)
    p.add_argument("--retain", type=int, default=3)
    p.add_argument(
        "--restore-from",
        default=None,
        help="start a NEW job (--job-id) from another job's checkpoint (chk-N folder), a "
        "savepoint folder, or a job directory (its newest checkpoint); see --mode",
    )
    p.add_argument(
        "--mode",
        choices=["resume", "no-claim", "claim"],
        default=None,
        help="with --restore-from: no-claim (default; the source is never modified, the new "
        "job holds its own copies) or claim (the files move into the new job). resume is "
        "what every run without --restore-from does",
    )
    p.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                   help="read the Kafka topic --topic at these bootstrap servers (Structured "
                   "Streaming) instead of --input; see statehold.examples.kafka_input")
    p.add_argument("--topic", default=None, help="with --kafka: the topic")
    p.add_argument("--records-per-batch", type=int, default=1000,
                   help="with --kafka: at most this many records per micro-batch")
    p.add_argument("--jars", default="",
                   help="comma-separated local jars for Spark's class path: spark-sql-kafka "
                   "for --kafka, hadoop-aws for Spark's checkpoint on s3:// (with their "
                   "dependencies)")
    p.add_argument(
        "--ha",
        default=None,
        help="HA store: embedded or zookeeper://host:port[,host:port]/path (default: the "
        "one the job directory records; embedded for a new job)",
    )
    args = p.parse_args(argv)
    if args.files_per_batch < 1:
        p.error("--files-per-batch must be at least 1")
    if (args.kafka is None) != (args.topic is None):
        p.error("--kafka and --topic go together")
    if args.records_per_batch < 1:
        p.error("--records-per-batch must be at least 1")
    return args


def run(
    spark: SparkSession,
    job: StatefulJob,
    args: argparse.Namespace,
    on_phase: PhaseHook | None = None,
) -> int:
    """Process batches until no input is left (or, with --keep-running, until ^C or a
    stop asked from outside: ``statehold stop JOB``, served while waiting for input as
    after each batch, like ``statehold savepoint JOB NAME``)."""
    input_dir: Path = args.input.absolute()
    sink = common.output_sink(args)
    batch_id, last_file = resume_point(job)
    print(f"checkpoints: {job.job_dir}  (resuming at batch {batch_id}, after "
          f"{last_file or 'no file yet'})", flush=True)
    idle = False
    while not job.stop_requested:
        batches = common.next_batches(input_dir, last_file, args.files_per_batch)
        if not batches:
            if not args.keep_running:
                break
            said, idle = (None if idle else common.waiting_line(input_dir)), True
            if not common.wait_for_input(job, args.poll_seconds, said):
                break
            continue
        idle = False
        files = batches[0]
        position = {"input": str(input_dir), "files": files, "last_file": files[-1]}
        try:
            result = totals_batch(job, read_files(spark, input_dir, files), check_rows, sink,
                                  batch_id, ["_file", "_line"], position, on_phase)
        except MalformedRowError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(describe(result, files), flush=True)
        batch_id, last_file = batch_id + 1, files[-1]
    stopped = common.stopped_line(job)
    if stopped is not None:
        print(stopped, flush=True)
    elif on_phase is not None:
        on_phase("job-end", batch_id - 1)
    return 0


def main(argv: list[str] | None = None, on_phase: PhaseHook | None = None) -> int:
    args = parse_args(argv)
    mode = args.mode or ("no-claim" if args.restore_from else "resume")
    if (args.restore_from is None) != (mode == "resume"):
        print("error: --restore-from needs --mode no-claim or claim, and they need it; "
              "resume continues the job in --checkpoints/--job-id", file=sys.stderr)
        return 2
    input_dir: Path = args.input.absolute()
    if args.kafka is None and not common.list_inputs(input_dir):
        generate_demo(input_dir)
        print(f"no input in {input_dir}: generated a small demo data set there")

    def body(spark: SparkSession, job: StatefulJob) -> int:
        if args.kafka is not None:
            return run_kafka(spark, job, args, on_phase)
        return run(spark, job, args, on_phase)

    return common.run_job(args, "statehold-running-totals", body, args.jars, retain=args.retain,
                   ha=args.ha, restore_from=args.restore_from, restore_mode=mode,
                   on_phase=on_phase)


if __name__ == "__main__":
    sys.exit(main())
