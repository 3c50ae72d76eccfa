"""The web view: `statehold report --html` rendered by a real headless Chromium (the
charts and tables carry the job's real numbers), the same page from `statehold ui`, and
an S3 job directory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from statehold import tools
from statehold.cli import app
from statehold.cli.webview import make_server
from statehold.examples import running_totals
from statehold.examples.running_totals import generate_demo
from statehold.job import history
from statehold.job.directory import open_job
from statehold.spark import StatefulJob
from statehold.storage import Storage, open_storage
from statehold.tools.web_page import gather, render_html
from statehold.web_page import charts
from tests.support.minipipeline import MiniPipeline, make_batch

CHROMIUM = shutil.which("chromium")


def build(storage: Storage, local: Path) -> None:
    """Checkpoints 0-4, an aborted 5, a savepoint, then 5-6 (retain 2)."""
    pipeline = MiniPipeline(storage, local, job_id="job")
    try:
        for i in range(5):
            pipeline.run_batch(make_batch(i, keys=200, rows=1000))
        pipeline.coord.begin(5)
        pipeline.coord.abort(5, "ValueError: the sink refused the batch")
        pipeline.coord.savepoint("before-upgrade")
        for i in range(5, 7):
            pipeline.run_batch(make_batch(i, keys=200, rows=1000))
    finally:
        pipeline.close()


def chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", *args, url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def values(dom: str, chart: str, mark: str) -> list[tuple[int, float]]:
    svg = re.search(rf'<svg id="{chart}".*?</svg>', dom, re.S)
    assert svg, f"no {chart} in the page"
    return [
        (int(x), float(v))
        for x, v in re.findall(rf'<{mark} class="[a-z]+"[^>]*?data-x="(\d+)" data-value="([^"]+)"',
                               svg[0])
    ]


def rows(dom: str, table: str) -> list[list[str]]:
    found = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert found, f"no table {table}"
    return [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>",
                                                                       found[1])]


def report_in_chromium(tmp_path: Path, job_uri: str) -> str:
    """`statehold report JOB --html`, rendered by headless Chromium (a screenshot, then
    the DOM after rendering)."""
    page = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", job_uri, "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "http" not in re.sub(r'xmlns="http://www.w3.org/2000/svg"', "", page.read_text())
    shot = tmp_path / "report.png"
    chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    return chromium(tmp_path, page.as_uri(), "--dump-dom").stdout


def check_page(dom: str, storage: Storage) -> list[history.HistoryRecord]:
    """The rendered page carries the job's numbers: the charts' values are the history's,
    the tables are `list`'s, `du`'s and every retained checkpoint's and savepoint's shared
    files. Returns the history records."""
    records = history.read_history(storage)
    assert records, "no history to check the charts against"
    assert values(dom, "chart-uploaded", "rect") == [
        (r.checkpoint_id, float(r.bytes_uploaded)) for r in records
    ]
    completed = [r for r in records if r.outcome == "completed"]
    assert values(dom, "chart-state", "circle") == [
        (r.checkpoint_id, float(r.state_size)) for r in completed
    ]
    duration = values(dom, "chart-duration", "circle")
    assert len(duration) == 3 * len(completed)
    assert sorted(v for _, v in duration) == sorted(
        v for r in completed for v in (r.duration, r.snapshot_seconds, r.complete_seconds))
    assert values(dom, "chart-epochs", "circle") == [
        (r.checkpoint_id, float(r.epoch)) for r in records
    ]
    assert [r[0] for r in rows(dom, "history")] == [str(r.checkpoint_id) for r in
                                                    reversed(records)]

    with open_job(storage) as job:
        listing = tools.list_checkpoints(job)
        usage = tools.du(job)
        entries = [e for e in [*listing.checkpoints, *listing.savepoints]
                   if e.retained or e.kind == "savepoint"]
        metas = {e.path: job.read_document(f"{e.path}/_metadata") for e in entries}
    shown = {r[1]: r for r in rows(dom, "checkpoints")}
    assert set(shown) == {e.path for e in [*listing.checkpoints, *listing.savepoints]}
    for entry in [*listing.checkpoints, *listing.savepoints]:
        assert shown[entry.path][5] == str(entry.referenced_bytes)
        assert shown[entry.path][6] == ("kept" if entry.kind == "savepoint" else "yes")
    held = {r[0]: (r[1], r[3].split(", ")) for r in rows(dom, "shared")}
    for path, meta in metas.items():
        shared = [ref for ref in tools.reports.file_refs(meta, f"{path}/_metadata")
                  if ref.scope == "shared" and not ref.external]
        for ref in shared:
            assert held[ref.path][0] == str(ref.size) and path in held[ref.path][1]
    assert dict((r[0], r[1]) for r in rows(dom, "usage"))["total"] == str(usage.total_bytes)
    assert '<p id="problems" class="ok">no problems</p>' in dom
    return records


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_report_in_headless_chromium(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    storage = open_storage(str(job_dir))
    build(storage, tmp_path / "local")
    dom = report_in_chromium(tmp_path, str(job_dir))
    records = check_page(dom, storage)
    assert [r.checkpoint_id for r in records] == [0, 1, 2, 3, 4, 5, 5, 6]
    assert {v for _, v in values(dom, "chart-epochs", "circle")} == {1.0}
    assert set(r[1] for r in rows(dom, "checkpoints")) == {
        "chk-5", "chk-6", "savepoints/before-upgrade"}
    assert any("savepoints/before-upgrade" in r[3] for r in rows(dom, "shared"))
    aborted = [r for r in rows(dom, "history") if r[2] == "aborted"]
    assert aborted and aborted[0][-1] == "ValueError: the sink refused the batch"


@pytest.mark.spark
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_report_of_a_spark_pipeline_in_chromium(
    spark: SparkSession, backend: str, tmp_path: Path, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's example pipeline (running totals over the demo data, in the shared
    session) writes the job directory, on local disk or on S3; its report, made from the
    job's URI, shows that job's real numbers in Chromium."""
    root, options = str(tmp_path / "checkpoints"), {}
    if backend == "s3":
        server = request.getfixturevalue("s3_server")
        root, options = f"s3://{server.bucket}/webview-{os.getpid()}-{tmp_path.name}", \
            server.options
        for k, v in server.env.items():  # the CLI takes S3 settings from the environment
            monkeypatch.setenv(k, v)
    generate_demo(tmp_path / "input", files=4, rows=250, keys=40)
    args = running_totals.parse_args(["--input", str(tmp_path / "input"), "--output",
                                      str(tmp_path / "output"), "--checkpoints", root])
    job = StatefulJob(spark, args.checkpoints, args.job_id, max_parallelism=args.max_parallelism,
                      parallelism=args.parallelism, retain=args.retain,
                      storage_options=options, local_dir=str(tmp_path / "local"))
    try:
        assert running_totals.run(spark, job, args) == 0
        job.coordinator.savepoint("after-demo")
    finally:
        job.close()
    # The job directory as people name it: its s3:// URI, or a path on local disk.
    job_uri = job.job_dir if backend == "s3" else str(tmp_path / "checkpoints" / args.job_id)
    assert job_uri.startswith("s3://" if backend == "s3" else "/")

    dom = report_in_chromium(tmp_path, job_uri)
    storage = open_storage(job_uri, **options)
    records = check_page(dom, storage)
    assert [(r.checkpoint_id, r.outcome) for r in records] == [
        (i, "completed") for i in range(4)]
    assert all(r.bytes_uploaded > 0 and r.state_size > 0 and r.keys > 0 for r in records)
    assert set(r[1] for r in rows(dom, "checkpoints")) == {
        "chk-1", "chk-2", "chk-3", "savepoints/after-demo"}  # retain 3: chk-0 is gone
    assert any("savepoints/after-demo" in r[3] for r in rows(dom, "shared"))
    assert re.search(rf"<h1>Job directory: [a-z0-9:/]*{re.escape(job_uri)}</h1>", dom)


def test_verify_problems_and_s3(storage: Storage, tmp_path: Path) -> None:
    build(storage, tmp_path / "local")
    with open_job(storage) as job:
        latest = job.read_document(job.metadata_key(None))
        victim = next(ref.path for ref in tools.reports.file_refs(latest, "chk-6/_metadata")
                      if ref.scope == "shared")
        storage.delete_many([victim])
        view = gather(job)
    page = render_html(view)
    assert view.problems and any(p.path.endswith(victim) for p in view.problems)
    assert '<table id="problems">' in page and victim in page
    assert len(re.findall(r'<rect class="bar"', page)) == len(view.history) == 8


def test_savepoints_are_kept_and_leftovers_not_retained(tmp_path: Path) -> None:
    """The "retained" column: yes for the HA store's checkpoints, no for a leftover chk-N
    directory, and a savepoint (never in the HA store's list) is "kept", not "no"."""
    job_dir = tmp_path / "job"
    build(open_storage(str(job_dir)), tmp_path / "local")
    (job_dir / "chk-3").mkdir()
    shutil.copyfile(job_dir / "chk-6" / "_metadata", job_dir / "chk-3" / "_metadata")
    with open_job(str(job_dir)) as job:
        page = render_html(gather(job))
    assert {r[1]: r[6] for r in rows(page, "checkpoints")} == {
        "chk-3": "no", "chk-5": "yes", "chk-6": "yes", "savepoints/before-upgrade": "kept"}


def test_chart_values_are_exact() -> None:
    """A mark's data-value is its exact number: a checkpoint of 1,234,567 bytes or a
    duration of 0.123456789 s is not rounded to six digits (1.23457e+06, 0.123457)."""
    big = [1_234_567, 2**60 + 3, 0]
    bars = charts.bar_chart("chart-b", "bytes", [0, 1, 2], big, str)
    assert values(bars, "chart-b", "rect") == [(i, float(v)) for i, v in enumerate(big)]
    assert 'data-value="1234567"' in bars and f'data-value="{2**60 + 3}"' in bars
    seconds = [0.123456789, 1234567.25, 3.0]
    lines = charts.line_chart("chart-l", "seconds", [4, 5, 6],
                              [charts.Series("total", seconds)], str)
    assert values(lines, "chart-l", "circle") == list(zip([4, 5, 6], seconds, strict=True))


def test_ui_serves_the_page(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    build(open_storage(str(job_dir)), tmp_path / "local")
    server = make_server(str(job_dir), None, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            body = response.read().decode()
        assert '<svg id="chart-uploaded"' in body and "savepoints/before-upgrade" in body
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    not_a_job = tmp_path / "empty"
    not_a_job.mkdir()
    result = CliRunner().invoke(app, ["ui", str(not_a_job), "--port", "0"])
    assert result.exit_code == 1 and "statehold: error:" in result.stderr
