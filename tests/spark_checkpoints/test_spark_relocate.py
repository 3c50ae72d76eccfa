"""Relocation: a checkpoint copied elsewhere with its input moved, its absolute paths
rewritten, continues without reading its input again or losing any."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.relocate import absolute_paths, relocate
from tests.support.spark_locations.queries import all_rows, run_query, write_inputs

pytestmark = [pytest.mark.spark]


def test_relocated_checkpoint_continues_with_its_moved_input(
    spark, tmp_path: Path
) -> None:
    write_inputs(tmp_path / "ref-in", 0, 6)
    run_query(spark, "dedup", "rocksdb", str(tmp_path / "ref"), tmp_path / "ref-in",
              tmp_path / "r", 5)
    old_in, new_in = tmp_path / "old" / "in", tmp_path / "new" / "in"
    write_inputs(old_in, 0, 3)
    run_query(spark, "dedup", "rocksdb", str(tmp_path / "ckpt"), old_in, tmp_path / "out", 2)
    shutil.copytree(tmp_path / "ckpt", tmp_path / "moved")
    new_in.parent.mkdir()
    old_in.rename(new_in)
    moved = open_spark_checkpoint(str(tmp_path / "moved"))
    bound = absolute_paths(moved)
    assert bound and all(str(old_in) in b.path for b in bound)

    dry = relocate(moved, str(tmp_path / "old"), str(tmp_path / "new"), dry_run=True)
    assert absolute_paths(moved) == bound and dry.paths == len(bound)
    report = relocate(moved, str(tmp_path / "old"), str(tmp_path / "new"), force=True)

    assert report.paths == len(bound) and not report.others
    assert all(str(new_in) in b.path for b in absolute_paths(moved))
    write_inputs(new_in, 3, 3)
    run_query(spark, "dedup", "rocksdb", str(tmp_path / "moved"), new_in, tmp_path / "out", 5)
    assert all_rows(tmp_path / "out") == all_rows(tmp_path / "r")
