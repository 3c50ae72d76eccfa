"""Routing rows to the partition of their task on every supported PySpark: the
``repartition``-by-hash fallback for PySpark without ``repartitionById`` (3.5, 4.0) is
checked here against Spark itself, whichever PySpark runs the test."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from statehold.spark import routing

pytestmark = [pytest.mark.spark, pytest.mark.matrix]


def test_murmur3_matches_sparks_hash(spark: SparkSession) -> None:
    rng = random.Random(7)
    values = [0, 1, -1, 2**31 - 1, -(2**31), *(rng.randrange(-(2**31), 2**31) for _ in range(200))]
    df = spark.createDataFrame([(v,) for v in values], "v int")
    got = {r["v"]: r["h"] for r in df.select("v", F.hash("v").alias("h")).collect()}
    assert {v: routing.spark_hash_int(v) for v in values} == got


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16])
def test_hash_fallback_puts_task_i_in_partition_i(
    spark: SparkSession,
    partitions: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fallback path (forced here even where repartitionById exists): every row of
    task *i* lands in partition *i*, and every partition exists, also the empty ones."""
    monkeypatch.setattr(routing, "has_repartition_by_id", lambda: False)
    rows = [(i % max(1, partitions - 1), i) for i in range(60)]  # the last task gets none
    df = spark.createDataFrame(rows, "task int, n int")
    routed = routing.route_to_partitions(df, partitions, "task")
    assert routed.columns == ["task", "n"]
    placed = routed.select("task", "n", F.spark_partition_id().alias("p")).collect()
    assert sorted(r["n"] for r in placed) == list(range(60))
    assert all(r["p"] == r["task"] for r in placed)
    assert routed.rdd.getNumPartitions() == partitions


def test_routing_values_hash_to_their_partition() -> None:
    for partitions in (1, 2, 5, 128, 1000):
        values = routing.routing_values(partitions)
        assert [routing.hash_partition(v, partitions) for v in values] == list(
            range(partitions)
        )
