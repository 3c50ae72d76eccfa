"""Rollbacks of real queries' checkpoint locations: a rollback to batch k then a rerun
gives the output of the run before it; a rollback to a batch whose state is gone, or of
a query that looks alive, is refused with nothing deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.rollback import rollback
from tests.support.spark_ckpt_runs import read_output, run_query, write_inputs
from tests.support.spark_session import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

#: A representative subset of queries x providers, to keep the Spark time modest.
CASES = [
    ("window", "hdfs"),
    ("window", "rocksdb"),
    ("window", "rocksdb_v2"),
    ("dedup", "rocksdb_changelog"),
    ("join", "hdfs"),
    ("join", "rocksdb_changelog"),
]
K = 2


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("query", "provider"), CASES)
def test_rollback_then_rerun_gives_the_same_output(
    spark, tmp_path: Path, query: str, provider: str  # noqa: F811
) -> None:
    inputs, ckpt, out = tmp_path / "in", tmp_path / "ckpt", tmp_path / "out"
    write_inputs(inputs, 0, 6)
    run_query(spark, query, provider, ckpt, inputs, out)
    reference = read_output(out)
    newest = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    before = _listing(ckpt)

    report = rollback(open_spark_checkpoint(str(ckpt)), K, grace_seconds=0)

    assert report.from_batch == newest and report.kept_batch == newest
    kept = Path(report.kept.removeprefix("file://"))
    assert kept.name.startswith("ckpt-before-rollback-")
    assert sorted(p.name for p in (ckpt / "commits").iterdir() if p.name.isdigit())[-1] == str(K)
    assert sorted(p.name for p in (ckpt / "offsets").iterdir() if p.name.isdigit())[-1] == str(K)
    assert set(_listing(ckpt)) < set(before)
    assert any("foreachBatch" in s for s in report.sinks)
    for batch in range(K + 1, max(reference) + 1):
        (out / f"{batch}.json").write_text("stale\n")  # the rerun must write them again
    run_query(spark, query, provider, ckpt, inputs, out)
    assert read_output(out) == reference


def test_rollback_to_a_batch_whose_state_is_gone_is_refused_with_nothing_deleted(
    spark, tmp_path: Path  # noqa: F811
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, 8)
    run_query(
        spark,
        "window",
        "rocksdb",
        ckpt,
        inputs,
        tmp_path / "out",
        **{"spark.sql.streaming.minBatchesToRetain": "2"},
    )
    before = _listing(ckpt)
    assert "commits/0" not in before  # Spark purged the logs of batch 0

    with pytest.raises(SparkCheckpointError, match="cannot roll back to batch 0: .*missing"):
        rollback(open_spark_checkpoint(str(ckpt)), 0, grace_seconds=0)
    assert _listing(ckpt) == before
    assert not list(tmp_path.glob("ckpt-before-rollback-*"))


def test_rollback_of_a_live_looking_query_is_refused_without_force(
    spark, tmp_path: Path  # noqa: F811
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, 4)
    run_query(spark, "dedup", "hdfs", ckpt, inputs, tmp_path / "out")
    before = _listing(ckpt)
    source = open_spark_checkpoint(str(ckpt))

    with pytest.raises(SparkCheckpointError, match="looks alive"):
        rollback(source, 1)
    assert _listing(ckpt) == before

    report = rollback(source, 1, force=True, keep=str(tmp_path / "kept"))
    assert report.kept is not None and report.kept.endswith("/kept")
    assert "commits/2" in report.deleted and "commits/2" not in _listing(ckpt)
    assert "commits/3" in _listing(tmp_path / "kept")
