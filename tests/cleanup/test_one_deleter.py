"""Both worlds' gc delete through the one guarded batch deleter (`BulkDeleter`), asking
the rule their gc hands it: a job directory's (`JobDirectoryRule`) and a Spark checkpoint
location's (`SparkGcRule`, on a committed fixture, without Spark). A rule that records
its calls, wrapped around whichever rule the deleter is given, sees every batch's last
line, re-check and file re-check before each delete; a key it refuses is kept. A gc that
deleted by another way would delete that key, and the recorder would see nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from statehold.cleanup.bulk_delete import BulkDeleter
from statehold.cleanup.gc import gc as job_gc
from statehold.cleanup.rule import DeletionRule
from statehold.job.directory import open_job
from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.storage import open_storage
from tests.support.in_flight import add_orphans, start
from tests.support.spark_locations.committed_fixtures import copy_of, manifests
from tests.support.spark_locations.disk_trees import plant


@dataclass
class Recording:
    """A rule around the deleter's own: records each call, and keeps `refused`."""

    rule: DeletionRule
    refused: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: Keys the deleter was let delete (what `unchanged` returned).
    allowed: set[str] = field(default_factory=set)

    def check_names(self, directory: str, names: list[str]) -> list[str]:
        self.calls.append(("check_names", directory))
        return self.rule.check_names(directory, names)

    def recheck(self) -> None:
        self.calls.append(("recheck", ""))
        self.rule.recheck()

    def unchanged(self, directory: str, names: list[str]) -> list[str]:
        self.calls.append(("unchanged", directory))
        base = f"{directory}/" if directory else ""
        same = [n for n in self.rule.unchanged(directory, names) if base + n != self.refused]
        self.allowed.update(base + n for n in same)
        return same


def recording(monkeypatch: pytest.MonkeyPatch, refused: str) -> list[Recording]:
    """Every `BulkDeleter` made from now on asks a `Recording` around its rule."""
    made: list[Recording] = []
    init = BulkDeleter.__init__

    def wrapped(self: BulkDeleter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(Recording(self.rule, refused))
        self.rule = made[-1]

    monkeypatch.setattr(BulkDeleter, "__init__", wrapped)
    return made


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def job_directory(root: Path) -> tuple[Callable[[], int], set[str], str]:
    """A stopped job with 50 orphan data files: its gc, the orphans, one to refuse."""
    storage = open_storage(str(root))
    coord = start(storage)
    epoch = coord.epoch
    coord.close()
    before = files(root)
    add_orphans(storage, epoch, 50)

    def collect() -> int:
        with open_job(storage) as job:
            return job_gc(job).deleted

    orphans = files(root) - before
    return collect, orphans, sorted(orphans)[0]


def spark_location(root: Path) -> tuple[Callable[[], int], set[str], str]:
    """A committed fixture (RocksDB with changelogs) with old orphans planted, in a
    store's ``SSTs/`` (not re-stat'ed: unique names) and beside its versions (re-stat'ed):
    its gc, what a gc of an identical copy, with the deleter left alone, deleted, and an
    orphan SST to refuse."""
    from tests.support.spark_locations.committed_fixtures import extractor

    version = sorted(manifests())[-1]
    archive = extractor(root / "archives")(version)
    names = [f"SSTs/{uuid.uuid4()}.sst", f"SSTs/{uuid.uuid4()}.sst",
             f".5.changelog.{uuid.uuid4()}.tmp", ".97.changelog.crc"]

    def location(name: str) -> Path:
        ckpt = copy_of(archive, version, "window", "rocksdb_changelog", root / name).checkpoint
        for orphan in names:
            plant(ckpt / "state" / "0" / "0" / orphan)
        return ckpt

    def collect(ckpt: Path) -> int:
        report = open_spark_checkpoint(str(ckpt)).gc(grace_seconds=60)
        assert report.ok, report.problems
        return report.deleted

    reference = location("reference")
    before = files(reference)
    collect(reference)
    expected = before - files(reference)
    assert {f"state/0/0/{n}" for n in names} <= expected
    ckpt = location("ckpt")
    return lambda: collect(ckpt), expected, f"state/0/0/{names[0]}"


@pytest.mark.parametrize("world", ["job", "spark"])
def test_both_gcs_delete_through_the_one_deleter_and_keep_what_its_rule_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: str
) -> None:
    root = tmp_path / "location"
    collect, orphans, refused = (job_directory if world == "job" else spark_location)(root)
    if world == "spark":
        root = root / "ckpt" / "ckpt"
    made = recording(monkeypatch, refused)
    before = files(root)

    deleted = collect()

    gone = before - files(root)
    assert len(made) == 1, "one deleter per gc"
    rule = made[0]
    assert refused in before - gone, "the key the rule refused was deleted"
    assert gone == orphans - {refused} and deleted == len(gone)
    assert gone <= rule.allowed, "deleted without the rule's re-check of the file"
    kinds = [kind for kind, _d in rule.calls]
    # each batch: its last line when handed over, then the re-check and the file re-check
    assert kinds and kinds[0] == "check_names", kinds
    for i, kind in enumerate(kinds):
        if kind == "unchanged":
            assert kinds[i - 1] == "recheck", kinds
        if kind == "recheck":
            assert "check_names" in kinds[:i], kinds
