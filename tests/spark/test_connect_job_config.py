"""Under Spark Connect a job travels to the server's foreachBatch process as `JobConfig`:
every setting of `StatefulJob` must travel with it, or the server's job silently runs with
a default (as `task_batch_rows` once did)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from statehold.spark import StatefulJob
from statehold.spark.connect import JobConfig

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

#: Settings that cannot travel: the session is the server's own, and a metrics endpoint
#: with foreach_batch under Connect is refused (ConnectUnsupportedError).
STAYS_BEHIND = {"self", "spark", "metrics_port", "metrics_host"}


def test_job_config_carries_every_job_setting() -> None:
    settings = set(inspect.signature(StatefulJob.__init__).parameters) - STAYS_BEHIND
    carried = {f.name for f in fields(JobConfig)}
    assert settings <= carried, f"not carried to the server: {sorted(settings - carried)}"


def test_job_config_opens_the_same_job(spark: SparkSession, tmp_path: Path) -> None:
    config = JobConfig(
        checkpoints=str(tmp_path / "ckpt"), job_id="carried", max_parallelism=32,
        parallelism=3, retain=4, storage_options={}, operator="op",
        local_dir=str(tmp_path / "local"), ha=None, backend_options={},
        restore_from=None, restore_mode="no-claim", on_phase=None, history=50,
        retain_for=60.0, task_batch_rows=7,
    )
    job = config.open(StatefulJob, spark)
    try:
        for f in fields(JobConfig):
            if f.name in ("checkpoints", "ha", "restore_mode"):
                continue  # kept in another form (a resolved root, an HA store, an enum)
            assert getattr(job, f.name) == getattr(config, f.name), f.name
    finally:
        job.close()
