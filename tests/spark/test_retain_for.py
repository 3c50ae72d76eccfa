"""Retention by age in a real job: ``StatefulJob(..., retain=1, retain_for=...)`` keeps
every young completed checkpoint, then only the minimum once they are old (the rule
itself, under a fake clock: tests/cleanup/test_retention_age.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from statehold import tools
from statehold.cleanup.reconcile import plan
from statehold.job.directory import open_job
from statehold.spark import KeyedState, StatefulJob

pytestmark = [pytest.mark.spark]


def count(key: str, rows: list[dict[str, Any]], state: KeyedState) -> list[tuple[str, int]]:
    n = state.value("n")
    n.update((n.get() or 0) + len(rows))
    return [(key, n.get())]


def retained(job_dir: Path) -> list[int]:
    return [c.checkpoint_id for c in tools.list_checkpoints(str(job_dir)).checkpoints
            if c.retained]


def test_retain_for_keeps_young_checkpoints(spark: SparkSession, tmp_path: Path) -> None:
    rows = spark.createDataFrame([("a",), ("b",), ("a",)], "key string")
    job = StatefulJob(spark, str(tmp_path), "aged", max_parallelism=8, parallelism=2,
                      retain=1, retain_for=timedelta(days=7))
    for _ in range(4):
        job.run_batch(rows, count, "key string, n long")
    assert retained(tmp_path / "aged") == [0, 1, 2, 3]  # all younger than a week
    job.close()
    # the same job with an age bound every checkpoint is past: the minimum stays
    job = StatefulJob(spark, str(tmp_path), "aged", max_parallelism=8, parallelism=2,
                      retain=2, retain_for=timedelta(0))
    job.run_batch(rows, count, "key string, n long")
    assert retained(tmp_path / "aged") == [3, 4]
    assert job.coordinator.wait_reconciled(60)
    job.close()
    leftovers = plan(open_job(str(tmp_path / "aged")), None)
    assert leftovers.orphans == [], [f.key for f in leftovers.orphans]
    assert sorted(p.name for p in (tmp_path / "aged").glob("chk-*")) == ["chk-3", "chk-4"]
