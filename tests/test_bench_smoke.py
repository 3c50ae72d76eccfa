"""The comparison benchmark runs end to end (tiny workload; nothing here is timed): so
`python bench/vs_spark.py` cannot rot unnoticed. Its numbers are read by hand
(docs/benchmarks.md); this only checks that both systems ran and kept the right state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spark_versions import needs_state_data_source

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.spark
@pytest.mark.scenario
@needs_state_data_source
def test_vs_spark_runs_and_both_systems_hold_the_right_state(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "vs_spark.py"),
        "--keys",
        "400",
        "--batches",
        "3",
        "--value-size",
        "20",
        "--systems",
        "statehold,aipws",
        "--work",
        str(tmp_path),
        "--s3-deletes",
        "50",
        "--local-deletes",
        "50",
        "--disk-bytes",
        str(1 << 20),
        "--driver-memory",
        "1g",
        "--plot",
        str(tmp_path / "charts"),
        # the warm-up path once, not its default 15 batches per system: nothing is timed
        "--warm-batches",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["failed"] == {}
    runs = {r["system"]: r for r in results["runs"]}
    assert len(runs) == 2
    for run in runs.values():
        # 400 keys, then 3 batches + the recovery batch of 5% (20 keys) each
        assert run["totals"][:2] == [400, 400 + 4 * 20], run["system"]
        assert not [n for n in run["notes"] if "WRONG STATE" in n]
    charts = sorted((tmp_path / "charts").glob("*.png"))
    assert charts, "--plot drew no chart"
    for chart in charts:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
        assert len(run["batches"]) == 4
        assert all(b["bytes_uploaded"] > 0 for b in run["batches"])
    assert results["s3_deletes_per_s"]["bulk"] > 0
    assert "checkpoint duration vs" in done.stdout
