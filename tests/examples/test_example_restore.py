"""The example CLI rescaled, then restored into a new job with --restore-from.

A rescale (parallelism 2 -> 3 -> 1, more input each time) through the CLI gives the same
results as one plain-Python pass, batch by batch. That job is then the source of a restore
into a new job in each mode: no-claim leaves the source as it was and survives its
deletion; claim moves the files. Results stay exact.

The rescaled job runs once (a module fixture); each restore mode works on its own copy of
its folders, so the modes share that run instead of each running a source job."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from statehold import tools
from statehold.examples.running_totals import generate_demo
from tests.support.example_runs import Totals, read_output, reference, run_example

pytestmark = [pytest.mark.spark, pytest.mark.scenario]

#: The rescaled job's options but --parallelism (its restores use them too).
MAX_PARALLELISM = "12"
FILES_PER_BATCH = 2


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def common_args(root: Path) -> list[str]:
    return ["--input", str(root / "in"), "--output", str(root / "out"),
            "--checkpoints", str(root / "ckpt"), "--max-parallelism", MAX_PARALLELISM,
            "--files-per-batch", str(FILES_PER_BATCH)]


@dataclass(frozen=True)
class RescaleStep:
    parallelism: str
    returncode: int
    stderr: str
    output: list[Totals]
    expected: list[Totals]


@dataclass(frozen=True)
class Rescaled:
    root: Path  # in/, out/, ckpt/running-totals/ as the last step left them
    steps: list[RescaleStep]


@pytest.fixture(scope="module")
def rescaled(tmp_path_factory: pytest.TempPathFactory) -> Rescaled:
    """Parallelism 2, then 3 with more input, then 1 with more input: what each run
    returned and wrote, and the plain-Python reference at that point."""
    root = tmp_path_factory.mktemp("rescaled")
    source = root / "source"
    generate_demo(source, files=6, rows=80, keys=25)
    names = sorted(source.glob("*.jsonl"))
    inp, out = root / "in", root / "out"
    inp.mkdir()
    steps = []
    for parallelism, files in (("2", names[:2]), ("3", names[2:4]), ("1", names[4:])):
        for f in files:
            f.rename(inp / f.name)
        run = run_example(root, *common_args(root), "--parallelism", parallelism)
        steps.append(RescaleStep(parallelism, run.returncode, run.stderr[-3000:],
                                 read_output(out), reference(inp, FILES_PER_BATCH)))
        if run.returncode != 0:
            break
    return Rescaled(root, steps)


def test_example_cli_rescale_up_and_down(rescaled: Rescaled) -> None:
    """Parallelism 2, then 3 with more input, then 1 with more input: the same results as
    one plain-Python pass, batch by batch (state moved between key-group ranges)."""
    for step in rescaled.steps:
        assert step.returncode == 0, (step.parallelism, step.stderr)
        assert step.output == step.expected, step.parallelism
    assert [s.parallelism for s in rescaled.steps] == ["2", "3", "1"]
    assert len(rescaled.steps[-1].output) == 3


def add_files(tmp_path: Path, inp: Path, name: str, first: int) -> None:
    """Two new input files (one batch), named after every file already there."""
    more = tmp_path / name
    generate_demo(more, files=FILES_PER_BATCH, rows=40, keys=25)
    for i, f in enumerate(sorted(more.glob("*.jsonl"))):
        f.rename(inp / f"part-{first + i:05d}.jsonl")


@pytest.mark.parametrize("mode", ["no-claim", "claim"])
def test_example_restores_into_a_new_job(
    rescaled: Rescaled, tmp_path: Path, mode: str
) -> None:
    assert [s.returncode for s in rescaled.steps] == [0, 0, 0], "the source job failed"
    for folder in ("in", "out", "ckpt"):  # this mode's own copy of the job and its files
        shutil.copytree(rescaled.root / folder, tmp_path / folder)
    inp, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    common = [*common_args(tmp_path), "--parallelism", "2"]
    source_dir = ckpt / "running-totals"
    assert (source_dir / "chk-2").is_dir()
    source_before = tree(source_dir)

    add_files(tmp_path, inp, "more", 10)
    restored = run_example(tmp_path, *common, "--job-id", "copy",
                           "--restore-from", str(source_dir / "chk-2"), "--mode", mode)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "checkpoint 3," in restored.stdout  # continues after the source's position
    assert read_output(out) == reference(inp, FILES_PER_BATCH)  # batch 3 by the new job

    copy_dir = ckpt / "copy"
    assert tools.verify(str(copy_dir)).ok
    if mode == "no-claim":
        assert tree(source_dir) == source_before  # never modified
        shutil.rmtree(source_dir)  # and no longer needed
    else:
        moved = {f.path for f in tools.inspect(str(source_dir / "chk-2")).files}
        assert moved and not moved & set(tree(source_dir))  # claimed: moved out

    add_files(tmp_path, inp, "again", 12)
    again = run_example(tmp_path, *common, "--job-id", "copy")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint 4," in again.stdout
    assert read_output(out) == reference(inp, FILES_PER_BATCH)
    assert tools.verify(str(copy_dir)).ok
