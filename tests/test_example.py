"""The example CLI end to end in a subprocess: a fresh directory (demo data generated),
a second run that picks up a new file, and a malformed file that fails with a clear error.
Outputs are compared with a plain-Python computation over the input files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from statehold import layout
from statehold.examples.running_totals import generate_demo

pytestmark = pytest.mark.spark


def run_example(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, "-m", "statehold.examples.running_totals", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )


def reference(input_dir: Path) -> list[dict[str, tuple[int, int]]]:
    """Per batch (one file each, in name order): (count, sum) of the keys it touched."""
    totals: dict[str, tuple[int, int]] = {}
    batches = []
    for path in sorted(input_dir.glob("*.jsonl")):
        touched = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            c, s = totals.get(row["key"], (0, 0))
            totals[row["key"]] = touched[row["key"]] = (c + 1, s + row["value"])
        batches.append(touched)
    return batches


def read_output(output: Path) -> list[dict[str, tuple[int, int]]]:
    batches = []
    for d in sorted(output.glob("batch-*")):
        rows = {}
        for part in d.glob("part-*.json"):
            for line in part.read_text().splitlines():
                r = json.loads(line)
                rows[r["key"]] = (r["count"], r["sum"])
        batches.append(rows)
    return batches


def test_example_cli_fresh_dir_then_new_files(tmp_path: Path) -> None:
    first = run_example(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    demo = tmp_path / "statehold-demo"
    inputs = sorted((demo / "input").glob("*.jsonl"))
    assert inputs, "demo data was not generated"
    assert "checkpoint 0" in first.stdout and "uploaded" in first.stdout
    job_dir = demo / "checkpoints" / "running-totals"
    assert (job_dir / layout.SPARK_DIR).is_dir()
    assert read_output(demo / "output") == reference(demo / "input")

    # a file added later is picked up by the next run, which resumes from the checkpoint
    extra = tmp_path / "extra"
    generate_demo(extra, files=1, rows=40, keys=5)
    (extra / "part-00000.jsonl").rename(demo / "input" / "part-99999.jsonl")
    second = run_example(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"checkpoint {len(inputs)}," in second.stdout
    assert "checkpoint 0," not in second.stdout
    assert read_output(demo / "output") == reference(demo / "input")
    assert (job_dir / layout.checkpoint_metadata_key(len(inputs))).is_file()

    # a malformed row fails the batch with the file named, and checkpoints nothing
    bad = demo / "input" / "part-99999x.jsonl"
    bad.write_text('{"key": "a", "value": 1}\n{"key": null, "value": 2}\n')
    third = run_example(tmp_path)
    assert third.returncode == 1
    assert "malformed input row" in third.stderr and "part-99999x.jsonl" in third.stderr
    assert not (job_dir / layout.checkpoint_metadata_key(len(inputs) + 1)).exists()
