"""gc at scale (issue 16): a streamed gc over many pages deletes exactly what the policy,
asked about the whole listing held in memory, calls deletable; `gc --spark` on a
local-cluster leaves the same files as a local gc; a gc beside a running job deletes
nothing live. All proven by listing storage."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statehold.cleanup.gc import gc
from statehold.cleanup.holders import Holders, read_holders
from statehold.cleanup.policy import (
    LiveAttempt,
    Verdict,
    View,
    check_discardable_names,
    judge,
    judge_names,
)
from statehold.cleanup.reconcile import SAMPLE, live_attempt
from statehold.cleanup.sweep import KeyRange, ReconcilePlan, sweep
from statehold.job.directory import open_job
from statehold.spark.gc import ranges
from statehold.storage import Storage, open_storage
from statehold.storage.base import FileInfo, UnsafePathError
from tests.support.in_flight import (
    add_orphans,
    leave_in_flight_mess,
    running_with_checkpoint_in_flight,
    start,
)
from tests.support.paths import ROOT
from tests.support.simulated_tasks import (
    RANGES,
    SimulatedTask,
    referenced_by_retained,
    run_checkpoint,
)


def crashed_job(storage: Storage, orphans: int) -> set[str]:
    """A job whose driver is gone (lease released), with its in-flight mess, `orphans`
    unreferenced data files of finished checkpoints and a foreign file. Returns the
    listing."""
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(7)) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    leave_in_flight_mess(storage, coord, tasks, 4)
    coord.close()
    add_orphans(storage, coord.epoch, orphans)
    storage.write("notes.txt", b"not statehold's")
    return listing(storage)


def listing(storage: Storage) -> set[str]:
    """Every key in the job directory."""
    return {info.key for info in storage.list()}


def in_memory_deletable(storage: Storage) -> set[str]:
    """Yesterday's plan: the whole listing in memory, one View over it, every file judged."""
    with open_job(storage) as job:
        state = job.state()
        files = list(storage.list())
        view = View.of(state.epoch, read_holders(job, state), live_attempt(job, state), files)
        return {f.key for f in files if judge(f, view) is Verdict.DELETABLE}


@pytest.mark.parametrize("orphans", [2500])
def test_streamed_gc_over_many_pages_equals_the_in_memory_plan(
    storage: Storage, orphans: int
) -> None:
    orphans = orphans if storage.uri.startswith("file:") else 1200
    before = crashed_job(storage, orphans)
    expected = in_memory_deletable(storage)
    assert len(expected) > SAMPLE  # more orphans than any report names
    sizes = {info.key: info.size for info in storage.list()}
    with open_job(storage) as job:
        dry = gc(job, page_size=37, dry_run=True)
        report = gc(job, page_size=37)  # many pages
    after = listing(storage)
    assert after == before - expected
    assert report.orphan_count == report.deleted == dry.orphan_count == len(expected)
    # a dry run stats what it would delete; a gc takes the bytes from an object
    # store's listing, and counts none on a local disk (it deletes by name, as find)
    assert dry.orphan_bytes == sum(sizes[k] for k in expected) > 0
    local = storage.uri.startswith("file:")
    assert report.orphan_bytes == (None if local else dry.orphan_bytes)
    assert len(report.orphans) == SAMPLE and set(report.orphans) <= expected
    assert report.foreign == ["notes.txt"] and report.scanned == len(before)


def test_gc_beside_a_running_job_deletes_nothing_live(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    coord = running_with_checkpoint_in_flight(storage, seed=8)
    live = listing(storage)
    add_orphans(storage, coord.epoch, 1500)
    with open_job(storage) as job:
        report = gc(job, page_size=50)
    assert report.live_epoch == coord.epoch and report.deleted == 1500
    assert listing(storage) == live  # the orphans gone, every live file still there
    coord.complete(4)  # the in-flight checkpoint completes with all its files
    assert referenced_by_retained(storage, coord) <= listing(storage)
    coord.close()


NAMES = [
    "e1-c1-aa", "e1-c5-bb", "e2-c3-cc", "e2-c7-dd", "e3-c1-ee", "e2-c3-cc.x_y",
    ".e1-c1-aa.tmp-0123", "e1-c1-aa.tmp-99", "notes.txt", "e1-c-zz", "E1-c1-aa", "e1-c1-",
]


@pytest.mark.parametrize("directory", ["shared", "exclusive", "chk-3", "taskowned", ""])
@pytest.mark.parametrize("live", [None, LiveAttempt(2, 4)])
@pytest.mark.parametrize("spare_all", [False, True])
def test_judge_names_decides_as_judge_does(
    directory: str, live: LiveAttempt | None, spare_all: bool
) -> None:
    """The bulk, by-name decision equals `judge`'s for every name it decides (and it
    leaves to `judge` every name it cannot decide from the name alone)."""
    base = f"{directory}/" if directory else ""
    holders = Holders(spare_all_data=spare_all)
    view = View(2, holders, live, frozenset({f"{base}e1-c5-bb"}), now=1e9)
    out = judge_names(directory, NAMES, view)
    assert sorted(n for names in out.values() for n in names) == sorted(NAMES)
    decided = {n: v for v, names in out.items() if v is not None for n in names}
    for name, verdict in decided.items():
        assert judge(FileInfo(base + name, 1, 0.0), view) is verdict, name
    if directory in ("shared", "exclusive"):  # data names are decided in bulk
        assert set(decided) == {n for n in NAMES[:6]}
        assert (Verdict.DELETABLE in decided.values()) == (not spare_all)
    else:
        assert not decided


def test_check_discardable_names_refuses_what_the_policy_never_deletes() -> None:
    assert check_discardable_names("shared", ["e1-c1-a", "x"]) == ["e1-c1-a", "x"]
    many = [f"e1-c1-{i}" for i in range(1000)]  # a batch is checked at once: the bad
    for directory, name in (  # name may be anywhere in it
        ("_ha", "pointer.json"), ("shared", ".."), ("shared", "."), ("shared", ""),
        ("shared", "a/../../x"), ("shared", "/etc/passwd"), ("exclusive", "..\\x"),
        ("shared", "a\x00b"), ("_job", "result"),
    ):
        for at in (0, 500, 1000):
            with pytest.raises(UnsafePathError):
                check_discardable_names(directory, [*many[:at], name, *many[at:]])


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "/x", "..\\x", "c:x", "a\x00b"])
def test_delete_names_refuses_a_bad_name_anywhere_and_deletes_nothing(
    tmp_path: Path, name: str
) -> None:
    storage = open_storage(str(tmp_path / "job"))
    good = [f"e1-c1-{i}" for i in range(500)]
    for n in good:
        storage.write(f"shared/{n}", b"x")
    (tmp_path / "outside").write_bytes(b"keep")
    with pytest.raises(UnsafePathError):
        storage.delete_names("shared", [*good[:250], name, *good[250:]])
    assert len(list(storage.list("shared"))) == 500 and (tmp_path / "outside").exists()


def test_key_ranges_split_a_sweep_without_losing_or_repeating_a_file(
    storage: Storage,
) -> None:
    """The tasks of `gc --spark` list a big directory by key range: together the ranges
    judge every file once, with the counts of one whole sweep (on each store)."""
    crashed_job(storage, 300 if storage.uri.startswith("file:") else 120)
    with open_job(storage) as job:
        state = job.state()
        view = View.of(state.epoch, read_holders(job, state), None, storage.list("savepoints"))
    whole = ReconcilePlan()
    seen_whole: list[str] = []
    sweep(storage, view, whole, prefix="shared", page_size=25,
          on_names=lambda d, names: seen_whole.extend(f"{d}/{n}" for n in names),
          on_infos=lambda infos: seen_whole.extend(i.key for i in infos))
    parts = ranges("shared", view, splits=8)
    assert len(parts) > 2 and parts[0].start is None and parts[-1].stop is None
    split = ReconcilePlan()
    seen: list[str] = []
    for keys in [*parts, KeyRange("shared/e", "shared/e")]:  # an empty range lists nothing
        sweep(storage, view, split, prefix="shared", keys=keys, page_size=25,
              on_names=lambda d, names: seen.extend(f"{d}/{n}" for n in names),
              on_infos=lambda infos: seen.extend(i.key for i in infos))
    assert sorted(seen) == sorted(seen_whole) and len(seen) == len(set(seen)) > 100
    for field in ("scanned", "referenced", "orphan_count", "protected_count"):
        assert getattr(split, field) == getattr(whole, field), field


def _clone(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)


@pytest.mark.spark
def test_spark_gc_on_local_cluster_equals_local_gc_and_spares_a_running_job(
    tmp_path: Path,
) -> None:
    """One Spark start (a subprocess: the local-cluster master cannot share this run's
    local session): `gc ROOT --all-jobs --spark` over a stopped job and a running one."""
    root = tmp_path / "root"
    stopped = open_storage(str(root / "stopped"))
    crashed_job(stopped, 1500)
    twin = tmp_path / "twin"
    _clone(root / "stopped", twin)
    with open_job(str(twin)) as job:
        local = gc(job)

    running = open_storage(str(root / "running"))
    coord = running_with_checkpoint_in_flight(running, seed=9)
    live = listing(running)
    add_orphans(running, coord.epoch, 700)
    (root / "not-a-job").mkdir()

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "statehold", "gc", str(root), "--all-jobs", "--spark",
         "--master", "local-cluster[2,1,1024]", "--json"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = {Path(r["job_uri"]).name: r for r in json.loads(done.stdout)["jobs"]}
    assert set(reports) == {"stopped", "running"}

    relative = {str(p.relative_to(twin)) for p in twin.rglob("*") if p.is_file()}
    assert listing(stopped) == relative  # the same files left as by the local gc
    for field in ("scanned", "referenced", "orphan_count", "deleted", "protected_count",
                  "foreign_count"):
        assert reports["stopped"][field] == getattr(local, field), field

    assert reports["running"]["live_epoch"] == coord.epoch
    assert reports["running"]["deleted"] == 700
    assert listing(running) == live
    coord.complete(4)
    assert referenced_by_retained(running, coord) <= listing(running)
    coord.close()


def test_maintenance_benchmark_runs(tmp_path: Path) -> None:
    """`bench/maintenance.py` end to end with tiny numbers (nothing here is timed)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "maintenance.py"), "--files", "3000",
         "--s3-files", "300", "--per-object-sample", "50", "--no-spark", "--work",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["local"]["shared_files_left"] < 10  # only the live job's files
    assert result["s3"]["files"] == 300


def test_gc_all_jobs_collects_each_job_under_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    expected = {}
    for name in ("a", "b"):
        storage = open_storage(str(root / name))
        crashed_job(storage, 40)
        expected[name] = listing(storage) - in_memory_deletable(storage)
    (root / "not-a-job").mkdir()
    (root / "not-a-job" / "file.txt").write_bytes(b"x")
    done = subprocess.run(
        [sys.executable, "-m", "statehold", "gc", str(root), "--all-jobs", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert sorted(Path(r["job_uri"]).name for r in result["jobs"]) == ["a", "b"]
    assert result["errors"] == {}
    for name, files in expected.items():
        assert listing(open_storage(str(root / name))) == files
    assert (root / "not-a-job" / "file.txt").exists()


@pytest.mark.parametrize("with_stat", [False, True])
def test_a_local_page_of_names_comes_in_inode_order(tmp_path: Path, with_stat: bool) -> None:
    """Unlinks walk the inode table in order, as GNU find's do (not the directory's hash
    order); sizes and times stay with their names."""
    storage = open_storage(str(tmp_path / "job"))
    for i in range(600):
        storage.write(f"shared/e1-c1-{i:04d}", b"x" * (i % 7))
    pages = list(storage.list_stat_pages("shared", 250) if with_stat
                 else storage.list_name_pages("shared", 250))
    assert [len(p.names) for p in pages] == [250, 250, 100]
    for page in pages:
        inodes = [os.lstat(tmp_path / "job" / "shared" / n).st_ino for n in page.names]
        assert inodes == sorted(inodes)
        if with_stat:
            assert page.sizes == [int(n[-4:]) % 7 for n in page.names]
