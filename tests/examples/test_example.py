"""The example CLI end to end in a subprocess: a fresh directory (demo data generated),
a second run that picks up a new file, and a malformed file that fails with a clear
error. Outputs are compared with a plain-Python computation over the input files. (The
rescale through the CLI is in test_example_restore.py, whose restores start from it.)

The subprocesses import statehold from this work tree's ``src/`` (PYTHONPATH), whatever
the installed copy is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statehold.examples.running_totals import generate_demo
from statehold.format import layout
from tests.support.example_runs import read_output, reference, run_example

pytestmark = pytest.mark.spark


def test_example_cli_fresh_dir_then_new_files(tmp_path: Path) -> None:
    first = run_example(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    demo = tmp_path / "statehold-demo"
    inputs = sorted((demo / "input").glob("*.jsonl"))
    assert inputs, "demo data was not generated"
    assert "checkpoint 0" in first.stdout and "uploaded" in first.stdout
    job_dir = demo / "checkpoints" / "running-totals"
    assert str(job_dir) in first.stdout  # where the checkpoints are
    assert not (job_dir / layout.SPARK_DIR).exists()  # the position is in our metadata
    assert read_output(demo / "output") == reference(demo / "input")
    last = json.loads((job_dir / layout.checkpoint_metadata_key(len(inputs) - 1)).read_text())
    assert last["source_position"]["last_file"] == inputs[-1].name

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

    # a malformed row fails the batch with the file and line named, and checkpoints nothing
    before = reference(demo / "input")
    bad = demo / "input" / "part-99999x.jsonl"
    bad.write_text('{"key": "a", "value": 1}\n\n{"key": null, "value": 2}\n')
    third = run_example(tmp_path)
    assert third.returncode == 1, third.stderr[-3000:]
    assert "malformed input row in part-99999x.jsonl line 3" in third.stderr
    assert not (job_dir / layout.checkpoint_metadata_key(len(inputs) + 1)).exists()
    assert read_output(demo / "output") == before
