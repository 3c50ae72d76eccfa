"""One progress protocol for both worlds (issue 42): gc of a job directory and gc of a
Spark checkpoint location (a committed fixture, tests/fixtures/spark/) take the same
`statehold.progress.Progress` through `statehold.open(...).gc`, and what they tell it
adds up to what their reports say they listed and deleted. The old progress shapes
(``GcProgress``, the Spark gc's ``Progress`` callback) still work for one release, with
a DeprecationWarning."""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import statehold
from statehold.progress import Advance, Progress
from statehold.storage import open_storage
from tests.support.in_flight import add_orphans
from tests.support.jobs import build_job
from tests.support.spark_locations.committed_fixtures import copy_of, extractor, manifests
from tests.support.spark_locations.disk_trees import plant

ORPHANS = 250


@dataclass
class Counted:
    total: int | None
    unit: str
    advances: list[int] = field(default_factory=list)

    @property
    def done(self) -> int:
        return sum(self.advances)


class Recorded:
    """A `Progress` that keeps everything it is told (counters may be told from gc's
    deleting threads)."""

    def __init__(self) -> None:
        self.phases: list[str] = []
        self.counters: dict[str, Counted] = {}
        self._lock = threading.Lock()

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        self.phases.append(description)

    def advance(self, amount: int) -> None:
        raise AssertionError("gc reports through counters, not phases")

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        assert description not in self.counters, description
        counted = self.counters[description] = Counted(total, unit)

        def add(n: int) -> None:
            with self._lock:
                counted.advances.append(n)

        return add


def a_job_with_orphans(root: Path) -> str:
    storage = open_storage(str(root))
    job = build_job(storage)
    job.coord.close()
    add_orphans(storage, job.coord.epoch, ORPHANS)
    return str(root)


def a_spark_location_with_orphans(tmp_path: Path) -> tuple[str, set[Path]]:
    """The newest PySpark's window query on RocksDB (a copy, two hours old) and old
    orphans in both partitions' stores."""
    version = sorted(manifests())[-1]
    fx = copy_of(extractor(tmp_path / "fixtures")(version), version, "window",
                 "rocksdb_changelog", tmp_path / "spark")
    store = fx.checkpoint / "state" / "0"
    orphans = {plant(store / p / "SSTs" / f"orphan-{i}.sst", b"x" * (100 + i))
               for p in ("0", "1") for i in range(3)}
    return str(fx.checkpoint), orphans


def test_gc_of_both_kinds_reports_through_the_one_protocol(tmp_path: Path) -> None:
    assert isinstance(Recorded(), Progress)
    job = a_job_with_orphans(tmp_path / "job")
    spark, orphans = a_spark_location_with_orphans(tmp_path)

    with statehold.open(job) as location:
        told_dry = Recorded()
        dry_run = location.gc(dry_run=True, progress=told_dry)
        told = Recorded()
        report = location.gc(progress=told)
        uri = location.job.uri
    listed, deleted = f"gc {uri}: listed", f"gc {uri}: deleted"
    assert set(told_dry.counters) == {listed}  # a dry run deletes nothing
    assert told_dry.counters[listed].done == dry_run.scanned
    assert set(told.counters) == {listed, deleted}
    assert (told.counters[listed].unit, told.counters[deleted].unit) == ("files", "files")
    assert told.counters[listed].done == report.scanned > ORPHANS
    assert told.counters[deleted].done == report.deleted >= ORPHANS
    assert report.deleted == dry_run.orphan_count

    with statehold.open(spark) as location:
        told_dry = Recorded()
        dry_run = location.gc(dry_run=True, progress=told_dry)
        told = Recorded()
        found = location.gc(progress=told)
        uri = location.uri
    listed, deleted, freed = (f"gc {uri}: {what}" for what in ("listed", "deleted", "freed"))
    assert set(told_dry.counters) == {listed}
    assert told_dry.counters[listed].done == dry_run.listed
    assert set(told.counters) == {listed, deleted, freed}
    assert told.counters[listed].done == found.listed > len(orphans)
    # deletes and bytes of the planned total, told a batch at a time
    assert told.counters[deleted].total == dry_run.deletable == found.deletable
    assert told.counters[deleted].done == found.deleted >= len(orphans)
    assert (told.counters[freed].unit, told.counters[freed].total) == ("bytes",
                                                                       found.deletable_bytes)
    assert told.counters[freed].done == found.deleted_bytes > 0
    assert not any(p.exists() for p in orphans)


def test_the_old_progress_shapes_still_work_for_one_release(tmp_path: Path) -> None:
    cleanup_gc = importlib.import_module("statehold.cleanup.gc")
    spark_gc = importlib.import_module("statehold.spark_checkpoints.gc")
    with pytest.warns(DeprecationWarning, match="GcProgress is replaced by"):
        old_job_progress = cleanup_gc.GcProgress
    with pytest.warns(DeprecationWarning, match="gc.Progress is replaced by"):
        assert spark_gc.Progress is not None

    listed: list[int] = []
    deleted: list[tuple[int, int]] = []
    with statehold.open(a_job_with_orphans(tmp_path / "job")) as location:
        report = location.gc(progress=old_job_progress(
            listed=listed.append, deleted=lambda files, nbytes: deleted.append((files, nbytes))))
    assert sum(listed) == report.scanned
    assert sum(f for f, _b in deleted) == report.deleted >= ORPHANS

    spark, _orphans = a_spark_location_with_orphans(tmp_path)
    totals: list[tuple[int, int]] = []

    def told(files: int, nbytes: int) -> None:
        totals.append((files, nbytes))

    with statehold.open(spark) as location, pytest.warns(DeprecationWarning,
                                                          match="callback"):
        found = location.gc(progress=told)  # type: ignore[arg-type]
    assert totals and totals[-1] == (found.deleted, found.deleted_bytes)
    assert totals == sorted(totals)  # totals so far, after each batch
