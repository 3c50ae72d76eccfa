"""The staged plan a batch runs: its tasks computed by one Spark job (the acks'), the
session's adaptive-execution setting left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from statehold.spark import StatefulJob
from statehold.spark.staging import ADAPTIVE
from tests.support.keyed_totals import MAXP, OUT, Reference, make_batches, outputs, totals

pytestmark = pytest.mark.spark


def test_a_batch_computes_its_tasks_in_one_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    """With adaptive execution on (Spark's default), the cached plan would run the routing
    shuffle as a job of its own and the cached stage as another before the acks' job: three
    jobs where one does. The user's setting, on or off, is the session's afterwards."""
    sc = spark.sparkContext
    job = StatefulJob(spark, str(tmp_path), "plan", max_parallelism=MAXP, parallelism=2)
    ref = Reference()
    try:
        for setting in ("true", "false"):
            spark.conf.set(ADAPTIVE, setting)
            rows = next(make_batches(1, seed=len(setting)))
            df = spark.createDataFrame(rows, "key string, value long, seq long")
            group = f"statehold-plan-{setting}"
            sc.setJobGroup(group, "one statehold batch")
            try:
                result = job.run_batch(df, totals, OUT, order_by=["seq"])
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            assert len(sc.statusTracker().getJobIdsForGroup(group)) == 1
            assert spark.conf.get(ADAPTIVE) == setting
            assert outputs(result) == ref.apply(rows)
    finally:
        spark.conf.unset(ADAPTIVE)  # the shared session as the other tests expect it
        job.close()
