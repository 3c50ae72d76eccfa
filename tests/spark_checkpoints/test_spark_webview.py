"""`statehold report --html` and `statehold ui` on a Spark checkpoint location: the page
headless Chromium renders carries the location's numbers (the charts' values are the
history's, the tables list's and du's), and the server answers GET only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from threading import Thread

import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.cli.webview import make_server
from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_locations.handmade_files import logs, rocksdb_changelog_store

CHROMIUM = shutil.which("chromium")


def make(root: Path) -> Path:
    logs(root, range(3, 7))
    rocksdb_changelog_store(root, "state/0/0", range(1, 8), {2, 5})
    rocksdb_changelog_store(root, "state/0/1", range(1, 8), {4})
    return root


def rows(dom: str, table: str) -> list[list[str]]:
    found = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert found, f"no table {table}"
    trs = re.findall(r"<tr>(.*?)</tr>", found[1])
    return [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in trs]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_report_of_a_spark_checkpoint_in_chromium(tmp_path: Path) -> None:
    root = make(tmp_path / "ckpt")
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(root), "--html", str(html)])
    assert result.exit_code == 0, result.output
    assert CHROMIUM is not None
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    location = open_spark_checkpoint(str(root))
    records = location.history().records
    svg = re.search(r'<svg id="chart-state".*?</svg>', dom, re.S)
    assert svg is not None
    points = re.findall(r'data-x="(\d+)" data-value="([^"]+)"', svg[0])
    shown = [(int(x), float(v)) for x, v in points]
    assert shown == [(r.batch, float(sum(o.bytes for o in r.operators or []))) for r in records]
    assert [r[0] for r in rows(dom, "batches")] == ["6", "5", "4", "3"]
    stores = {(r[1], r[5]) for r in rows(dom, "stores")}
    assert stores == {("0", "snapshot+changelogs"), ("1", "snapshot+changelogs")}
    total = dict((r[0], r[2]) for r in rows(dom, "usage"))["total"]
    assert total == str(location.du().total_bytes)
    assert '<p id="problems" class="ok">no problems</p>' in dom


def test_ui_serves_the_spark_page_and_only_reads(tmp_path: Path) -> None:
    root = make(tmp_path / "ckpt")
    before = sorted((p.relative_to(root), p.stat().st_mtime) for p in root.rglob("*"))
    server = make_server(str(root), None, 0)
    Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        body = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "Spark checkpoint:" in body and 'id="batches"' in body
        request = urllib.request.Request(url, method="DELETE")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405
    finally:
        server.shutdown()
        server.server_close()
    assert sorted((p.relative_to(root), p.stat().st_mtime) for p in root.rglob("*")) == before
    assert os.path.isdir(root / "state")
