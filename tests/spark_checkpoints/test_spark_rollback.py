"""Rollbacks of real queries' checkpoint locations (tests.support.spark_locations.queries,
as each supported PySpark wrote them: the committed fixtures, tests/fixtures/spark/): a
rollback to an earlier batch k then a rerun writes the rows of the run before it (live, on
the running PySpark's fixture: `matrix`, one query per layout); a rollback to a batch whose
state is gone, or of a query that looks alive, is refused with nothing deleted (every
PySpark's fixture, without Spark). The window, dedup and join queries here; pandas_state,
transform and multi in test_spark_real_queries; every pair's rollback without a restart in
test_spark_fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.rollback import rollback
from tests.support.spark_locations.committed_fixtures import (
    copy_of,
    make_old,
    manifests,
    rows,
    running,
)
from tests.support.spark_locations.disk_trees import newest_log, restartable_batches

#: A representative subset of queries x providers, to keep the Spark time modest.
CASES = [
    ("window", "hdfs"),
    ("window", "rocksdb"),
    ("window", "rocksdb_v2"),
    ("dedup", "rocksdb_changelog"),
    ("join", "hdfs"),
    ("join", "rocksdb_changelog"),
]
#: One query per layout on the older PySparks too.
MATRIX = {("window", "hdfs"), ("window", "rocksdb"), ("window", "rocksdb_v2"),
          ("dedup", "rocksdb_changelog")}
VERSIONS = sorted(manifests())


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.spark
@pytest.mark.parametrize(("query", "provider"), [
    pytest.param(q, p, marks=[pytest.mark.matrix] if (q, p) in MATRIX else []) for q, p in CASES
])
def test_rollback_then_rerun_gives_the_same_output(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path, query: str, provider: str
) -> None:
    from tests.support.spark_locations.queries import all_rows, run_query

    fx, inputs = running(extracted, query, provider, tmp_path)
    ckpt, out = fx.checkpoint, tmp_path / "out"
    files = int(fx.entry["files"])
    out.mkdir()
    for path in fx.output.glob("batch-*.json"):
        (out / path.name).write_bytes(path.read_bytes())
    reference = rows(fx)
    newest = newest_log(ckpt, "commits")
    k = restartable_batches(ckpt)[0]
    assert k < files - 1, "no input left after the oldest restartable batch"
    before = _listing(ckpt)

    report = rollback(open_spark_checkpoint(str(ckpt)), k, grace_seconds=0)

    assert report.from_batch == newest and report.kept_batch == newest
    kept = Path(report.kept.removeprefix("file://"))
    assert kept.name.startswith("ckpt-before-rollback-")
    assert newest_log(ckpt, "commits") == newest_log(ckpt, "offsets") == k
    assert set(_listing(ckpt)) < set(before)
    assert any("foreachBatch" in s for s in report.sinks)
    for path in out.glob("batch-*.json"):
        if int(path.stem.split("-", 1)[1]) > k:
            path.write_text('{"stale": true}\n')  # rewritten or gone
    run_query(spark, query, provider, str(ckpt), inputs, out, files - 1)
    assert all_rows(out) == reference


@pytest.mark.parametrize("version", VERSIONS)
def test_rollback_to_a_batch_whose_state_is_gone_is_refused_with_nothing_deleted(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt = copy_of(extracted(version), version, "window", "rocksdb", tmp_path).checkpoint
    before = _listing(ckpt)
    assert "commits/0" not in before  # Spark purged the logs of batch 0

    with pytest.raises(SparkCheckpointError, match="cannot roll back to batch 0: .*missing"):
        rollback(open_spark_checkpoint(str(ckpt)), 0, grace_seconds=0)
    assert _listing(ckpt) == before
    assert not list(tmp_path.glob("ckpt-before-rollback-*"))


@pytest.mark.parametrize("version", VERSIONS)
def test_rollback_of_a_live_looking_query_is_refused_without_force(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt = copy_of(extracted(version), version, "dedup", "hdfs", tmp_path).checkpoint
    make_old(ckpt, 1.0)  # as a query running now leaves it: its newest file a second old
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
