"""The commands on a Spark checkpoint location (a Structured Streaming query's
``checkpointLocation``): each shared command (list, inspect, verify, du, gc, history)
hands its argument here when it names one (`spark_checkpoint_at`), and savepoint,
rollback and relocate start here."""

from __future__ import annotations

from typing import Annotated

import typer

from statehold.cli.common import error_line, fail
from statehold.cli.output import say, size, table, when
from statehold.spark_checkpoints import history as spark_history
from statehold.spark_checkpoints import reports
from statehold.spark_checkpoints.location import SparkCheckpoint, looks_like_spark_checkpoint
from statehold.storage import StorageError, open_storage

BatchOption = Annotated[
    int | None,
    typer.Option(
        "--batch",
        min=0,
        help="A Spark checkpoint location only: the batch a restart starts after (default: "
        "the newest committed).",
    ),
]


def spark_checkpoint_at(location: str) -> SparkCheckpoint | None:
    """The Spark checkpoint location at `location`; None for a statehold job directory
    or anything else (whose own command then says what it is)."""
    try:
        storage = open_storage(location)
        return SparkCheckpoint(storage) if looks_like_spark_checkpoint(storage) else None
    except StorageError:
        return None


def emit_json(result: object) -> None:
    typer.echo(result.model_dump_json(indent=2))  # type: ignore[attr-defined]


def list_spark(checkpoint: SparkCheckpoint, as_json: bool) -> None:
    result = reports.listing(checkpoint)
    if as_json:
        emit_json(result)
        return
    restart = "none" if result.restart_batch is None else f"after batch {result.restart_batch}"
    say(f"{result.uri} (Spark checkpoint, query {result.query_id}; restart {restart})")
    table(
        ("batch", "committed", "restartable", "time", "watermark", "why not"),
        [
            (
                str(b.batch),
                "yes" if b.committed else "no",
                "yes" if b.restartable else "no",
                when(b.timestamp_ms / 1000 if b.timestamp_ms else None),
                when(b.watermark_ms / 1000 if b.watermark_ms else None),
                b.why_not or "",
            )
            for b in result.batches
        ],
    )


def inspect_spark(checkpoint: SparkCheckpoint, as_json: bool) -> None:
    result = reports.listing(checkpoint)
    if as_json:
        emit_json(result)
        return
    say(
        f"{result.uri}: query {result.query_id}, newest committed batch "
        f"{result.newest_committed} (oldest {result.oldest_committed}), restart after "
        f"{result.restart_batch}"
    )
    table(
        ("operator", "partition", "store", "provider", "versions", "held as", "base",
         "needed", "bytes"),
        [
            (
                str(s.operator), str(s.partition), s.store, s.provider, _versions(s.versions),
                s.how or "-", "-" if s.base is None else str(s.base), size(s.needed_bytes),
                size(s.bytes),
            )
            for s in result.stores
        ],
    )


def verify_spark(checkpoint: SparkCheckpoint, as_json: bool, batch: int | None) -> None:
    result = reports.verify(checkpoint, batch)
    if as_json:
        emit_json(result)
    elif result.ok:
        say(
            f"OK {result.uri}: a restart after batch {result.batch} has all "
            f"{result.files_checked} files it needs, {size(result.bytes_checked)}"
        )
    else:
        for p in result.problems:
            say(f"{p.path}: {p.problem}" if not p.problem.startswith(p.path) else p.problem)
    if not as_json:
        for directory, count in result.bound_to.items():
            say(f"bound to {directory} ({count} input files named by absolute path)")
    if not result.ok:
        error_line(f"verify failed: {len(result.problems)} problem(s) for batch {result.batch}")
        raise typer.Exit(1)


def du_spark(checkpoint: SparkCheckpoint, as_json: bool) -> None:
    result = reports.du(checkpoint)
    if as_json:
        emit_json(result)
        return
    say(f"{result.uri}: {size(result.total_bytes)}")
    table(
        ("kind", "files", "bytes"),
        [(k, str(result.files[k]), size(result.bytes[k])) for k in sorted(result.bytes)],
    )


def history_spark(checkpoint: SparkCheckpoint, as_json: bool, limit: int) -> None:
    result = spark_history.history(checkpoint, limit)
    if as_json:
        emit_json(result)
        return
    if not result.records:
        say(f"{result.uri}: no batches")
        return
    table(
        ("batch", "committed", "time", "watermark", "offsets", "state", "files", "problem"),
        [
            (
                str(r.batch), "yes" if r.committed else "no",
                when(r.timestamp_ms / 1000 if r.timestamp_ms else None),
                when(r.watermark_ms / 1000 if r.watermark_ms else None),
                " ".join(str(o) for o in r.offsets),
                "-" if r.operators is None else size(sum(o.bytes for o in r.operators)),
                "-" if r.operators is None else str(sum(o.files for o in r.operators)),
                r.problem or "",
            )
            for r in result.records
        ],
        title=result.uri,
    )


def _versions(versions: list[int]) -> str:
    if not versions:
        return "-"
    return f"{versions[0]}-{versions[-1]}" if len(versions) > 1 else str(versions[0])


def not_for_spark(command: str, as_json: bool) -> None:
    fail(f"statehold {command} works on statehold job directories, not on a Spark checkpoint "
         "location", as_json=as_json)
