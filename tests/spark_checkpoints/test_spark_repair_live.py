"""`repair` then a restart by Spark (the shared session, one JVM): the running PySpark's
window query on two layouts (its committed fixture, relocated to a fresh copy of its
input), damaged as a crash or a lifecycle rule would, repaired, and restarted with more
input; its output equals that of an undamaged copy restarted with the same input, from the
batch the repair reports on. HDFS-backed: the newest snapshot corrupted and a delta under
it deleted (no other way to the version: a rollback, the batches after it processed
again); RocksDB with changelog checkpointing: the newest zip cut short (an older zip and
the changelogs rebuild the version: set aside, the same batch restarts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_checkpoint_trees import TWO_HOURS, newest_log
from tests.support.spark_fixtures import Fixture, make_old, running

QUERY = "window"
MORE = 2


def _damage_hdfs(ckpt: Path) -> str:
    """6.snapshot of partition 0 corrupted (a block's byte), 5.delta deleted."""
    snapshot = ckpt / "state/0/0/6.snapshot"
    data = bytearray(snapshot.read_bytes())
    data[21 + int.from_bytes(data[9:13], "little") // 2] ^= 0x5A
    snapshot.write_bytes(bytes(data))
    (ckpt / "state/0/0/5.delta").unlink()
    return "state/0/0/6.snapshot"


def _damage_rocksdb(ckpt: Path) -> str:
    """6.zip of partition 0 cut in half (a crash in a non-atomic copy)."""
    zipped = ckpt / "state/0/0/6.zip"
    data = zipped.read_bytes()
    zipped.write_bytes(data[: len(data) // 2])
    return "state/0/0/6.zip"


def _output(fx: Fixture, out: Path) -> Path:
    """The fixture run's output copied to `out` (the rows before the restart)."""
    out.mkdir()
    for path in fx.output.glob("batch-*.json"):
        (out / path.name).write_bytes(path.read_bytes())
    return out


@pytest.mark.spark
def test_repaired_locations_restart_with_an_undamaged_runs_output(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    from tests.support.spark_checkpoint_queries import (
        QueryRun,
        all_rows,
        run_queries,
        write_inputs,
    )

    started = time.monotonic()
    damages = {"hdfs": _damage_hdfs, "rocksdb_changelog": _damage_rocksdb}
    runs, repaired, reference = [], [], []
    for provider, damage in damages.items():
        ref, ref_inputs = running(extracted, QUERY, provider, tmp_path / f"ref-{provider}")
        fx, inputs = running(extracted, QUERY, provider, tmp_path / provider)
        files = int(fx.entry["files"])
        for folder in (ref_inputs, inputs):
            write_inputs(folder, files, MORE)
        newest = newest_log(fx.checkpoint, "commits")
        damaged = damage(fx.checkpoint)
        make_old(fx.checkpoint, TWO_HOURS)
        location = open_spark_checkpoint(str(fx.checkpoint))
        assert not location.verify(deep=True).ok

        report = location.repair(keep=str(tmp_path / f"keep-{provider}"))

        assert report.ok, report.remaining
        [store] = [s for s in report.stores if (s.operator, s.partition) == (0, 0)]
        if provider == "hdfs":  # no other way to version 6 without 5.delta: rolled back
            assert store.step == "rollback" and report.rollback_to is not None
            assert report.restart_batch == report.rollback_to < newest
        else:
            assert store.step == "set-aside" and report.rollback is None
            assert report.restart_batch == newest and damaged in report.moved
            assert (fx.checkpoint / report.repaired_dir / damaged).exists()
        saved = open_spark_checkpoint(report.keep)  # as it was: its damage too
        assert saved.restart_needs(saved.scan(), report.kept_batch or 0).ok
        out = _output(fx, tmp_path / f"out-{provider}")
        for path in out.glob("batch-*.json"):
            if int(path.stem.split("-", 1)[1]) > report.restart_batch:
                path.write_text('{"stale": true}\n')  # rewritten by the restart, or gone
        until = files + MORE
        reference.append(QueryRun(provider, str(ref.checkpoint), ref_inputs,
                                  _output(ref, tmp_path / f"ref-out-{provider}"), until))
        runs.append(QueryRun(provider, str(fx.checkpoint), inputs, out, until))
        repaired.append(report)

    run_queries(spark, QUERY, reference)  # the undamaged copies, side by side
    run_queries(spark, QUERY, runs)  # the repaired ones
    for ref_run, run in zip(reference, runs, strict=True):
        assert all_rows(run.output) == all_rows(ref_run.output), run.provider
        assert newest_log(Path(run.checkpoint), "commits") >= newest
        assert open_spark_checkpoint(run.checkpoint).verify(deep=True).ok
    print(f"repair live: {time.monotonic() - started:.1f} s")
