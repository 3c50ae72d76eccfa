"""What the examples share: their common command-line options, the Spark session and the
`StatefulJob` they run in (`run_job`), their input files in name order and their output."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from statehold.spark import StatefulJob
    from statehold.spark.api import Sink


def add_options(p: argparse.ArgumentParser, job_id: str, demo: Path | None = None) -> None:
    """--input, --output, --checkpoints (defaults under `demo`, else required), --job-id,
    the parallelism, --files-per-batch, --master and polling."""
    roots = "checkpoint root: a directory or s3://bucket/prefix (S3 settings from AWS_*)"
    for name, kind, text in (("input", Path, None), ("output", Path, None),
                             ("checkpoints", str, roots)):
        where: dict[str, Any] = {"default": kind(demo / name)} if demo else {"required": True}
        p.add_argument(f"--{name}", type=kind, help=text, **where)
    p.add_argument("--job-id", default=job_id)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument("--files-per-batch", type=int, default=1)
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--keep-running", action="store_true", help="keep polling for new files")
    p.add_argument("--poll-seconds", type=float, default=2.0, help=argparse.SUPPRESS)


def run_job(
    args: argparse.Namespace,
    app_name: str,
    body: Callable[[SparkSession, StatefulJob], int],
    jars: str = "",
    **job_options: Any,
) -> int:
    """``body(spark, job)`` in a local session (``--master``; this interpreter as Spark's
    Python, the comma-separated local `jars` on the class path, s3a settings from ``AWS_*``
    for S3 checkpoints, ABFS ones from ``AZURE_STORAGE_*`` for Azure) with the job
    ``--checkpoints``/``--job-id``; both are closed after it. 130 on ^C; on any error one
    ``error: ...`` line on stderr and 1 (``STATEHOLD_DEBUG=1``: the traceback instead)."""
    try:
        return _run_job(args, app_name, body, jars, **job_options)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if os.environ.get("STATEHOLD_DEBUG"):
            raise
        print(f"error: {error_summary(e)}", file=sys.stderr, flush=True)
        return 1


def _run_job(
    args: argparse.Namespace,
    app_name: str,
    body: Callable[[SparkSession, StatefulJob], int],
    jars: str,
    **job_options: Any,
) -> int:
    from statehold.spark import StatefulJob, local_session
    from statehold.spark.session import abfs_conf, classpath_conf, s3a_conf

    conf = classpath_conf([j for j in jars.split(",") if j])
    if args.checkpoints.startswith(("s3://", "s3a://")):
        conf.update(s3a_conf())
    if args.checkpoints.startswith(("az://", "azure://", "abfs://", "abfss://")):
        conf.update(abfs_conf())
    spark = local_session(app_name, master=args.master, conf=conf)
    try:
        job = StatefulJob(spark, args.checkpoints, args.job_id,
                          max_parallelism=args.max_parallelism, parallelism=args.parallelism,
                          **job_options)
    except BaseException:
        spark.stop()
        raise
    try:
        code = body(spark, job)
    except BaseException:
        # The body's error is the one to report; closing after it may fail for the same
        # cause (an unreachable store) and must not hide it.
        try:
            with contextlib.suppress(Exception):
                job.close()
        finally:
            spark.stop()
        raise
    try:
        job.close()
    finally:
        spark.stop()
    return code


def wait_for_input(job: StatefulJob, seconds: float, waiting: str | None = None) -> bool:
    """Wait `seconds` for new input while serving the savepoints and stops asked from
    outside (``statehold savepoint``/``stop``): whether the job goes on (False: stopped).
    `waiting`: a line to print first (when the run has just become idle)."""
    if waiting is not None:
        print(waiting, flush=True)
    job.serve_requests()
    if job.stop_requested:
        return False
    time.sleep(seconds)
    return True


def waiting_line(input_dir: Path) -> str:
    """What an example prints once each time it runs out of input (``--keep-running``)."""
    return f"waiting for new files in {input_dir}"


def stopped_line(job: StatefulJob) -> str | None:
    """The line an example prints when a stop from outside ended its job (None: it was
    not stopped): ``stopped from outside after checkpoint N[; savepoint savepoints/S]``."""
    if job.stopped is None:
        return None
    return f"stopped from outside {job.stopped.message.removeprefix('stopped ')}"


def error_summary(error: BaseException, limit: int = 800) -> str:
    """One line for an error that ends a run: a statehold error's message; for Spark's
    (a JVM exception reached through py4j, a failed streaming query, whose messages go
    on with the query's plan and stack traces) the first line of the JVM exception."""
    from statehold.errors import StateholdError

    text = str(error)
    if not isinstance(error, StateholdError):
        java = getattr(error, "java_exception", None)
        if java is not None:
            with contextlib.suppress(Exception):  # the JVM may be gone already
                text = str(java.toString())
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        text = f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def output_sink(args: argparse.Namespace) -> Sink:
    """Each batch's output as one JSON-lines file in ``<--output>/batch-<N>/`` (a replayed
    batch replaces its own)."""
    from statehold.spark import replace_output

    sink = replace_output(str(args.output.absolute()), "json")
    return lambda df, n: sink(df.coalesce(1), n)


def list_inputs(input_dir: Path) -> list[str]:
    """The input files' names (``*.jsonl``), in name order."""
    return sorted(p.name for p in input_dir.glob("*.jsonl") if p.is_file())


def next_batches(input_dir: Path, last_file: str | None, per_batch: int) -> list[list[str]]:
    """The input files after `last_file`, in batches of `per_batch` (the last may be
    smaller)."""
    todo = [n for n in list_inputs(input_dir) if last_file is None or n > last_file]
    return [todo[i : i + per_batch] for i in range(0, len(todo), per_batch)]


def human(n: float) -> str:
    """A byte count for people: 512 B, 1.5 KiB, ..."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
