"""``statehold history`` (the checkpoint history), ``statehold report --html`` and
``statehold ui`` (the web view of a job directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from statehold.cli.common import HaOption, JobArg, JsonOption, emit, handle_errors, opened
from statehold.cli.output import say, size, table, when
from statehold.cli.spark_checkpoints import show_spark_history
from statehold.spark_checkpoints.history import SparkHistory
from statehold.tools.results import JobHistory

#: `statehold history --json` of a job directory, by its old name.
HistoryListing = JobHistory


LimitOption = Annotated[
    int, typer.Option("--limit", min=1, help="Show the newest this many records.")
]


def history_command(
    job_dir: JobArg, limit: LimitOption = 100, ha: HaOption = None, as_json: JsonOption = False
) -> None:
    """Completed and aborted checkpoints, oldest first: duration (tasks' snapshot,
    driver's complete), bytes uploaded and reused, state size, keys, rows, cleanup
    backlog, and why an aborted one failed. On a Spark checkpoint location: per batch,
    its time, watermark, input offsets, and the state bytes and files it left."""
    with handle_errors(as_json), opened(job_dir, ha) as location:
        found = location.history(limit)
    if isinstance(found, SparkHistory):
        return emit(found, as_json, lambda: show_spark_history(found))
    result = found

    def render() -> None:
        if not result.records:
            say(f"{result.job_uri}: no checkpoint history")
            return
        table(
            ["checkpoint", "epoch", "outcome", "ended", "seconds", "snapshot s", "complete s",
             "uploaded", "files", "reused", "state", "keys", "rows", "backlog", "reason"],
            [
                [str(r.checkpoint_id), str(r.epoch), r.outcome, when(r.ended_at),
                 f"{r.duration:.2f}", f"{r.snapshot_seconds:.2f}", f"{r.complete_seconds:.3f}",
                 size(r.bytes_uploaded), str(r.files_uploaded), size(r.bytes_reused),
                 size(r.state_size), str(r.keys), str(r.rows), str(r.cleanup_backlog),
                 r.reason or ""]
                for r in result.records
            ],
            title=result.job_uri,
        )

    emit(result, as_json, render)


def report_command(
    job_dir: JobArg,
    html: Annotated[Path, typer.Option("--html", help="Write the web view to this file.")],
    ha: HaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the web view of a job directory as one self-contained HTML file (charts of
    the checkpoint history, retained checkpoints and savepoints, storage, cleanup, verify
    problems; no network needed to view it). On a Spark checkpoint location: per batch,
    its time, watermark, input offsets and state per operator; the stores; verify."""
    with handle_errors(as_json), opened(job_dir, ha) as location:
        summary = location.report().write(html)

    emit(summary, as_json, lambda: say(f"wrote {html}"))


def ui_command(
    job_dir: JobArg,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: any).")] = 8765,
    ha: HaOption = None,
) -> None:
    """Serve the web view on http://127.0.0.1:PORT/ (built afresh on every load) until
    interrupted."""
    from statehold.cli.webview import make_server, serve

    with handle_errors(False):
        server = make_server(job_dir, ha, port)
        serve(server, job_dir, announce=say)


def register(app: typer.Typer) -> None:
    app.command("history")(history_command)
    app.command("report")(report_command)
    app.command("ui")(ui_command)
