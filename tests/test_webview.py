"""The web view: `statehold report --html` rendered by a real headless Chromium (the
charts and tables carry the job's real numbers), the same page from `statehold ui`, and
an S3 job directory."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from minipipeline import MiniPipeline, make_batch
from typer.testing import CliRunner

from statehold import history, tools
from statehold.cli import app
from statehold.jobdir import open_job
from statehold.storage import Storage, open_storage
from statehold.webview import gather, make_server, render_html

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


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_report_in_headless_chromium(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    storage = open_storage(str(job_dir))
    build(storage, tmp_path / "local")
    page = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(job_dir), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "http" not in re.sub(r'xmlns="http://www.w3.org/2000/svg"', "", page.read_text())

    shot = tmp_path / "report.png"
    chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom").stdout

    records = history.read_history(storage)
    assert [r.checkpoint_id for r in records] == [0, 1, 2, 3, 4, 5, 5, 6]
    assert values(dom, "chart-uploaded", "rect") == [
        (r.checkpoint_id, float(r.bytes_uploaded)) for r in records
    ]
    completed = [r for r in records if r.outcome == "completed"]
    assert values(dom, "chart-state", "circle") == [
        (r.checkpoint_id, float(r.state_size)) for r in completed
    ]
    assert len(values(dom, "chart-duration", "circle")) == 3 * len(completed)
    assert {v for _, v in values(dom, "chart-epochs", "circle")} == {1.0}

    listing = tools.list_checkpoints(str(job_dir))
    shown = {r[1]: r for r in rows(dom, "checkpoints")}
    for entry in [*listing.checkpoints, *listing.savepoints]:
        assert shown[entry.path][5] == str(entry.referenced_bytes)
    assert set(shown) == {"chk-5", "chk-6", "savepoints/before-upgrade"}
    held = {r[0]: r[3].split(", ") for r in rows(dom, "shared")}
    with open_job(str(job_dir)) as job:
        meta = job.read_document("savepoints/before-upgrade/_metadata")
    sp_key = "savepoints/before-upgrade/_metadata"
    sp_shared = {ref.path for ref in tools.reports.file_refs(meta, sp_key)
                 if ref.scope == "shared"}
    assert sp_shared and all("savepoints/before-upgrade" in held[p] for p in sp_shared)
    usage = tools.du(str(job_dir))
    assert dict((r[0], r[1]) for r in rows(dom, "usage"))["total"] == str(usage.total_bytes)
    assert '<p id="problems" class="ok">no problems</p>' in dom
    aborted = [r for r in rows(dom, "history") if r[2] == "aborted"]
    assert aborted and aborted[0][-1] == "ValueError: the sink refused the batch"


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
