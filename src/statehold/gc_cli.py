"""Maintenance commands: ``statehold gc`` (the reconcile, run from outside the job) and
``statehold status`` (the running attempt and its cleanup backlog)."""

from __future__ import annotations

from typing import Annotated

import typer

from statehold.cli import (
    HaOption,
    JobArg,
    JsonOption,
    emit,
    handle_errors,
    open_job_for,
)
from statehold.cli_output import say
from statehold.jobstatus import job_status
from statehold.reconcile import gc

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would be deleted; delete nothing.")
]


def gc_command(
    job_dir: JobArg,
    dry_run: DryRunOption = False,
    ha: HaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete every file no retained checkpoint or savepoint references. Safe while the
    job runs: files of its in-flight checkpoints are spared while its lease is fresh."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        report = gc(job, dry_run=dry_run)

    def render() -> None:
        verb = "would delete" if dry_run else "deleted"
        say(
            f"{report.job_uri}: {verb} {report.orphan_count} orphan(s), "
            f"{report.orphan_bytes} bytes; kept {report.referenced} referenced file(s)"
        )
        if report.live_epoch is not None:
            say(
                f"a running attempt (epoch {report.live_epoch}) holds "
                f"{report.protected_count} in-flight file(s): spared"
            )
        for key in report.foreign:
            say(f"left alone (not made by statehold): {key}")
        for key, why in report.quarantined.items():
            say(f"quarantined (its files are spared): {key}: {why}")

    emit(report, as_json, render)


def status_command(
    job_dir: JobArg, ha: HaOption = None, as_json: JsonOption = False
) -> None:
    """Epoch, retained checkpoints, whether an attempt runs, its cleanup backlog and
    failures, and the job result entry."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        status = job_status(job.storage, job.ha)

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
        if status.result is not None:
            say(
                f"ended {status.result.outcome} ({status.result.policy}), "
                f"cleanup {status.result.state}"
            )

    emit(status, as_json, render)


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)
    app.command("status")(status_command)
