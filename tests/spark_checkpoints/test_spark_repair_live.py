"""`repair` then a restart by Spark, in one run of the shared session (one JVM): the
running PySpark's window query on two layouts (its committed fixture, relocated to a fresh
copy of its input), damaged as a crash or a lifecycle rule would, repaired, and restarted
on the input it already had; the restart processes the batches after the one the repair
reports and its output equals the fixture's own (the uninterrupted run's), so no
reference run is needed.

* HDFS-backed: the newest snapshot corrupted and a delta under it deleted: no other way
  to the version, so a rollback (the batches after it processed again).
* RocksDB with changelog checkpointing: rolled back first (statehold's rollback) to a
  batch whose version is held by a zip, that zip cut short: an older zip and the
  changelogs rebuild the version, so the zip is set aside and that batch restarts, Spark
  loading its state the other way. The copy `repair` kept of the location as it was (the
  cut zip in it) restarts too, side by side: Spark passes over a zip it cannot open and
  loads the version the same other way, so the copy undoes the repair without a loss."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_locations.committed_fixtures import Fixture, make_old, rows, running
from tests.support.spark_locations.disk_trees import TWO_HOURS, newest_log

QUERY = "window"


def _damage_hdfs(ckpt: Path) -> str:
    """The newest snapshot of partition 0 corrupted (a block's byte), the delta under it
    deleted."""
    folder = ckpt / "state/0/0"
    newest = max(int(p.name.split(".")[0]) for p in folder.glob("*.snapshot"))
    snapshot = folder / f"{newest}.snapshot"
    data = bytearray(snapshot.read_bytes())
    data[21 + int.from_bytes(data[9:13], "little") // 2] ^= 0x5A
    snapshot.write_bytes(bytes(data))
    (folder / f"{newest - 1}.delta").unlink()
    return f"state/0/0/{newest}.snapshot"


def _damage_rocksdb(ckpt: Path) -> str:
    """Rolled back to the newest batch before the last whose version partition 0 holds as
    a zip with an older zip below it, that zip then cut in half (a crash in a
    non-atomic copy)."""
    folder = ckpt / "state/0/0"
    zips = sorted(int(p.name.split(".")[0]) for p in folder.glob("*.zip"))
    last = newest_log(ckpt, "commits")
    version = max(v for v in zips[1:] if v - 1 < last)
    location = open_spark_checkpoint(str(ckpt))
    location.rollback(version - 1, keep=str(ckpt.parent / "before-rollback"), force=True)
    zipped = folder / f"{version}.zip"
    data = zipped.read_bytes()
    zipped.write_bytes(data[: len(data) // 2])
    return f"state/0/0/{version}.zip"


def _output_up_to(fx: Fixture, out: Path, batch: int) -> Path:
    """The fixture run's output of batches up to `batch`: what the sink held then."""
    out.mkdir()
    for path in fx.output.glob("batch-*.json"):
        if int(path.stem.split("-", 1)[1]) <= batch:
            (out / path.name).write_bytes(path.read_bytes())
    return out


@pytest.mark.spark
def test_repaired_locations_restart_with_the_uninterrupted_runs_output(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    from tests.support.spark_locations.queries import QueryRun, all_rows, run_queries

    started = time.monotonic()
    damages = {"hdfs": _damage_hdfs, "rocksdb_changelog": _damage_rocksdb}
    runs, cases = [], []
    for provider, damage in damages.items():
        fx, inputs = running(extracted, QUERY, provider, tmp_path / provider)
        newest = newest_log(fx.checkpoint, "commits")
        damaged = damage(fx.checkpoint)
        make_old(fx.checkpoint, TWO_HOURS)
        location = open_spark_checkpoint(str(fx.checkpoint))
        before = location.verify(deep=True)
        assert not before.ok and damaged in [p.path for p in before.problems], before

        report = location.repair(keep=str(tmp_path / f"keep-{provider}"))

        assert report.ok, report.remaining
        [store] = [s for s in report.stores if (s.operator, s.partition) == (0, 0)]
        if provider == "hdfs":  # no other way to the version without its delta
            assert store.step == "rollback" and report.rollback_to is not None
            assert report.restart_batch == report.rollback_to < newest
        else:  # the older zip and the changelogs: the same batch restarts
            assert store.step == "set-aside" and report.rollback is None
            assert report.restart_batch == report.batch < newest
            assert damaged in report.moved and report.repaired_dir
            assert (fx.checkpoint / report.repaired_dir / damaged).exists()
            assert not (fx.checkpoint / damaged).exists()
        assert report.restart_batch is not None
        out = _output_up_to(fx, tmp_path / f"out-{provider}", report.restart_batch)
        runs.append(QueryRun(provider, str(fx.checkpoint), inputs, out, fx.last_batch))
        cases.append((fx, report))
        if provider == "rocksdb_changelog":  # the location as it was, damage and all
            kept = tmp_path / f"keep-{provider}"
            assert (kept / damaged).read_bytes() == (
                fx.checkpoint / report.repaired_dir / damaged).read_bytes()
            out = _output_up_to(fx, tmp_path / "out-kept", report.batch)
            kept_run = (QueryRun(provider, str(kept), inputs, out, fx.last_batch), fx)

    lasts = run_queries(spark, QUERY, runs)  # both repaired locations, side by side

    for run, (fx, report), last in zip(runs, cases, lasts, strict=True):
        # Spark loaded the repaired state and ran every batch after the repair's again
        assert all_rows(run.output) == rows(fx), run.provider
        assert last >= fx.last_batch and report.restart_batch is not None
        assert (run.output / f"batch-{report.restart_batch + 1}.json").exists()
        assert open_spark_checkpoint(run.checkpoint).verify(deep=True).ok

    # the kept copy after them (one query id runs once at a time): Spark passes over the
    # cut zip and writes the uninterrupted run's rows from the batch the repair reported
    run, fx = kept_run
    [last] = run_queries(spark, QUERY, [run])
    assert all_rows(run.output) == rows(fx) and last >= fx.last_batch
    print(f"repair live: {time.monotonic() - started:.1f} s")
