"""Maintenance commands: ``statehold gc`` (the reconcile, run from outside the job) and
``statehold status`` (the running attempt and its cleanup backlog)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from statehold.checkpoint.requests import pending as pending_requests
from statehold.cleanup.gc import GcAllReport, GcReport, gc, job_locations
from statehold.cli.common import (
    HaOption,
    JobArg,
    JsonOption,
    emit,
    handle_errors,
    open_job_for,
    opened,
)
from statehold.cli.output import RichProgress, say
from statehold.cli.spark_checkpoints import show_spark_gc
from statehold.errors import StateholdError
from statehold.job.directory import open_job
from statehold.job.status import job_status
from statehold.spark_checkpoints import SparkLocation
from statehold.spark_checkpoints.policy import SPARK_GC_GRACE_SECONDS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would be deleted; delete nothing.")
]


SparkOption = Annotated[
    bool,
    typer.Option(
        "--spark",
        help="List and delete on Spark executors (by prefix); the driver only plans.",
    ),
]
MasterOption = Annotated[
    str | None,
    typer.Option("--master", help="Spark master for --spark (default: Spark's own setting)."),
]
AllJobsOption = Annotated[
    bool,
    typer.Option(
        "--all-jobs",
        help="JOB_DIR is a checkpoint root: gc every job directory right under it, each "
        "with its own recorded HA store.",
    ),
]


def gc_command(
    job_dir: JobArg,
    dry_run: DryRunOption = False,
    ha: HaOption = None,
    spark: SparkOption = False,
    master: MasterOption = None,
    all_jobs: AllJobsOption = False,
    as_json: JsonOption = False,
    grace: GraceOption = None,
) -> None:
    """Delete every file no retained checkpoint or savepoint references. Safe while the
    job runs: files of its in-flight checkpoints are spared while its lease is fresh. On
    a Spark checkpoint location: delete only files no batch Spark may still restart
    from needs (orphan SSTs, versions beyond retention, temp and .crc leftovers), never
    one younger than --grace or newer than gc's own listing; safe beside the query."""
    if all_jobs:
        _gc_all(job_dir, dry_run=dry_run, spark=spark, master=master, as_json=as_json)
        return
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        job_dir, ha
    ) as location:
        if isinstance(location, SparkLocation):
            found = location.gc(dry_run=dry_run, grace=grace, progress=progress)
        elif spark:
            report = _spark_gc(_session(master), location.job.uri, ha=ha, dry_run=dry_run)
        else:
            report = location.gc(dry_run=dry_run, grace=grace, progress=progress)
    if isinstance(location, SparkLocation):
        return emit(found, as_json, lambda: show_spark_gc(found))
    emit(report, as_json, lambda: _render(report))


GraceOption = Annotated[
    float | None,
    typer.Option(
        "--grace",
        min=0,
        help="A Spark checkpoint location only: never delete a file younger than this many "
        f"seconds (an upload or a maintenance run may still be under way). Default: "
        f"{SPARK_GC_GRACE_SECONDS:g}.",
        show_default=False,
    ),
]


def _render(report: GcReport) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    size = "bytes not counted" if report.orphan_bytes is None else f"{report.orphan_bytes} bytes"
    say(
        f"{report.job_uri}: {verb} {report.orphan_count} orphan(s), "
        f"{size}; kept {report.referenced} referenced file(s)"
    )
    if report.live_epoch is not None:
        say(
            f"a running attempt (epoch {report.live_epoch}) holds "
            f"{report.protected_count} in-flight file(s): spared"
        )
    for key in report.foreign:
        say(f"left alone (not made by statehold): {key}")
    if report.foreign_count > len(report.foreign):
        say(f"... and {report.foreign_count - len(report.foreign)} more left alone")
    for key, why in report.quarantined.items():
        say(f"quarantined (its files are spared): {key}: {why}")


def _session(master: str | None) -> SparkSession:
    from pyspark.sql import SparkSession

    from statehold.spark.session import use_this_python

    use_this_python()
    builder = SparkSession.builder.appName("statehold-gc")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def _spark_gc(session: SparkSession, location: str, *, ha: str | None, dry_run: bool) -> GcReport:
    from statehold.spark.gc import gc_on_spark

    return gc_on_spark(session, location, ha=ha, dry_run=dry_run)


def _gc_all(root: str, *, dry_run: bool, spark: bool, master: str | None, as_json: bool) -> None:
    """Each job under `root` with its own recorded HA store; one failing job does not
    stop the others, and makes the exit status 1."""
    with handle_errors(as_json):
        locations = job_locations(root)
    session = _session(master) if spark and locations else None
    reports: list[GcReport] = []
    errors: dict[str, str] = {}
    for location in locations:
        try:
            if session is not None:
                reports.append(_spark_gc(session, location, ha=None, dry_run=dry_run))
            else:
                with RichProgress(not as_json) as progress, open_job(location) as job:
                    reports.append(gc(job, dry_run=dry_run, progress=progress))
        except StateholdError as e:
            errors[location] = " ".join(str(e).split())
    result = GcAllReport(root=root, jobs=reports, errors=errors)

    def render() -> None:
        for report in reports:
            _render(report)
        for location, error in errors.items():
            say(f"{location}: error: {error}")
        say(f"{root}: {len(reports)} job(s) collected, {len(errors)} failed")

    emit(result, as_json, render)
    if errors:
        raise typer.Exit(1)


def status_command(
    job_dir: JobArg, ha: HaOption = None, as_json: JsonOption = False
) -> None:
    """Epoch, retained checkpoints, whether an attempt runs, its cleanup backlog and
    failures, requests from outside not answered yet (statehold savepoint JOB NAME,
    statehold stop), and the job result entry."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        status = job_status(job.storage, job.ha)
        asked = list(pending_requests(job.storage))

    def render() -> None:
        say(f"{status.job_uri}: epoch {status.epoch}, retained {status.retained}")
        if status.running:
            cleaner = status.attempt.get("cleaner", {})
            say(
                f"running (lease renewed {status.lease_age_seconds:.0f}s ago); cleanup "
                f"backlog {cleaner.get('pending_keys', 0)} file(s) + "
                f"{cleaner.get('pending_dirs', 0)} dir(s), {cleaner.get('failures', 0)} "
                "failed attempt(s)"
            )
            for error in cleaner.get("last_errors", [])[-5:]:
                say(f"  {error}")
        else:
            say("no running attempt")
        for request in asked:
            say(f"asked: {request.action}"
                + (f" with savepoint {request.savepoint}" if request.savepoint else "")
                + f" of attempt {request.epoch} by {request.requested_by or 'someone'} "
                f"(request {request.id}, not answered yet)")
        if status.result is not None:
            say(
                f"ended {status.result.outcome} ({status.result.policy}), "
                f"cleanup {status.result.state}"
            )

    emit(status, as_json, render)


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)
    app.command("status")(status_command)
