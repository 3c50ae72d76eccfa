"""Savepoints of real queries' checkpoint locations: a savepoint of batch k, started
elsewhere, gives the output of the query that never stopped; on S3 too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.savepoint import savepoint
from tests.support.spark_ckpt_runs import all_rows, read_output, run_query, write_inputs
from tests.support.spark_session import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

#: A representative subset of queries x providers (every provider with the window, the
#: others on two each), to keep the Spark time modest.
CASES = [
    ("window", "hdfs"),
    ("window", "rocksdb"),
    ("window", "rocksdb_changelog"),
    ("window", "rocksdb_v2"),
    ("dedup", "hdfs"),
    ("dedup", "rocksdb_changelog"),
    ("join", "rocksdb"),
    ("join", "rocksdb_v2"),
]
K = 2
PROVIDER = "rocksdb_changelog"


def _restart_output(reference: Path, out: Path, upto: int) -> None:
    """`out` holds the reference's outputs of batches 0..upto, as before the savepoint."""
    out.mkdir()
    for batch, _rows in read_output(reference).items():
        if batch <= upto:
            shutil.copy(reference / f"{batch}.json", out / f"{batch}.json")


@pytest.mark.parametrize(("query", "provider"), CASES)
def test_savepoint_of_batch_k_restarts_elsewhere_with_the_same_output(
    spark, tmp_path: Path, query: str, provider: str  # noqa: F811
) -> None:
    inputs = tmp_path / "in"
    write_inputs(inputs, 0, 6)
    run_query(spark, query, provider, tmp_path / "ckpt", inputs, tmp_path / "out")
    reference = read_output(tmp_path / "out")
    assert max(reference) >= 5
    source = open_spark_checkpoint(str(tmp_path / "ckpt"))
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*")}

    report = savepoint(source, str(tmp_path / "sp"), batch=K)

    assert report.batch == K and report.verified
    assert report.linked == report.files and report.bytes_written == 0
    assert report.bytes < report.source_bytes
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*")} == before
    offsets = (tmp_path / "sp" / "offsets").iterdir()
    assert max(int(p.name) for p in offsets if p.name.isdigit()) == K
    _restart_output(tmp_path / "out", tmp_path / "out2", K)
    run_query(spark, query, provider, tmp_path / "sp", inputs, tmp_path / "out2")
    assert read_output(tmp_path / "out2") == reference


def test_savepoint_refuses_a_batch_whose_state_is_gone_and_a_full_destination(
    spark, tmp_path: Path  # noqa: F811
) -> None:
    inputs = tmp_path / "in"
    write_inputs(inputs, 0, 4)
    run_query(spark, "window", "hdfs", tmp_path / "ckpt", inputs, tmp_path / "out")
    source = open_spark_checkpoint(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "state" / "0" / "1" / "2.delta").unlink()
    with pytest.raises(SparkCheckpointError, match="2.delta|delta"):
        savepoint(source, str(tmp_path / "sp"), batch=2)
    assert not (tmp_path / "sp").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(SparkCheckpointError, match="not empty"):
        savepoint(source, str(tmp_path / "full"))
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["x"]


def test_savepoint_local_to_s3_and_back_restarts_locally(
    spark, tmp_path: Path, s3_server  # noqa: F811
) -> None:
    inputs = tmp_path / "in"
    write_inputs(inputs, 0, 6)
    run_query(spark, "window", PROVIDER, tmp_path / "ref", inputs, tmp_path / "ref-out")
    reference = read_output(tmp_path / "ref-out")
    write_inputs(tmp_path / "in2", 0, 3)
    run_query(spark, "window", PROVIDER, tmp_path / "ckpt", tmp_path / "in2", tmp_path / "out")
    local = open_spark_checkpoint(str(tmp_path / "ckpt"))
    uri = f"s3://{s3_server.bucket}/savepoints/sp1"

    up = savepoint(local, uri, dest_options=s3_server.options)
    on_s3 = open_spark_checkpoint(uri, **s3_server.options)
    down = savepoint(on_s3, str(tmp_path / "back"))

    assert up.batch == down.batch == max(read_output(tmp_path / "out"))
    assert up.bytes_written == up.bytes and down.files == up.files
    write_inputs(tmp_path / "in2", 3, 3)
    run_query(spark, "window", PROVIDER, tmp_path / "back", tmp_path / "in2", tmp_path / "out")
    # The stop after batch 2 ran one more batch (availableNow ends with a batch without
    # data that moves the watermark), so the rows compare, not the batch ids.
    assert all_rows(tmp_path / "out") == sorted(r for rows in reference.values() for r in rows)
