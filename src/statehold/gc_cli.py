"""``statehold gc JOB_DIR [--dry-run] [--json]``: the reconcile, run from outside the job."""

from __future__ import annotations

from typing import Annotated

import typer

from statehold import tools
from statehold.cli import JobArg, JsonOption, console, emit, handle_errors
from statehold.ha.embedded import EmbeddedHAStore
from statehold.reconcile import gc

DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Report what would be deleted; delete nothing.")
]


def gc_command(job_dir: JobArg, dry_run: DryRunOption = False, as_json: JsonOption = False) -> None:
    """Delete every file no retained checkpoint or savepoint references. Safe while the
    job runs: files of its in-flight checkpoints are spared while its lease is fresh."""
    with handle_errors(as_json):
        job = tools.locate(job_dir).job
        tools.require_job_dir(job)
        report = gc(job, EmbeddedHAStore(job), dry_run=dry_run)

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


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)
