"""The example restored into a new job with --restore-from: no-claim leaves the source as
it was and survives its deletion; claim moves the files. Results stay exact."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statehold import tools
from statehold.examples.running_totals import generate_demo
from tests.support.example_runs import read_output, reference, run_example

pytestmark = [pytest.mark.spark, pytest.mark.scenario]


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("mode", ["no-claim", "claim"])
def test_example_restores_into_a_new_job(tmp_path: Path, mode: str) -> None:
    inp, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    generate_demo(inp, files=3, rows=60, keys=12)
    common = ["--input", str(inp), "--output", str(out), "--checkpoints", str(ckpt),
              "--max-parallelism", "16", "--parallelism", "2"]
    first = run_example(tmp_path, *common, "--job-id", "source")
    assert first.returncode == 0, first.stderr[-3000:]
    source_dir = ckpt / "source"
    source_before = tree(source_dir)

    more = tmp_path / "more"
    generate_demo(more, files=1, rows=40, keys=12)
    (more / "part-00000.jsonl").rename(inp / "part-00010.jsonl")
    restored = run_example(tmp_path, *common, "--job-id", "copy",
                           "--restore-from", str(source_dir / "chk-2"), "--mode", mode)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "checkpoint 3," in restored.stdout  # continues after the source's position
    assert read_output(out) == reference(inp)  # batch 3 written by the new job: exact

    copy_dir = ckpt / "copy"
    assert tools.verify(str(copy_dir)).ok
    if mode == "no-claim":
        assert tree(source_dir) == source_before  # never modified
        shutil.rmtree(source_dir)  # and no longer needed
    else:
        moved = {f.path for f in tools.inspect(str(source_dir / "chk-2")).files}
        assert moved and not moved & set(tree(source_dir))  # claimed: moved out

    (more / "again").mkdir()
    generate_demo(more / "again", files=1, rows=40, keys=12)
    (more / "again" / "part-00000.jsonl").rename(inp / "part-00011.jsonl")
    again = run_example(tmp_path, *common, "--job-id", "copy")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint 4," in again.stdout
    assert read_output(out) == reference(inp)
    assert tools.verify(str(copy_dir)).ok
