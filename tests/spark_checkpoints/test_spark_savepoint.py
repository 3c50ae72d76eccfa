"""Savepoints of real queries' checkpoint locations (tests.support.spark_checkpoint_queries):
a savepoint of an earlier batch k, started elsewhere, writes the rows of the query that
never stopped; on S3 too. The window, dedup and join queries here, on every layout between
them; pandas_state, transform and multi in test_spark_real_queries."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.savepoint import savepoint
from tests.support.spark_checkpoint_queries import (
    PROVIDERS,
    all_rows,
    read_output,
    run_query,
    write_inputs,
)
from tests.support.spark_checkpoint_trees import newest_log, restartable_batches

pytestmark = [pytest.mark.spark]

#: A representative subset of queries x providers (every provider with the window, the
#: others on two each), to keep the Spark time modest.
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
#: Those this PySpark has (format v2 is Spark 4's).
CASES = [case for case in _CASES if case[1] in PROVIDERS]
FILES = 6
PROVIDER = "rocksdb_changelog"


def copy_output(reference: Path, out: Path, upto: int) -> None:
    """`out` holds the reference's outputs of batches 0..upto, as before the savepoint."""
    out.mkdir()
    for batch in read_output(reference):
        if batch <= upto:
            shutil.copy(reference / f"batch-{batch}.json", out)


@pytest.mark.parametrize(("query", "provider"), CASES)
def test_savepoint_of_batch_k_restarts_elsewhere_with_the_same_output(
    spark, tmp_path: Path, query: str, provider: str
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, FILES)
    run_query(spark, query, provider, str(ckpt), inputs, tmp_path / "out", FILES - 1)
    reference = all_rows(tmp_path / "out")
    assert reference, "the query wrote nothing"
    k = restartable_batches(ckpt)[0]
    assert k < FILES - 1, "no input left after the oldest restartable batch"
    source = open_spark_checkpoint(str(ckpt))
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}

    report = savepoint(source, str(tmp_path / "sp"), batch=k)

    assert report.batch == k and report.verified
    assert report.linked == report.files and report.bytes_written == 0
    assert report.bytes < report.source_bytes
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before
    assert newest_log(tmp_path / "sp", "offsets") == k
    copy_output(tmp_path / "out", tmp_path / "out2", k)
    run_query(spark, query, provider, str(tmp_path / "sp"), inputs, tmp_path / "out2", FILES - 1)
    assert all_rows(tmp_path / "out2") == reference


def test_savepoint_refuses_a_batch_whose_state_is_gone_and_a_full_destination(
    spark, tmp_path: Path
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, 4)
    run_query(spark, "window", "hdfs", str(ckpt), inputs, tmp_path / "out", 3)
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


def test_savepoint_local_to_s3_and_back_restarts_locally(
    spark, tmp_path: Path, s3_server
) -> None:
    inputs = tmp_path / "in"
    write_inputs(inputs, 0, FILES)
    run_query(spark, "window", PROVIDER, str(tmp_path / "ref"), inputs, tmp_path / "ref-out",
              FILES - 1)
    write_inputs(tmp_path / "in2", 0, 3)
    run_query(spark, "window", PROVIDER, str(tmp_path / "ckpt"), tmp_path / "in2",
              tmp_path / "out", 2)
    local = open_spark_checkpoint(str(tmp_path / "ckpt"))
    uri = f"s3://{s3_server.bucket}/savepoints/sp1"

    up = savepoint(local, uri, dest_options=s3_server.options)
    on_s3 = open_spark_checkpoint(uri, **s3_server.options)
    down = savepoint(on_s3, str(tmp_path / "back"))

    assert up.batch == down.batch == max(read_output(tmp_path / "out"))
    assert up.bytes_written == up.bytes and down.files == up.files
    write_inputs(tmp_path / "in2", 3, FILES - 3)
    run_query(spark, "window", PROVIDER, str(tmp_path / "back"), tmp_path / "in2",
              tmp_path / "out", FILES - 1)
    # A stop may add a batch without data (the watermark's): the rows compare, not the
    # batch ids.
    assert all_rows(tmp_path / "out") == all_rows(tmp_path / "ref-out")
