"""What a savepoint, a rollback and a gc of Spark's own checkpoint locations do to a query
that restarts from them, on the running PySpark: each pair's location is the committed
fixture this PySpark wrote (tests/fixtures/spark/,
tests.support.spark_locations.committed_fixtures), relocated to a fresh copy of its input
(statehold's relocate: so every restart here also restarts a relocated location); its
reference rows are those the fixture's query wrote. What statehold reads of every pair of
every PySpark, and what gc, savepoint, rollback and relocate do to its files, is tested
without Spark in test_spark_fixtures.

Restarts (one Spark run each) only for the pairs below, so that every query and every
layout restarts at least once on each PySpark (`matrix`: .ci/spark-matrix runs this module
on the older ones too, with the pairs they have):
- a savepoint and a rollback: pandas_state x hdfs, transform x rocksdb_v2,
  multi x rocksdb_changelog;
- a gc, then a rollback and a rerun: pandas_state x rocksdb_changelog, transform x
  rocksdb, multi x hdfs, window x rocksdb_v2, dedup x hdfs, join x rocksdb_v2.
The savepoints and rollbacks of the window, dedup and join queries are in
test_spark_savepoint and test_spark_rollback; the window's gc on every layout is in
test_spark_gc.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.rollback import rollback
from statehold.spark_checkpoints.savepoint import savepoint
from tests.support.spark_locations.committed_fixtures import copy_of, manifests, rebind, rows
from tests.support.spark_locations.disk_trees import (
    copy_tree,
    gc_removes_only_orphans,
    listing,
    newest_log,
    restartable_batches,
)
from tests.support.spark_locations.queries import (
    PROVIDERS,
    QUERIES,
    Row,
    all_rows,
    read_output,
    run_query,
    unsupported,
)

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

#: Input files: batch i reads file i; with 3 batches to keep (COMMON_CONF), Spark has
#: purged batch 0's logs by the end, so planted files of version 1 are beyond retention.
FILES = 5
PAIRS = [(q, p) for q in QUERIES for p in PROVIDERS if unsupported(q, p) is None]
SAVEPOINT_ROLLBACK = [("pandas_state", "hdfs"), ("transform", "rocksdb_v2"),
                      ("multi", "rocksdb_changelog")]
#: Pairs whose stores keep a version free below what their retained batches read (for a
#: stale file there), whatever the timing of Spark's maintenance.
GC = [("pandas_state", "rocksdb_changelog"), ("transform", "rocksdb"), ("multi", "hdfs"),
      ("window", "rocksdb_v2"), ("dedup", "hdfs"), ("join", "rocksdb_v2")]


def available(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [pair for pair in pairs if pair in PAIRS]


@dataclass(frozen=True)
class Run:
    """A query run to its end on a fresh checkpoint (a committed fixture): the untouched
    checkpoint, its input and output, and the rows it wrote."""

    query: str
    provider: str
    checkpoint: Path
    inputs: Path
    output: Path
    last_batch: int
    rows: list[Row]


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, extracted: Callable[[str], Path]
) -> Callable[[str, str], Run]:
    """Each pair's committed location of this PySpark, copied and relocated to its own
    input the first time a test asks for it."""
    root = tmp_path_factory.mktemp("real-queries")
    version = pyspark.__version__
    assert version in manifests(), (
        f"no committed fixture of PySpark {version}: python -m tests.fixtures.spark.make")

    @functools.cache
    def run(query: str, provider: str) -> Run:
        base = root / f"{query}-{provider}"
        fx = copy_of(extracted(version), version, query, provider, base)
        inputs = rebind(fx, base / "input")
        found = rows(fx)
        assert found, f"{query} on {provider} wrote nothing"
        return Run(query, provider, fx.checkpoint, inputs, fx.output, fx.last_batch, found)

    return run


def restart(spark: Any, run: Run, checkpoint: Path, k: int, output: Path) -> list[Row]:
    """Start `run`'s query on `checkpoint` (restartable after batch k) with `run`'s input,
    its output of batches 0..k kept: every row the two runs wrote."""
    output.mkdir()
    for batch in read_output(run.output):
        if batch <= k:
            shutil.copy(run.output / f"batch-{batch}.json", output)
    run_query(spark, run.query, run.provider, str(checkpoint), run.inputs, output, FILES - 1)
    return all_rows(output)


def earliest(run: Run, checkpoint: Path | None = None) -> int:
    """The oldest batch a restart can start after, with input left to read after it."""
    k = restartable_batches(checkpoint or run.checkpoint)[0]
    assert k < FILES - 1, f"batch {k}: no input left after the oldest restartable batch"
    return k


# -- savepoint, rollback, gc and a restart -------------------------------------------------
@pytest.mark.parametrize(("query", "provider"), available(SAVEPOINT_ROLLBACK))
def test_savepoint_of_an_earlier_batch_restarts_elsewhere_with_the_same_rows(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    k = earliest(run)
    before = listing(run.checkpoint)

    report = savepoint(open_spark_checkpoint(str(run.checkpoint)), str(tmp_path / "sp"), batch=k)

    assert report.batch == k and report.verified
    assert listing(run.checkpoint) == before
    assert newest_log(tmp_path / "sp", "commits") == k
    assert restart(spark, run, tmp_path / "sp", k, tmp_path / "out") == run.rows


@pytest.mark.parametrize(("query", "provider"), available(SAVEPOINT_ROLLBACK))
def test_rollback_to_an_earlier_batch_then_a_rerun_writes_the_same_rows(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    ckpt = copy_tree(run.checkpoint, tmp_path / "ckpt")
    k = earliest(run)

    report = rollback(open_spark_checkpoint(str(ckpt)), k, keep=str(tmp_path / "kept"),
                      grace_seconds=0)

    assert report.from_batch == run.last_batch and report.deleted
    assert newest_log(ckpt, "commits") == newest_log(ckpt, "offsets") == k
    assert newest_log(tmp_path / "kept", "commits") == run.last_batch
    assert restart(spark, run, ckpt, k, tmp_path / "out") == run.rows


@pytest.mark.parametrize(("query", "provider"), available(GC))
def test_gc_removes_planted_orphans_and_the_query_restarts_from_what_it_kept(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    ckpt = copy_tree(run.checkpoint, tmp_path / "ckpt")
    gc_removes_only_orphans(ckpt, provider)
    k = earliest(run, ckpt)
    rollback(open_spark_checkpoint(str(ckpt)), k, keep=str(tmp_path / "kept"), grace_seconds=0)
    assert restart(spark, run, ckpt, k, tmp_path / "out") == run.rows
