"""The commands over `statehold.tools`: list, inspect, verify, diff, du, export, dispose,
set-ha."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import BaseModel

from statehold import tools
from statehold.cli.common import (
    CheckpointArg,
    HaOption,
    JobArg,
    JsonOption,
    emit,
    error_line,
    handle_errors,
    job_only,
    opened,
)
from statehold.cli.output import (
    RichProgress,
    say,
    show_diff,
    show_inspection,
    show_listing,
    show_problems,
    show_usage,
    size,
)
from statehold.cli.spark_checkpoints import (
    BatchOption,
    DeepOption,
    OperatorOption,
    show_spark_inspection,
    show_spark_listing,
    show_spark_usage,
    show_spark_verify,
)
from statehold.errors import StateholdError
from statehold.job.directory import change_ha_store
from statehold.spark_checkpoints import SparkLocation
from statehold.spark_checkpoints.reports import SparkInspection, SparkListing, SparkUsage


def list_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Retained checkpoints (the newest `retain`, and with `retain_for` every one younger),
    chk-N directories not retained (flagged), and savepoints.
    On a Spark checkpoint location: its batches and which a restart can start after."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        job_dir, ha
    ) as location:
        result = location.listing(progress=progress)
    if isinstance(result, SparkListing):
        return emit(result, as_json, lambda: show_spark_listing(result))

    emit(result, as_json, lambda: show_listing(result))
    if result.problems:
        p = result.problems[0]
        n = len(result.problems)
        error_line(f"{n} unreadable checkpoint(s), first: {p.path}: {p.problem}")
        raise typer.Exit(1)


def inspect_command(
    checkpoint: CheckpointArg, as_json: JsonOption = False, ha: HaOption = None
) -> None:
    """Header fields of a checkpoint; with --json also every file it references. On a
    Spark checkpoint location: per operator, partition and store, the versions held, how
    the restart batch's version is held (snapshot, changelog or delta chain), its bytes."""
    with handle_errors(as_json), opened(checkpoint, ha) as location:
        result = location.inspect()
    if isinstance(result, SparkInspection):
        return emit(result, as_json, lambda: show_spark_inspection(result))
    emit(result, as_json, lambda: show_inspection(result))


def verify_command(
    checkpoint: CheckpointArg,
    as_json: JsonOption = False,
    no_checksums: Annotated[
        bool, typer.Option("--no-checksums", help="Check presence and size only.")
    ] = False,
    ha: HaOption = None,
    batch: BatchOption = None,
    deep: DeepOption = False,
    operator: OperatorOption = None,
) -> None:
    """Every referenced file present, of the right size and checksum, inside the job
    directory. On a Spark checkpoint location: every file a restart after --batch needs
    exists and is whole (sizes match the snapshots' lists, zips and changelogs read to
    their end, version chains unbroken, logs parse); with --deep every store version it
    needs is also loaded (RocksDB's by RocksDB, every record decoded), each problem named
    with its kind and the Spark bug whose signature it carries. Exits 1 and lists the
    problems otherwise, one per line."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        checkpoint, ha
    ) as location:
        if isinstance(location, SparkLocation):
            spark = location.verify(batch, deep=deep, operator=operator, progress=progress)
        elif deep or operator is not None:
            raise StateholdError(
                f"{checkpoint}: --deep and --operator are for Spark checkpoint locations")
        else:
            job = location.verify(checksums=not no_checksums, progress=progress)
    if isinstance(location, SparkLocation):
        emit(spark, as_json, lambda: show_spark_verify(spark))
        if not spark.ok:
            error_line(f"verify failed: {len(spark.problems)} problem(s) for batch "
                       f"{spark.batch}")
            raise typer.Exit(1)
        return

    def render() -> None:
        if job.ok:
            say(
                f"OK {job.job_uri.rstrip('/')}/{job.metadata_path}: "
                f"{job.files_checked} files, {size(job.bytes_checked)}"
            )
        else:
            show_problems(job.problems)

    emit(job, as_json, render)
    if not job.ok:
        p = job.problems[0]
        n = len(job.problems)
        error_line(f"verify failed: {n} problem(s), first: {p.path}: {p.problem}")
        raise typer.Exit(1)


def diff_command(
    checkpoint_a: CheckpointArg,
    checkpoint_b: CheckpointArg,
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Files added and removed from checkpoint A to checkpoint B, and their bytes."""
    with handle_errors(as_json):
        result = tools.diff(checkpoint_a, checkpoint_b, ha=ha)

    emit(result, as_json, lambda: show_diff(result))
    if result.changed:
        error_line(f"{len(result.changed)} file(s) differ in size or checksum under one path")
        raise typer.Exit(1)


def du_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Bytes by scope and by checkpoint (each shared file's bytes split evenly among the
    retained checkpoints and savepoints referencing it), and unreferenced bytes. On a
    Spark checkpoint location: bytes by kind (logs, sources, snapshots, changelogs, SSTs,
    unreferenced)."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        job_dir, ha
    ) as location:
        result = location.du(progress=progress)
    if isinstance(result, SparkUsage):
        return emit(result, as_json, lambda: show_spark_usage(result))
    emit(result, as_json, lambda: show_usage(result))


def export_command(
    checkpoint: CheckpointArg,
    dest: Annotated[str, typer.Argument(help="An empty destination (path, file://, s3://).")],
    as_json: JsonOption = False,
    no_verify: Annotated[
        bool, typer.Option("--no-verify", help="Skip verifying the exported copy.")
    ] = False,
    ha: HaOption = None,
) -> None:
    """Write a minimal self-contained job directory holding only this checkpoint (a
    Spark checkpoint location's copy is `statehold savepoint CKPT DEST`)."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        checkpoint, ha
    ) as location:
        result = job_only(location, "export").copy(dest, verify=not no_verify,
                                                   progress=progress)

    def render() -> None:
        say(
            f"exported {result.source} -> {result.dest.rstrip('/')}/{result.metadata_path}: "
            f"{result.files_copied} files, {size(result.bytes_copied or 0)}"
            + (", verified" if result.verified else "")
        )

    emit(result, as_json, render)


def dispose_command(
    target: Annotated[
        str, typer.Argument(help="A chk-N directory, savepoints/NAME, or a job directory.")
    ],
    as_json: JsonOption = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Also dispose retained checkpoints / whole jobs."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")
    ] = False,
    ha: HaOption = None,
) -> None:
    """Delete a checkpoint, a savepoint or a job directory; files that a retained
    checkpoint or another savepoint references are always kept."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        target, ha
    ) as location:
        result = job_only(location, "dispose").dispose(force=force, dry_run=dry_run,
                                                       progress=progress)

    def render() -> None:
        verb = "would delete" if result.dry_run else "deleted"
        say(
            f"{verb} {len(result.deleted)} files ({size(result.deleted_bytes)}) of "
            f"{result.job_uri.rstrip('/')}/{result.path}; kept {len(result.kept)} still "
            "referenced"
        )

    emit(result, as_json, render)


def set_ha_command(
    job_dir: JobArg,
    new_ha: Annotated[
        str, typer.Argument(help="The new HA store: embedded or zookeeper://host:port/path.")
    ],
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Move a stopped job to another HA store: fences the old one (a new epoch there),
    seeds the new one with that epoch and the retained checkpoints, then records it."""
    with handle_errors(as_json), opened(job_dir, ha) as location:
        job = job_only(location, "set-ha").job
        state = change_ha_store(job, new_ha)
        result = SetHaReport(
            job_uri=job.uri,
            old_ha=job.ha_uri,
            new_ha=new_ha,
            epoch=state.epoch,
            retained=[p.checkpoint_id for p in state.retained],
        )

    def render() -> None:
        say(
            f"{result.job_uri}: HA store {result.old_ha} -> {result.new_ha} (epoch "
            f"{result.epoch}, retained {result.retained})"
        )

    emit(result, as_json, render)


class SetHaReport(BaseModel):
    job_uri: str
    old_ha: str
    new_ha: str
    epoch: int
    retained: list[int]


def register(app: typer.Typer) -> None:
    app.command("list")(list_command)
    app.command("inspect")(inspect_command)
    app.command("verify")(verify_command)
    app.command("diff")(diff_command)
    app.command("du")(du_command)
    app.command("export")(export_command)
    app.command("dispose")(dispose_command)
    app.command("set-ha")(set_ha_command)
