"""The Python API: one location object, every operation a method, the same results as
the functions and commands behind it."""

from __future__ import annotations

from pathlib import Path

from statehold.spark_checkpoints import SparkCheckpointLocation, open_spark_checkpoint
from tests.support.spark_locations.handmade_files import logs, rocksdb_changelog_store, write


def test_one_object_every_operation(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    logs(root, range(3, 7))
    rocksdb_changelog_store(root, "state/0/0", range(1, 8), {2, 5})
    orphan = write(root, "state/0/0/SSTs/000999-orphan.sst", b"x" * 10)
    location = open_spark_checkpoint(str(root))
    assert isinstance(location, SparkCheckpointLocation)
    assert location.listing().restart_batch == 6
    assert location.verify(5).ok
    assert location.du().bytes["ssts"] > 0
    assert [r.batch for r in location.history(limit=2).records] == [5, 6]
    assert [p.path for p in location.absolute_paths()][:1] == ["file:///data/in/00000.json"]
    assert location.gc(dry_run=True, grace_seconds=0).deletable >= 1 and orphan.exists()
    assert location.gc(grace_seconds=0).deleted >= 1 and not orphan.exists()
    saved = location.savepoint(str(tmp_path / "sp"), batch=4)
    assert saved.batch == 4 and open_spark_checkpoint(str(tmp_path / "sp")).verify().ok
    rolled = location.rollback(5, force=True, keep=str(tmp_path / "kept"))
    assert rolled.to_batch == 5 and location.listing().restart_batch == 5
    moved = location.relocate("file:///data/in", "file:///new/in", dry_run=True)
    assert moved.dry_run and moved.paths > 0
