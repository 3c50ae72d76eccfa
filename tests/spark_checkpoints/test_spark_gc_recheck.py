"""gc's re-check before each batch of deletes, beside a query that keeps writing: a
version file rewritten after the listing is left, and a commit log that went back (a
rollback, a restart from an older point) stops gc."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.gc import SparkGcInterruptedError
from tests.support.spark_locations.handmade_files import hdfs_store, logs, write

STORE = "state/0/0"
OLD = time.time() - 86_400


def old_checkpoint(root: Path) -> None:
    """Batches 3-6 retained, HDFS store versions 1-7, snapshot at 4: versions 1-3 and
    their checksums are gc's, everything a day old."""
    logs(root, range(3, 7))
    hdfs_store(root, STORE, range(1, 8), {4})
    for v in (1, 2, 3):
        write(root, f"{STORE}/.{v}.delta.crc", b"crc")
    for path in root.rglob("*"):
        os.utime(path, (OLD, OLD))


def test_a_file_rewritten_after_the_listing_is_left(tmp_path: Path) -> None:
    old_checkpoint(tmp_path)
    location = open_spark_checkpoint(str(tmp_path))
    storage: Any = location.storage
    restat = storage.stat_names

    def rewritten_meanwhile(directory: str, names: list[str]) -> Any:
        write(tmp_path, f"{STORE}/2.delta", b"written again by a rerun")
        return restat(directory, names)

    storage.stat_names = rewritten_meanwhile
    report = location.gc(grace_seconds=60)
    assert (tmp_path / STORE / "2.delta").read_bytes() == b"written again by a rerun"
    assert not (tmp_path / STORE / "1.delta").exists() and report.changed == 1


def test_a_commit_log_gone_back_stops_gc(tmp_path: Path) -> None:
    old_checkpoint(tmp_path)
    location = open_spark_checkpoint(str(tmp_path))
    storage: Any = location.storage
    delete = storage.delete_names

    def rolled_back_meanwhile(directory: str, names: list[str], **options: Any) -> int:
        os.unlink(tmp_path / "commits" / "6")
        storage.delete_names = delete
        return int(delete(directory, names, **options))

    storage.delete_names = rolled_back_meanwhile
    from statehold.spark_checkpoints.gc import gc

    with pytest.raises(SparkGcInterruptedError):
        gc(location, grace_seconds=60, batch_size=1)
    left = sorted(p.name for p in (tmp_path / STORE).glob("*.delta"))
    assert len(left) == 6  # one delete went through, then gc stopped


def test_a_commit_written_during_the_listing_puts_its_state_in_flight(tmp_path: Path) -> None:
    """The listing is in no order: it may see commits/7, written while it ran, and not
    the state batch 7 wrote before it. That state is in flight for this pass, not a
    store with a missing version (which would spare the store and report a problem)."""
    old_checkpoint(tmp_path)
    write(tmp_path, "offsets/7", (tmp_path / "offsets" / "6").read_text())
    commit = write(tmp_path, "commits/7", 'v1\n{"nextBatchWatermarkMs":0}')
    future = time.time() + 3600  # "written after the listing began"
    os.utime(commit, (future, future))
    report = open_spark_checkpoint(str(tmp_path)).gc(grace_seconds=60)
    assert report.problems == [] and report.newest_batch == 6
    assert not (tmp_path / STORE / "1.delta").exists()  # the pass still collects
    assert (tmp_path / STORE / "7.delta").exists()


def test_a_failed_delete_is_named_in_the_report(tmp_path: Path) -> None:
    """A delete the store refuses is named in gc's report, one line for its batch, and
    the rest of the batch is deleted and counted (as before gc deleted through the
    deleter both worlds share, which the Spark gc hands `max_attempts=1`)."""
    from statehold.storage.base import DeleteError

    old_checkpoint(tmp_path)
    location = open_spark_checkpoint(str(tmp_path))
    storage: Any = location.storage
    delete = storage.delete_names
    calls: list[list[str]] = []

    def refusing_one(directory: str, names: list[str], **options: Any) -> int:
        calls.append(list(names))
        if "1.delta" not in names:
            return int(delete(directory, names, **options))
        delete(directory, [n for n in names if n != "1.delta"], **options)
        raise DeleteError({f"{directory}/1.delta": PermissionError("refused by the store")})

    storage.delete_names = refusing_one
    report = location.gc(grace_seconds=60)
    assert (tmp_path / STORE / "1.delta").exists()
    assert not (tmp_path / STORE / "2.delta").exists()
    assert report.problems == [
        f"{STORE}: 1 delete(s) failed ({STORE}/1.delta: refused by the store)"
    ]
    assert sum(n.count("1.delta") for n in calls) == 1
    assert f"{STORE}/1.delta" not in report.deleted_keys
    assert report.deleted == len(report.deleted_keys) == sum(len(n) for n in calls) - 1
