"""The staged plan a batch runs: its tasks computed by one Spark job (the acks'), the
session's adaptive-execution setting left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from statehold.spark import StatefulJob
from statehold.spark.staging import ADAPTIVE
from tests.support.keyed_totals import MAXP, OUT, Reference, make_batches, outputs, totals
from tests.support.spark_versions import SPARK_4

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

#: With adaptive execution on, Spark 3.5 makes the acks' query read the cached result in a
#: job of its own (a cached table is a query stage there); 4.0 reads it in the job that
#: fills it. Without statehold turning adaptive execution off for the cached plan: 3 jobs
#: on both.
TASK_JOBS = 1 if SPARK_4 else 2


def test_a_batch_computes_its_tasks_in_one_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    """With adaptive execution on (Spark's default), the cached plan would run the routing
    shuffle as a job of its own and the cached stage as another before the acks' job: three
    jobs where one does (`TASK_JOBS`). The user's setting, on or off, is the session's
    afterwards."""
    sc = spark.sparkContext
    job = StatefulJob(spark, str(tmp_path), "plan", max_parallelism=MAXP, parallelism=2)
    ref = Reference()
    try:
        for setting, jobs in (("true", TASK_JOBS), ("false", 1)):
            spark.conf.set(ADAPTIVE, setting)
            rows = next(make_batches(1, seed=len(setting)))
            df = spark.createDataFrame(rows, "key string, value long, seq long")
            group = f"statehold-plan-{setting}"
            sc.setJobGroup(group, "one statehold batch")
            try:
                result = job.run_batch(df, totals, OUT, order_by=["seq"])
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            assert len(sc.statusTracker().getJobIdsForGroup(group)) == jobs
            assert spark.conf.get(ADAPTIVE) == setting
            assert outputs(result) == ref.apply(rows)
    finally:
        spark.conf.unset(ADAPTIVE)  # the shared session as the other tests expect it
        job.close()
