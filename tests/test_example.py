"""The example CLI end to end in a subprocess: a fresh directory (demo data generated),
a second run that picks up a new file, a malformed file that fails with a clear error,
and a rescale (parallelism 2 -> 3 -> 1) through the CLI. Outputs are compared with a
plain-Python computation over the input files.

The subprocesses import statehold from this work tree's ``src/`` (PYTHONPATH), whatever
the installed copy is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from statehold.examples.running_totals import LAST_N, generate_demo
from statehold.format import layout
from tests.support.paths import ROOT, SRC

pytestmark = pytest.mark.spark

Totals = dict[str, tuple[int, int]]


def example_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an example subprocess: this tree's code (and `tests.support`, for
    the drivers and phase hooks), task state under tmp."""
    path = [str(SRC), str(ROOT),
            *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(path),
        "STATEHOLD_LOCAL_DIR": str(tmp / "task-state"),
        **dict(extra or {}),
    }


def example_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "statehold.examples.running_totals", *args]


def run_example(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        example_cmd(*args), cwd=cwd, env=example_env(cwd), capture_output=True, text=True,
        timeout=600,
    )


def read_rows(path: Path) -> list[tuple[str, int]]:
    return [(r["key"], r["value"]) for r in map(json.loads, path.read_text().splitlines())]


def reference(input_dir: Path, files_per_batch: int = 1) -> list[Totals]:
    """Per batch (files in name order): (count, sum) of the keys it touched."""
    totals: Totals = {}
    batches = []
    names = sorted(input_dir.glob("*.jsonl"))
    for i in range(0, len(names), files_per_batch):
        touched: Totals = {}
        for path in names[i : i + files_per_batch]:
            for key, value in read_rows(path):
                c, s = totals.get(key, (0, 0))
                totals[key] = touched[key] = (c + 1, s + value)
        batches.append(touched)
    return batches


def reference_state(input_dir: Path) -> dict[str, dict[str, object]]:
    """The final state per key: count, sum and the last values, in file and line order."""
    state: dict[str, dict[str, object]] = {}
    for path in sorted(input_dir.glob("*.jsonl")):
        for key, value in read_rows(path):
            s = state.setdefault(key, {"count": 0, "sum": 0, "last": []})
            s["count"] = int(str(s["count"])) + 1
            s["sum"] = int(str(s["sum"])) + value
            s["last"] = [*list(s["last"]), value][-LAST_N:]  # type: ignore[call-overload]
    return state


def read_output(output: Path) -> list[Totals]:
    batches = []
    for d in sorted(output.glob("batch-*")):
        rows = {}
        for part in d.glob("part-*.json"):
            for line in part.read_text().splitlines():
                r = json.loads(line)
                assert r["key"] not in rows, f"{d.name}: key {r['key']} written twice"
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


def test_example_cli_rescale_up_and_down(tmp_path: Path) -> None:
    """Parallelism 2, then 3 with more input, then 1 with more input: the same results as
    one plain-Python pass, batch by batch (state moved between key-group ranges)."""
    source = tmp_path / "source"
    generate_demo(source, files=6, rows=80, keys=25)
    names = sorted(source.glob("*.jsonl"))
    inp, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    inp.mkdir()
    common = ["--input", str(inp), "--output", str(out), "--checkpoints", str(ckpt),
              "--max-parallelism", "12", "--files-per-batch", "2"]
    for parallelism, files in (("2", names[:2]), ("3", names[2:4]), ("1", names[4:])):
        for f in files:
            f.rename(inp / f.name)
        run = run_example(tmp_path, *common, "--parallelism", parallelism)
        assert run.returncode == 0, run.stderr[-3000:]
        assert read_output(out) == reference(inp, 2)
    assert len(read_output(out)) == 3
