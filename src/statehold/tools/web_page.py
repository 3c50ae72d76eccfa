"""A job directory's sections of the one web view (`JobLocation.report`, ``statehold report
--html``, ``statehold ui``): built from the same read-only reports as the CLI (list, du,
status, verify of sizes) and the checkpoint history, so it works wherever they do (local
and S3 job directories) and changes nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from html import escape

from statehold.format.layout import Scope
from statehold.format.results import ReportSummary, WebReport
from statehold.job.directory import JobDirectory
from statehold.job.history import HistoryRecord, read_history
from statehold.job.locate import Target
from statehold.job.status import JobStatus, job_status
from statehold.tools import reports
from statehold.tools.results import CheckpointSummary, DiskUsage, JobListing, Problem
from statehold.tools.usage import du
from statehold.web_page import charts, html_table, page, size, when

#: History records shown (the job keeps 100 by default).
MAX_HISTORY = 1000
#: Rows of the shared-files table (the largest first).
MAX_SHARED_ROWS = 200


@dataclass
class WebView:
    """Everything the page shows, read once."""

    job_uri: str
    listing: JobListing
    usage: DiskUsage
    status: JobStatus
    history: list[HistoryRecord]
    #: shared file -> (size, holders: chk-N or savepoints/NAME)
    shared: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    generated_at: float = field(default_factory=time.time)

    def summary(self) -> ReportSummary:
        return ReportSummary(
            location_kind="job", job_uri=self.job_uri, checkpoints=len(self.listing.checkpoints),
            savepoints=len(self.listing.savepoints), history_records=len(self.history),
            problems=len(self.problems),
        )


def gather(job: JobDirectory) -> WebView:
    """Read the job directory's reports (verify checks sizes, not checksums, to keep a
    page load cheap on object stores)."""
    listing = reports.list_checkpoints(job)
    view = WebView(
        job_uri=job.uri,
        listing=listing,
        usage=du(job),
        status=job_status(job.storage, job.ha),
        history=read_history(job.storage, MAX_HISTORY),
        problems=list(listing.problems),
    )
    for entry in [*listing.checkpoints, *listing.savepoints]:
        if entry.error is not None or (entry.kind == "checkpoint" and not entry.retained):
            continue
        key = f"{entry.path}/_metadata"
        target = Target(job, entry.kind, key)
        found = reports.verify(target, checksums=False)
        view.problems.extend(found.problems)
        try:
            meta = job.read_document(key)
        except Exception:  # reported by list and verify already
            continue
        for ref in reports.file_refs(meta, key):
            if ref.scope is Scope.SHARED and not ref.external:
                held = view.shared.setdefault(ref.path, (ref.size, []))[1]
                if entry.path not in held:
                    held.append(entry.path)
    return view


# -- rendering ----------------------------------------------------------------------------
def _charts(history: list[HistoryRecord]) -> str:
    if not history:
        return '<p class="muted">No checkpoint history yet (written by each checkpoint).</p>'
    xs = [r.checkpoint_id for r in history]
    failed = [r.outcome != "completed" for r in history]
    done = [r for r in history if r.outcome == "completed"]  # the lines: completed only
    ds = [r.checkpoint_id for r in done]
    seconds = lambda v: f"{v:.2f} s"  # noqa: E731
    count = lambda v: f"{v:.0f}"  # noqa: E731
    parts = [
        charts.line_chart("chart-duration", "Checkpoint duration (completed)", ds, [
            charts.Series("total", [r.duration for r in done]),
            charts.Series("task snapshots", [r.snapshot_seconds for r in done]),
            charts.Series("driver complete", [r.complete_seconds for r in done]),
        ], seconds),
        charts.bar_chart("chart-uploaded", "Bytes uploaded (aborted in red)", xs,
                         [r.bytes_uploaded for r in history], lambda v: size(int(v)), failed),
        charts.line_chart("chart-state", "State size (completed)", ds,
                          [charts.Series("state size", [r.state_size for r in done])],
                          lambda v: size(int(v))),
        charts.line_chart("chart-epochs", "Attempts (epoch)", xs,
                          [charts.Series("epoch", [r.epoch for r in history])], count,
                          step=True, integer=True),
    ]
    cards = "".join(f'<div class="card">{p}</div>' for p in parts)
    return f'<div class="grid-2">{cards}</div>'


def _history_table(history: list[HistoryRecord]) -> str:
    rows = [
        [str(r.checkpoint_id), str(r.epoch), r.outcome, when(r.ended_at), f"{r.duration:.2f}",
         f"{r.snapshot_seconds:.2f}", f"{r.complete_seconds:.3f}", str(r.bytes_uploaded),
         str(r.files_uploaded), str(r.files_reused), str(r.bytes_downloaded), str(r.state_size),
         str(r.keys), str(r.rows), str(r.cleanup_backlog), r.reason or ""]
        for r in reversed(history)
    ]
    return html_table("history", ["checkpoint", "epoch", "outcome", "ended", "seconds",
                              "snapshot s", "complete s", "bytes uploaded", "files uploaded",
                              "files reused", "bytes downloaded", "state bytes", "keys", "rows",
                              "cleanup backlog", "reason"], rows, set(range(4, 15)) | {0, 1})


def retained(entry: CheckpointSummary) -> str:
    """The "retained" column: a savepoint is kept until disposed (never in the HA store's
    retained list, like ``statehold list``'s "savepoint" rather than "NOT RETAINED")."""
    return "kept" if entry.kind == "savepoint" else "yes" if entry.retained else "no"


def render_html(view: WebView) -> str:
    listing, usage, status = view.listing, view.usage, view.status
    cleaner = status.attempt.get("cleaner", {}) if status.running else {}
    running = (f"running (lease renewed {status.lease_age_seconds:.0f}s ago)"
               if status.running and status.lease_age_seconds is not None else "no running attempt")
    held = [
        [path, str(sz), str(len(holders)), ", ".join(holders)]
        for path, (sz, holders) in sorted(view.shared.items(), key=lambda kv: -kv[1][0])
    ]
    subtitle = (f"epoch {status.epoch} · retained {status.retained} · {running} · generated "
                f"{when(view.generated_at)}")
    sections = [
        "<h2>Checkpoint history</h2>", _charts(view.history),
        "<h2>Retained checkpoints and savepoints</h2>",
        html_table("checkpoints", ["kind", "path", "epoch", "completed", "files",
                                   "referenced bytes", "retained", "error"], [
            [e.kind, e.path, str(e.epoch if e.epoch is not None else ""), when(e.completed_at),
             str(e.file_count), str(e.referenced_bytes), retained(e), e.error or ""]
            for e in [*listing.checkpoints, *listing.savepoints]
        ], {2, 4, 5}),
        f"<h2>Shared files and their holders ({len(held)})</h2>",
        html_table("shared", ["shared file", "bytes", "holders", "held by"],
               held[:MAX_SHARED_ROWS], {1, 2}),
        "<h2>Storage by scope</h2>",
        html_table("usage", ["scope", "bytes"],
               [[k, str(v)] for k, v in sorted(usage.by_scope.items())]
               + [["total", str(usage.total_bytes)],
                  ["unreferenced", str(usage.unreferenced_bytes)]], {1}),
        "<h2>Cleanup</h2>",
        html_table("cleanup", ["backlog files", "backlog dirs", "deleted", "failed attempts"], [[
            str(cleaner.get("pending_keys", 0)), str(cleaner.get("pending_dirs", 0)),
            str(cleaner.get("deleted", 0)), str(cleaner.get("failures", 0))]], {0, 1, 2, 3}),
        "".join(f'<p class="bad">{escape(str(e))}</p>'
                for e in cleaner.get("last_errors", [])[-5:]),
        "<h2>Verify (sizes)</h2>",
        (html_table("problems", ["path", "problem"], [[p.path, p.problem] for p in view.problems],
                set()) if view.problems else '<p id="problems" class="ok">no problems</p>'),
        "<h2>History records</h2>", _history_table(view.history),
    ]
    return page("Job directory", view.job_uri, subtitle, sections)


def report(job: JobDirectory) -> WebReport:
    """The job directory's page and its numbers."""
    view = gather(job)
    return WebReport(page=render_html(view), summary=view.summary())
