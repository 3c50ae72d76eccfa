"""The simulation's Spark world (tests/sim/spark.py): a Structured Streaming query writing
its checkpoint location step by step beside statehold's Spark-location code. A short
sweep finds no violation, a seed replays exactly, and each planted bug is found within a
bound of seeds.

Holes in `src` are probed below on hand-made locations: (a) a savepoint copying source
log entries only up to the batch number, (b) a rollback deleting logs before state
files, (c) verify not checking the source log chain (all three fixed in main while this
world was written), and two this world found against the fixed code. While a probe shows
a hole open, the violation kind that finds it is noted (`tolerate`) instead of failing
the sweep, and the test says so."""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path

import pytest
from sim.quiet import quiet_logs  # noqa: F401 - autouse: the runs' log is silenced
from sim.spark import PLANTS, run_spark_seed

from statehold.errors import StateholdError
from statehold.spark_checkpoints import SparkCheckpointLocation, open_spark_checkpoint
from statehold.storage.base import StorageError
from statehold.storage.local import LocalStorage
from tests.support.spark_locations.handmade_files import (
    commit_file,
    file_log,
    hdfs_store,
    offsets_file,
    write,
)

STEPS = 1500
#: The sweep's seeds (one of each state store: rocksdb, rocksdb-v2, hdfs; between them
#: every kind of step and operation), 1,200 steps each: about two seconds in all. New
#: seeds are explored by `python tests/simulate.py --world spark` (docs/benchmarks.md).
SWEEP_SEEDS = range(3001, 3004)
SWEEP_STEPS = 1200
#: A rollback is cut short after a quarter of its deletes, not the soak's 8%: three short
#: seeds then reach an interrupted rollback whatever path a change to the code sends
#: them down (at 8%, a change to how verify reads operator metadata once left all
#: three without one).
SWEEP_ROLLBACK_CRASH = 0.25
#: Seeds within which each planted bug must be found (today at seeds 0, 0, 0, 0, 1 and 2:
#: (a), (b), (c), (d), (e), (f); the bound leaves room for the runs to change with the code).
BOUND = 8


# -- the holes being fixed in src, probed on hand-made locations ----------------------------
def _location(root: Path, batches: int, ahead: int) -> None:
    """metadata, offsets/commits 0..batches-1, a source log `ahead` entries ahead of the
    batch numbers (a driver died between an entry and its offsets), one HDFS store."""
    write(root, "metadata", '{"id": "probe"}')
    for b in range(batches + ahead):
        write(root, f"sources/0/{b}", file_log([(f"file:///in/{b:05d}.json", b)]))
    for b in range(batches):
        write(root, f"offsets/{b}", offsets_file(b, [{"logOffset": b + ahead}]))
        write(root, f"commits/{b}", commit_file(b))
    hdfs_store(root, "state/0/0", range(1, batches + 1), set())


def savepoint_hole_open(tmp: Path) -> bool:
    """(a): a savepoint of a batch whose logOffset is past its number misses entries."""
    _location(tmp / "a", 2, ahead=1)
    open_spark_checkpoint(str(tmp / "a")).savepoint(str(tmp / "a-sp"))
    return not (tmp / "a-sp" / "sources/0/2").exists()


def verify_hole_open(tmp: Path) -> bool:
    """(c): verify says ok with an entry missing from the middle of the source log."""
    _location(tmp / "c", 3, ahead=0)
    (tmp / "c" / "sources/0/1").unlink()
    return open_spark_checkpoint(str(tmp / "c")).verify().ok


class _FirstDelete(LocalStorage):
    """A local storage whose first delete is noted and fails (a crash right there)."""

    first: list[str]

    def delete_many(self, keys: object) -> None:
        self.first = list(keys)  # type: ignore[call-overload]
        raise StorageError("cut short (probe)")


def rollback_hole_open(tmp: Path) -> bool:
    """(b): a rollback cut short at its first delete has deleted a log (the location then
    looks rolled back, its later state files left for the next run to load)."""
    _location(tmp / "b", 4, ahead=0)
    storage = _FirstDelete(tmp / "b")
    with contextlib.suppress(StateholdError):
        SparkCheckpointLocation(storage).rollback(1, keep=str(tmp / "b-keep"), force=True)
    first: str = getattr(storage, "first", [""])[0]
    return first.startswith(("commits/", "offsets/"))


def verify_without_log_hole_open(tmp: Path) -> bool:
    """Found by this world against the fixed code: a location whose file source log is
    gone whole (its offsets still name a logOffset) verifies ok; Spark's restart would
    take every input file for new."""
    _location(tmp / "c2", 1, ahead=0)
    (tmp / "c2" / "sources/0/0").unlink()
    (tmp / "c2" / "sources/0").rmdir()
    (tmp / "c2" / "sources").rmdir()
    return bool(open_spark_checkpoint(str(tmp / "c2")).verify().ok)


def rollback_stuck_open(tmp: Path) -> bool:
    """Found by this world against the fixed code: a rollback cut short leaves its mark;
    the query started again anyway (Spark does not read the mark) runs past
    ``minBatchesToRetain`` and Spark purges the batch the mark names; running the rollback
    again, as the mark asks, is refused, and gc, savepoint and relocate refused while the
    mark was there: no way out but deleting the mark by hand. Closed when, once the query
    committed a batch after the mark, a savepoint is taken and a rollback to the newest
    batch removes the mark."""
    _location(tmp / "s", 4, ahead=0)
    with contextlib.suppress(StateholdError):
        SparkCheckpointLocation(_FirstDelete(tmp / "s")).rollback(
            1, keep=str(tmp / "s-keep"), force=True)
    mark = tmp / "s" / "_statehold_rollback"
    if not mark.exists():
        return False
    for b in range(2):  # Spark's retention, once the query ran on
        (tmp / "s" / f"offsets/{b}").unlink()
        (tmp / "s" / f"commits/{b}").unlink()
    later = mark.stat().st_mtime + 1  # the query's next batch, after the mark
    write(tmp / "s", "sources/0/4", file_log([("file:///in/00004.json", 4)]))
    write(tmp / "s", "offsets/4", offsets_file(4, [{"logOffset": 4}]))
    hdfs_store(tmp / "s", "state/0/0", range(5, 6), set())
    write(tmp / "s", "commits/4", commit_file(4))
    for key in ("sources/0/4", "offsets/4", "state/0/0/5.delta", "commits/4"):
        os.utime(tmp / "s" / key, (later, later))
    try:
        location = open_spark_checkpoint(str(tmp / "s"))
        location.savepoint(str(tmp / "s-sp"))
        location.rollback(4, keep=str(tmp / "s-keep2"), force=True)
    except StateholdError:
        return True
    return mark.exists()


#: (the hole, the violation kind that finds it, its probe: True while open in src).
HOLES = [
    ("(a) savepoint up to the batch number", "savepoint-source-log", savepoint_hole_open),
    ("(b) rollback logs before state", "stale-after-rollback", rollback_hole_open),
    ("(c) verify without the source chain", "verify-missed", verify_hole_open),
    ("verify with the source log gone whole", "verify-missed", verify_without_log_hole_open),
    ("a rollback mark no run can finish", "rollback-stuck", rollback_stuck_open),
]
KINDS = frozenset(kind for _name, kind, _probe in HOLES)


@pytest.fixture(scope="module")
def open_holes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The holes still open in src: violation kind -> the holes' names (their
    violations are noted, not failed, and the test says so)."""
    tmp = tmp_path_factory.mktemp("holes")
    out: dict[str, str] = {}
    for name, kind, probe in HOLES:
        if probe(tmp):
            out[kind] = f"{out[kind]}; {name}" if kind in out else name
    return out


# -- the sweep and the replay ------------------------------------------------------------
def test_sweep_finds_no_violation(open_holes: dict[str, str]) -> None:
    events: dict[str, int] = {}
    tolerated: dict[str, int] = {}
    for seed in SWEEP_SEEDS:
        result, world = run_spark_seed(seed, SWEEP_STEPS, tolerate=frozenset(open_holes),
                                       rollback_crash=SWEEP_ROLLBACK_CRASH)
        assert not result["violations"], (seed, result["violations"], world.minimal_trace())
        for k, v in result["events"].items():
            events[k] = events.get(k, 0) + v
        for k, v in result.get("tolerated", {}).items():
            tolerated[k] = tolerated.get(k, 0) + v
    # the Spark steps and the people's operations were reached, not just configured
    for what in ("batch", "store-moved", "start-gc", "gc-deleted", "start-savepoint",
                 "start-rollback", "rollback-interrupted", "start-relocate", "start-verify",
                 "damage", "crash", "idle"):
        assert events.get(what, 0) > 0, (what, events)
    if tolerated:
        holes = {open_holes[k]: n for k, n in tolerated.items()}
        pytest.xfail(f"holes still open in src, their violations noted: {holes}")


def test_a_seed_replays_the_same_run() -> None:
    first, w1 = run_spark_seed(3001, 500, tolerate=KINDS)
    second, w2 = run_spark_seed(3001, 500, tolerate=KINDS)
    assert first == second
    assert list(w1.trace) == list(w2.trace)


def test_the_documented_command_runs_from_the_repository_root() -> None:
    """``python tests/simulate.py --world spark --seeds 2 --steps 100 --json``, as
    docs/benchmarks.md gives it (the script once failed there: No module named 'tests')."""
    import json
    import os
    import subprocess
    import sys

    from tests.support.paths import ROOT

    env = {**os.environ, "PYTHONHASHSEED": "0"}  # (else the script starts itself again)
    out = subprocess.run(
        [sys.executable, "tests/simulate.py", "--world", "spark", "--seeds", "2", "--steps",
         "100", "--json", "--tolerate", ",".join(sorted(KINDS))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["seeds"] == [0, 1] and summary["violations"] == 0
    assert all(run["world"] == "spark" for run in summary["runs"])


def test_the_model_reads_what_spark_wrote() -> None:
    """A run without faults or people: every committed batch's restart reads back the
    state of exactly the input files it had processed (the check runs after each step)."""
    result, world = run_spark_seed(3002, 600, faults=False, operate_rate=0.0, pause_rate=0.0)
    assert not result["violations"], world.minimal_trace()
    assert result["events"].get("batch", 0) > 10


# -- planted bugs: each must be found within a bounded number of seeds --------------------
@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_bug_is_found(name: str, open_holes: dict[str, str]) -> None:
    """(d), gc without its re-check, is found through the race the re-check is for
    (`SparkWorld.gc_beside_rerun`): a gc lists and judges a delta superseded by a
    snapshot; a rollback beside it deletes both, the query's rerun writes the delta anew,
    and the gc deletes it; the model finds the rerun batch's restart broken."""
    _what, kinds, _patches, options = PLANTS[name]
    tolerate = frozenset(open_holes) - set(kinds)
    for seed in range(BOUND):
        result, _world = run_spark_seed(seed, STEPS, plant=name, tolerate=tolerate, **options)
        if result["violations"]:
            v = result["violations"][0]
            assert v["kind"] in kinds, v
            # Spark's own bug is reported as Spark's, never blamed on statehold
            assert (v["kind"] == "spark-bug") == (name == "spark-55892"), v
            return
    raise AssertionError(f"planted bug {name!r} not found within {BOUND} seeds")


def test_planted_gc_without_recheck_deletes_a_rewritten_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(d) by hand, the race the simulation's `gc_beside_rerun` makes: gc lists
    (``5.delta`` is superseded by ``5.snapshot``: deletable), then a rollback to batch 3
    and the query's rerun of batch 4 write ``5.delta`` anew, which batch 4 needs; the
    planted gc, without its re-check, deletes it. The real gc leaves it."""
    import statehold.spark_checkpoints.gc as spark_gc
    from tests.support.spark_locations.disk_trees import backdate
    from tests.support.spark_locations.handmade_files import logs, lz4_stream, records

    def location(root: Path) -> Path:
        logs(root, range(5))
        hdfs_store(root, "state/0/0", range(1, 6), {5})
        backdate(root, 7200)
        return root

    real = spark_gc._judge

    def rerun_after_listing(root: Path) -> None:
        def judge(*args: object, **kwargs: object) -> object:
            plan = real(*args, **kwargs)  # type: ignore[arg-type]
            for key in ("commits/4", "offsets/4", "state/0/0/5.snapshot"):
                (root / key).unlink()
            write(root, "state/0/0/5.delta", lz4_stream(records([(b"k", b"new")])))
            write(root, "offsets/4", offsets_file(4, [{"logOffset": 4}]))
            write(root, "commits/4", commit_file(4))
            return plan

        monkeypatch.setattr(spark_gc, "_judge", judge)

    real_root = location(tmp_path / "real")
    rerun_after_listing(real_root)
    open_spark_checkpoint(str(real_root)).gc(grace_seconds=0)
    assert open_spark_checkpoint(str(real_root)).verify().ok

    planted_root = location(tmp_path / "planted")
    rerun_after_listing(planted_root)
    for module, attr, wrap in PLANTS["gc-without-recheck"][2]:
        owner = importlib.import_module(module)
        monkeypatch.setattr(owner, attr, wrap(getattr(owner, attr)))
    open_spark_checkpoint(str(planted_root)).gc(grace_seconds=0)
    assert not (planted_root / "state/0/0/5.delta").exists()
    assert not open_spark_checkpoint(str(planted_root)).verify().ok


def test_a_savepoint_copied_before_a_rollback_holds_its_batch_as_it_was() -> None:
    """Seed 2200057 of the soak: a savepoint copies batch 30 whole, pauses; a rollback to
    29 runs beside it and the query runs batch 30 again over one more input file; the
    savepoint then ends. Its copy is the first timeline's batch 30, whole: judged against
    the location's record when it began, not against the rerun's (it was reported as a
    `source-log` violation: 79 files named, 80 processed)."""
    result, world = run_spark_seed(2200057, 1100, tolerate=frozenset({"spark-bug"}))
    assert not result["violations"], world.minimal_trace()
    rewritten = [sp for sp in world.savepoints if sp.batch is not None
                 and sp.committed.get(sp.batch) != world.live.committed.get(sp.batch)]
    assert rewritten, "the seed no longer reaches the race"
