"""The web view of a job directory: one self-contained HTML page (inline CSS and SVG
charts, no script, nothing fetched), written by ``statehold report --html`` or served by
``statehold ui`` on 127.0.0.1 (GET and HEAD only). It is built from the same read-only
reports as the CLI (list, du, status, verify of sizes) and the checkpoint history, so it
works wherever they do (local and S3 job directories) and changes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import BaseModel

from statehold import tools
from statehold.cli import charts
from statehold.cli.output import size, when
from statehold.format.layout import Scope
from statehold.job.directory import JobDirectory, open_job
from statehold.job.history import HistoryRecord, read_history
from statehold.job.locate import Target, split_location
from statehold.job.status import JobStatus, job_status
from statehold.tools.reports import file_refs

#: History records shown (the job keeps 100 by default).
MAX_HISTORY = 1000
#: Rows of the shared-files table (the largest first).
MAX_SHARED_ROWS = 200


class ReportSummary(BaseModel):
    """What ``statehold report --json`` prints."""

    job_uri: str
    html: str
    checkpoints: int
    savepoints: int
    history_records: int
    problems: int


@dataclass
class WebView:
    """Everything the page shows, read once."""

    job_uri: str
    listing: tools.JobListing
    usage: tools.DiskUsage
    status: JobStatus
    history: list[HistoryRecord]
    #: shared file -> (size, holders: chk-N or savepoints/NAME)
    shared: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    problems: list[tools.Problem] = field(default_factory=list)
    generated_at: float = field(default_factory=time.time)

    def summary(self, html_path: str) -> ReportSummary:
        return ReportSummary(
            job_uri=self.job_uri, html=html_path, checkpoints=len(self.listing.checkpoints),
            savepoints=len(self.listing.savepoints), history_records=len(self.history),
            problems=len(self.problems),
        )


def gather(job: JobDirectory) -> WebView:
    """Read the job directory's reports (verify checks sizes, not checksums, to keep a
    page load cheap on object stores)."""
    listing = tools.list_checkpoints(job)
    view = WebView(
        job_uri=job.uri,
        listing=listing,
        usage=tools.du(job),
        status=job_status(job.storage, job.ha),
        history=read_history(job.storage, MAX_HISTORY),
        problems=list(listing.problems),
    )
    for entry in [*listing.checkpoints, *listing.savepoints]:
        if entry.error is not None or (entry.kind == "checkpoint" and not entry.retained):
            continue
        key = f"{entry.path}/_metadata"
        target = Target(job, entry.kind, key)
        report = tools.verify(target, checksums=False)
        view.problems.extend(report.problems)
        try:
            meta = job.read_document(key)
        except Exception:  # reported by list and verify already
            continue
        for ref in file_refs(meta, key):
            if ref.scope is Scope.SHARED and not ref.external:
                held = view.shared.setdefault(ref.path, (ref.size, []))[1]
                if entry.path not in held:
                    held.append(entry.path)
    return view


# -- rendering ----------------------------------------------------------------------------
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.muted{color:#666} .grid-2{display:flex;flex-wrap:wrap;gap:16px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
th{background:#f0f0f0} .bad{color:#c0392b} .ok{color:#3a9a5b}
.chart .grid{stroke:#e4e4e4} .chart .tick,.chart .legend{font-size:11px;fill:#555}
.chart .chart-title{font-size:13px;font-weight:600;fill:#222}
"""


def html_table(table_id: str, headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{escape(c)}</td>' if i in numeric else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


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


def retained(entry: tools.CheckpointSummary) -> str:
    """The "retained" column: a savepoint is kept until disposed (never in the HA store's
    retained list, like ``statehold list``'s "savepoint" rather than "NOT RETAINED")."""
    return "kept" if entry.kind == "savepoint" else "yes" if entry.retained else "no"


def render_html(view: WebView) -> str:
    """The page, as one string."""
    listing, usage, status = view.listing, view.usage, view.status
    cleaner = status.attempt.get("cleaner", {}) if status.running else {}
    running = (f"running (lease renewed {status.lease_age_seconds:.0f}s ago)"
               if status.running and status.lease_age_seconds is not None else "no running attempt")
    held = [
        [path, str(sz), str(len(holders)), ", ".join(holders)]
        for path, (sz, holders) in sorted(view.shared.items(), key=lambda kv: -kv[1][0])
    ]
    sections = [
        f"<h1>statehold: {escape(view.job_uri)}</h1>",
        f'<p class="muted">epoch {status.epoch} · retained {escape(str(status.retained))} · '
        f"{escape(running)} · generated {escape(when(view.generated_at))}</p>",
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
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>statehold: {escape(view.job_uri)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(sections)}</body></html>\n")


# -- serving ------------------------------------------------------------------------------
#: The names a request to the page may carry in its Host header.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


def local_host(header: str | None) -> bool:
    """Whether a request's Host header (any port) names this machine's loopback. A web page
    that rebinds its own host name to 127.0.0.1 (DNS rebinding) sends that name, so a
    browser cannot read the page on behalf of another site; no header (HTTP/1.0) is fine."""
    if header is None:
        return True
    name = header.strip().lower()
    name = name[: name.index("]") + 1] if name.startswith("[") and "]" in name else (
        name.rsplit(":", 1)[0])
    return name in LOCAL_HOSTS


def make_server(job_dir: str, ha: str | None, port: int) -> ThreadingHTTPServer:
    """The server of a job directory's page (`page_server`)."""
    job_uri, _ref = split_location(job_dir)
    with open_job(job_uri, ha):
        pass  # refuse a non-job directory or a wrong HA store before serving anything

    def page() -> str:
        with open_job(job_uri, ha) as job:
            return render_html(gather(job))

    return page_server(page, port)


def page_server(page: Callable[[], str], port: int) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (only: there is no option to listen elsewhere) whose
    ``/`` is `page()`, built afresh on each load; it answers GET and HEAD only, and only
    requests addressed to 127.0.0.1 or localhost (`local_host`)."""

    class Handler(BaseHTTPRequestHandler):
        """GET and HEAD of the page; every method that could change something is refused
        with 405 before anything is read, and methods http.server does not know get 501."""

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._page(with_body=True)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            self._page(with_body=False)

        def _refuse(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815 - http.server's names

        def _page(self, with_body: bool) -> None:
            if not local_host(self.headers.get("Host")):
                self.send_error(403, "the page is served to 127.0.0.1 and localhost only")
                return
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            try:
                body = page().encode()
                status = 200
            except Exception as e:  # shown, not fatal: the next load tries again
                body = f"<p>statehold: error: {escape(str(e))}</p>".encode()
                status = 500
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve(
    server: ThreadingHTTPServer, location: str, announce: Callable[[str], None]
) -> None:
    """Serve until interrupted (Ctrl-C)."""
    announce(f"serving {location} on http://127.0.0.1:{server.server_address[1]}/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
