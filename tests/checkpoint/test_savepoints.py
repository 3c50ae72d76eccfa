"""Savepoints from the Python API and at job end: never subsumed, kept by every cleanup
policy, readable and restorable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from statehold import tools
from statehold.spark import KeyedState, StatefulJob, iter_state

pytestmark = pytest.mark.spark


def count(key: str, rows: list[dict[str, Any]], state: KeyedState) -> list[tuple[str, int]]:
    total = state.value("n")
    total.update((total.get() or 0) + len(rows))
    return [(key, total.get())]


def test_savepoints_outlive_checkpoints_and_the_job(spark: SparkSession, tmp_path: Path) -> None:
    batches = [[("a",), ("b",), ("a",)], [("a",), ("c",)], [("b",), ("b",)]]
    job = StatefulJob(spark, str(tmp_path), "sp", max_parallelism=8, parallelism=2, retain=1)
    for i, rows in enumerate(batches):
        job.run_batch(spark.createDataFrame(rows, "key string"), count, "key string, n long")
        if i == 0:
            job.savepoint("after-first")
    assert job.end(policy="delete-all", savepoint="final")

    job_dir = tmp_path / "sp"
    assert not list(job_dir.glob("chk-*"))  # delete-all: no checkpoint left
    listing = tools.list_checkpoints(str(job_dir))
    assert sorted(s.path for s in listing.savepoints) == [
        "savepoints/after-first", "savepoints/final"
    ]
    for name in ("after-first", "final"):
        assert tools.verify(str(job_dir / "savepoints" / name)).ok
    first = {k: v["n"] for k, v in iter_state(str(job_dir / "savepoints" / "after-first"))}
    final = {k: v["n"] for k, v in iter_state(str(job_dir / "savepoints" / "final"))}
    assert first == {"a": 2, "b": 1}
    assert final == {"a": 3, "b": 3, "c": 1}
