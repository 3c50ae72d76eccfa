"""A Spark checkpoint location's sections of the one web view (`SparkLocation.report`,
``statehold report --html CKPT``, ``statehold ui CKPT``), built from the read-only views:
per batch its time, watermark, input offsets and state bytes and files per operator; the
stores; bytes by kind; verify."""

from __future__ import annotations

import json
import time

from statehold.format.results import ReportSummary, WebReport
from statehold.spark_checkpoints import reports
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.history import SparkHistory, history
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.web_page import charts, html_table, page, size, when


def _charts(found: SparkHistory) -> str:
    held = [r for r in found.records if r.operators is not None]
    if not held:
        return '<p class="muted">No batch whose state is still held.</p>'
    xs = [r.batch for r in held]
    operators = sorted({o.operator for r in held for o in r.operators or []})

    def series(field: str) -> list[charts.Series]:
        return [
            charts.Series(
                f"operator {op}",
                [
                    sum(getattr(o, field) for o in r.operators or [] if o.operator == op)
                    for r in held
                ],
            )
            for op in operators
        ]

    parts = [
        charts.line_chart("chart-state", "State bytes a restart after the batch reads", xs,
                          series("bytes"), lambda v: size(int(v))),
        charts.line_chart("chart-files", "State files a restart after the batch reads", xs,
                          series("files"), lambda v: f"{v:.0f}", integer=True),
    ]
    cards = "".join(f'<div class="card">{p}</div>' for p in parts)
    return f'<div class="grid-2">{cards}</div>'


def report(checkpoint: SparkCheckpoint) -> WebReport:
    """The page and its numbers, read from the location's read-only views."""
    listed = reports.listing(checkpoint)
    usage = reports.du(checkpoint)
    found = history(checkpoint)
    try:
        problems = reports.verify(checkpoint).problems
    except SparkCheckpointError as e:  # no committed batch
        problems = [reports.Problem(path=checkpoint.uri, problem=str(e))]
    rows = [
        [str(r.batch), "yes" if r.committed else "no",
         when(r.timestamp_ms / 1000 if r.timestamp_ms else None),
         when(r.watermark_ms / 1000 if r.watermark_ms else None),
         " ".join(json.dumps(o) for o in r.offsets),
         "" if r.operators is None else "; ".join(
             f"{o.operator}: {size(o.bytes)} in {o.files}" for o in r.operators),
         r.problem or ""]
        for r in reversed(found.records)
    ]
    subtitle = (f"query {listed.query_id} · newest committed batch {listed.newest_committed} "
                f"· restart after {listed.restart_batch} · generated {when(time.time())}")
    sections = [
        "<h2>State per batch</h2>", _charts(found),
        "<h2>Batches</h2>",
        html_table("batches", ["batch", "committed", "time", "watermark", "input offsets",
                               "state per operator", "problem"], rows, {0}),
        "<h2>Stores</h2>",
        html_table("stores", ["operator", "partition", "store", "provider", "versions",
                              "held as", "base", "needed bytes", "bytes"], [
            [str(s.operator), str(s.partition), s.store, s.provider,
             f"{s.versions[0]}-{s.versions[-1]}" if s.versions else "",
             s.how or "", "" if s.base is None else str(s.base), str(s.needed_bytes),
             str(s.bytes)]
            for s in listed.stores
        ], {0, 1, 6, 7, 8}),
        "<h2>Storage by kind</h2>",
        html_table("usage", ["kind", "files", "bytes"],
                   [[k, str(usage.files[k]), str(usage.bytes[k])] for k in sorted(usage.bytes)]
                   + [["total", "", str(usage.total_bytes)]], {1, 2}),
        "<h2>Verify (the newest committed batch)</h2>",
        (html_table("problems", ["path", "problem"], [[p.path, p.problem] for p in problems],
                    set()) if problems else '<p id="problems" class="ok">no problems</p>'),
    ]
    summary = ReportSummary(
        location_kind="spark", job_uri=checkpoint.uri, checkpoints=len(listed.batches),
        savepoints=0, history_records=len(found.records), problems=len(problems),
    )
    return WebReport(page=page("Spark checkpoint", checkpoint.uri, subtitle, sections),
                     summary=summary)
