"""Maintenance commands: ``statehold gc`` (the reconcile, run from outside the job) and
``statehold status`` (the running attempt and its cleanup backlog)."""

from __future__ import annotations

from typing import Annotated

import typer

from statehold import tools
from statehold.cli import HaOption, JobArg, JsonOption, console, emit, ha_store, handle_errors
from statehold.ha.embedded import EmbeddedHAStore
from statehold.jobstatus import job_status
from statehold.reconcile import ReconcileError, gc

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would be deleted; delete nothing.")
]


def gc_command(
    job_dir: JobArg,
    dry_run: DryRunOption = False,
    ha: HaOption = "embedded",
    as_json: JsonOption = False,
) -> None:
    """Delete every file no retained checkpoint or savepoint references. Safe while the
    job runs: files of its in-flight checkpoints are spared while its lease is fresh."""
    with handle_errors(as_json):
        job = tools.locate(job_dir).job
        tools.require_job_dir(job)
        with ha_store(job_dir, ha) as store:
            try:
                report = gc(job, store or EmbeddedHAStore(job), dry_run=dry_run)
            except ReconcileError as e:
                raise tools.ToolError(str(e)) from e

    def render() -> None:
        verb = "would delete" if dry_run else "deleted"
        console.print(
            f"{report.job_uri}: {verb} {len(report.orphans)} orphan(s), "
            f"{report.orphan_bytes} bytes; kept {report.referenced} referenced file(s)"
        )
        if report.live_epoch is not None:
            console.print(
                f"a running attempt (epoch {report.live_epoch}) holds "
                f"{len(report.protected)} in-flight file(s): spared"
            )
        for key in report.foreign:
            console.print(f"left alone (not made by statehold): {key}")

    emit(report, as_json, render)


def status_command(
    job_dir: JobArg, ha: HaOption = "embedded", as_json: JsonOption = False
) -> None:
    """Epoch, retained checkpoints, whether an attempt runs, its cleanup backlog and
    failures, and the job result entry."""
    with handle_errors(as_json):
        job = tools.locate(job_dir).job
        tools.require_job_dir(job)
        with ha_store(job_dir, ha) as store:
            status = job_status(job, store or EmbeddedHAStore(job))

    def render() -> None:
        console.print(f"{status.job_uri}: epoch {status.epoch}, retained {status.retained}")
        if status.running:
            cleaner = status.attempt.get("cleaner", {})
            console.print(
                f"running (lease renewed {status.lease_age_seconds:.0f}s ago); cleanup "
                f"backlog {cleaner.get('pending_keys', 0)} file(s) + "
                f"{cleaner.get('pending_dirs', 0)} dir(s), {cleaner.get('failures', 0)} "
                "failed attempt(s)"
            )
            for error in cleaner.get("last_errors", [])[-5:]:
                console.print(f"  {error}")
        else:
            console.print("no running attempt")
        if status.result is not None:
            console.print(
                f"ended {status.result.outcome} ({status.result.policy}), "
                f"cleanup {status.result.state}"
            )

    emit(status, as_json, render)


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)
    app.command("status")(status_command)
