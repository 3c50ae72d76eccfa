"""Rollbacks of real queries' checkpoint locations (tests.support.spark_checkpoint_queries):
a rollback to an earlier batch k then a rerun writes the rows of the run before it; a
rollback to a batch whose state is gone, or of a query that looks alive, is refused with
nothing deleted. The window, dedup and join queries here; pandas_state, transform and
multi in test_spark_real_queries."""

from __future__ import annotations

from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.rollback import rollback
from tests.support.spark_checkpoint_queries import (
    PROVIDERS,
    all_rows,
    read_output,
    run_query,
    write_inputs,
)
from tests.support.spark_checkpoint_trees import newest_log, restartable_batches

pytestmark = [pytest.mark.spark]

#: A representative subset of queries x providers, to keep the Spark time modest.
_CASES = [
    ("window", "hdfs"),
    ("window", "rocksdb"),
    ("window", "rocksdb_v2"),
    ("dedup", "rocksdb_changelog"),
    ("join", "hdfs"),
    ("join", "rocksdb_changelog"),
]
#: Those this PySpark has (format v2 is Spark 4's).
CASES = [case for case in _CASES if case[1] in PROVIDERS]
FILES = 6


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("query", "provider"), CASES)
def test_rollback_then_rerun_gives_the_same_output(
    spark, tmp_path: Path, query: str, provider: str
) -> None:
    inputs, ckpt, out = tmp_path / "in", tmp_path / "ckpt", tmp_path / "out"
    write_inputs(inputs, 0, FILES)
    run_query(spark, query, provider, str(ckpt), inputs, out, FILES - 1)
    reference = all_rows(out)
    newest = newest_log(ckpt, "commits")
    k = restartable_batches(ckpt)[0]
    assert k < FILES - 1, "no input left after the oldest restartable batch"
    before = _listing(ckpt)

    report = rollback(open_spark_checkpoint(str(ckpt)), k, grace_seconds=0)

    assert report.from_batch == newest and report.kept_batch == newest
    kept = Path(report.kept.removeprefix("file://"))
    assert kept.name.startswith("ckpt-before-rollback-")
    assert newest_log(ckpt, "commits") == newest_log(ckpt, "offsets") == k
    assert set(_listing(ckpt)) < set(before)
    assert any("foreachBatch" in s for s in report.sinks)
    for batch in read_output(out):
        if batch > k:
            (out / f"batch-{batch}.json").write_text('{"stale": true}\n')  # rewritten or gone
    run_query(spark, query, provider, str(ckpt), inputs, out, FILES - 1)
    assert all_rows(out) == reference


def test_rollback_to_a_batch_whose_state_is_gone_is_refused_with_nothing_deleted(
    spark, tmp_path: Path
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, 8)
    run_query(spark, "window", "rocksdb", str(ckpt), inputs, tmp_path / "out", 7)
    before = _listing(ckpt)
    assert "commits/0" not in before  # Spark purged the logs of batch 0

    with pytest.raises(SparkCheckpointError, match="cannot roll back to batch 0: .*missing"):
        rollback(open_spark_checkpoint(str(ckpt)), 0, grace_seconds=0)
    assert _listing(ckpt) == before
    assert not list(tmp_path.glob("ckpt-before-rollback-*"))


def test_rollback_of_a_live_looking_query_is_refused_without_force(
    spark, tmp_path: Path
) -> None:
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_inputs(inputs, 0, 4)
    run_query(spark, "dedup", "hdfs", str(ckpt), inputs, tmp_path / "out", 3)
    before = _listing(ckpt)
    source = open_spark_checkpoint(str(ckpt))
    k, newest = restartable_batches(ckpt)[0], newest_log(ckpt, "commits")
    assert k < newest

    with pytest.raises(SparkCheckpointError, match="looks alive"):
        rollback(source, k)
    assert _listing(ckpt) == before

    report = rollback(source, k, force=True, keep=str(tmp_path / "kept"))
    assert report.kept is not None and report.kept.endswith("/kept")
    assert f"commits/{k + 1}" in report.deleted and f"commits/{k + 1}" not in _listing(ckpt)
    assert f"commits/{newest}" in _listing(tmp_path / "kept")
