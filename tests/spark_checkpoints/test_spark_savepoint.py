"""Savepoints of real queries' checkpoint locations (tests.support.spark_locations.queries,
as each supported PySpark wrote them: the committed fixtures, tests/fixtures/spark/): a
savepoint of an earlier batch k, started elsewhere, writes the rows of the query that
never stopped (live, on the running PySpark's fixture); on S3 too. The window, dedup and
join queries here, on every layout between them; pandas_state, transform and multi in
test_spark_real_queries; every pair's savepoint without a restart in test_spark_fixtures."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.savepoint import savepoint
from tests.support.spark_locations.committed_fixtures import (
    copy_of,
    manifests,
    rows,
    running,
)
from tests.support.spark_locations.disk_trees import newest_log, restartable_batches

#: A representative subset of queries x providers (every provider with the window, the
#: others on two each); the window's run on the older PySparks too (`matrix`: one query
#: per layout).
_CASES = [
    ("window", "hdfs"),
    ("window", "rocksdb"),
    ("window", "rocksdb_changelog"),
    ("window", "rocksdb_v2"),
    ("dedup", "hdfs"),
    ("dedup", "rocksdb_changelog"),
    ("join", "rocksdb"),
    ("join", "rocksdb_v2"),
]
VERSIONS = sorted(manifests())
PROVIDER = "rocksdb_changelog"


def copy_output(reference: Path, out: Path, upto: int) -> None:
    """`out` holds the reference's outputs of batches 0..upto, as before the savepoint."""
    from tests.support.spark_locations.queries import read_output

    out.mkdir()
    for batch in read_output(reference):
        if batch <= upto:
            shutil.copy(reference / f"batch-{batch}.json", out)


@pytest.mark.spark
@pytest.mark.parametrize(("query", "provider"), [
    pytest.param(q, p, marks=[pytest.mark.matrix] if q == "window" else []) for q, p in _CASES
])
def test_savepoint_of_batch_k_restarts_elsewhere_with_the_same_output(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path, query: str, provider: str
) -> None:
    from tests.support.spark_locations.queries import all_rows, run_query

    fx, inputs = running(extracted, query, provider, tmp_path)
    ckpt = fx.checkpoint
    reference = rows(fx)
    assert reference, "the query wrote nothing"
    k = restartable_batches(ckpt)[0]
    files = int(fx.entry["files"])
    assert k < files - 1, "no input left after the oldest restartable batch"
    source = open_spark_checkpoint(str(ckpt))
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}

    report = savepoint(source, str(tmp_path / "sp"), batch=k)

    assert report.batch == k and report.verified
    assert report.linked == report.files and report.bytes_written == 0
    assert report.bytes < report.source_bytes
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before
    assert newest_log(tmp_path / "sp", "offsets") == k
    copy_output(fx.output, tmp_path / "out2", k)
    run_query(spark, query, provider, str(tmp_path / "sp"), inputs, tmp_path / "out2", files - 1)
    assert all_rows(tmp_path / "out2") == reference


@pytest.mark.parametrize("version", VERSIONS)
def test_savepoint_refuses_a_batch_whose_state_is_gone_and_a_full_destination(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt = copy_of(extracted(version), version, "window", "hdfs", tmp_path / "fx").checkpoint
    source = open_spark_checkpoint(str(ckpt))
    found = source.scan()
    # a batch whose state version replays a delta, and that delta
    k, delta = next(
        (batch, key) for batch in restartable_batches(ckpt)
        for key in sorted(source.restart_needs(found, batch).files) if key.endswith(".delta")
    )
    kept = (ckpt / delta).read_bytes()
    (ckpt / delta).unlink()
    with pytest.raises(SparkCheckpointError, match="delta"):
        savepoint(source, str(tmp_path / "sp"), batch=k)
    assert not (tmp_path / "sp").exists()
    # The delta back, so some batch is restartable whether or not Spark's maintenance
    # thread wrote a snapshot after it (without one, every batch needs it): the refusal
    # below is the destination's.
    (ckpt / delta).write_bytes(kept)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(SparkCheckpointError, match="not empty"):
        savepoint(source, str(tmp_path / "full"))
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["x"]


def to_s3_and_back(local: Path, k: int, s3_server: Any, back: Path, name: str) -> None:
    """A savepoint of `local`'s batch k on S3, and one of that back to `back`."""
    uri = f"s3://{s3_server.bucket}/savepoints/{name}"
    up = savepoint(open_spark_checkpoint(str(local)), uri, batch=k,
                   dest_options=s3_server.options)
    on_s3 = open_spark_checkpoint(uri, **s3_server.options)
    down = savepoint(on_s3, str(back))
    assert up.batch == down.batch == k
    assert up.bytes_written == up.bytes and down.files == up.files


@pytest.mark.parametrize("version", VERSIONS)
def test_savepoint_local_to_s3_and_back(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: Any, version: str
) -> None:
    fx = copy_of(extracted(version), version, "window", PROVIDER, tmp_path / "fx")
    k = restartable_batches(fx.checkpoint)[0]
    to_s3_and_back(fx.checkpoint, k, s3_server, tmp_path / "back", f"{version}-{tmp_path.name}")
    back = open_spark_checkpoint(str(tmp_path / "back"))
    assert back.verify().ok
    assert back.listing().newest_committed == k
    assert back.restart_needs(back.scan(), k).ok


@pytest.mark.spark
@pytest.mark.matrix
def test_savepoint_local_to_s3_and_back_restarts_locally(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path, s3_server: Any
) -> None:
    from tests.support.spark_locations.queries import all_rows, run_query

    fx, inputs = running(extracted, "window", PROVIDER, tmp_path)
    k = restartable_batches(fx.checkpoint)[0]
    files = int(fx.entry["files"])
    assert k < files - 1, "no input left after the oldest restartable batch"
    to_s3_and_back(fx.checkpoint, k, s3_server, tmp_path / "back", f"live-{tmp_path.name}")

    copy_output(fx.output, tmp_path / "out", k)
    run_query(spark, "window", PROVIDER, str(tmp_path / "back"), inputs, tmp_path / "out",
              files - 1)
    # A stop may add a batch without data (the watermark's): the rows compare, not the
    # batch ids.
    assert all_rows(tmp_path / "out") == rows(fx)
