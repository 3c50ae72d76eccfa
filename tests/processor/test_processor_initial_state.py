"""A processor's initial state (Spark's ``initialState=`` / ``handleInitialState``): a class
written for Spark run by Spark's own ``transformWithStateInPandas(..., initialState=...)``
and by statehold's ``foreach_batch`` in a streaming query, across a restart of the query,
compared with each other and with a plain-Python reference; and statehold's snake_case
``handle_initial_state`` through ``transform_with_state``, setting state and timers,
applied once: a restarted driver given the same initial state does not apply it again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from statehold import processor as sh
from statehold.spark import StatefulJob, replace_output
from tests.support.spark_reference_queries import rocksdb_session, run_query, write_batch
from tests.support.spark_versions import SparkProcessor, needs_transform_with_state

if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessorHandle,
        TimerValues,
    )

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

OUT = "user STRING, count BIGINT"
INITIAL = [("a", 10), ("b", 5), ("b", 7), ("c", 100)]  # c: only in the initial state at first
BATCHES = [["a", "a", "d"], ["a", "b", "c", "d"]]


class SeededCount(SparkProcessor):  # type: ignore[misc]
    """Events per user, starting from the initial state's sum for the user."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n BIGINT")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        have = self.count.get()
        self.count.update(((have[0] if have else 0) + int(initialState["initial"].sum()),))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        have = self.count.get()
        total = (have[0] if have else 0) + sum(len(pdf) for pdf in rows)
        self.count.update((total,))
        yield pd.DataFrame({"user": [key[0]], "count": [total]})

    def close(self) -> None:
        pass


def reference() -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for user, n in INITIAL:
        counts[user] = counts.get(user, 0) + n
    out = []
    for batch in BATCHES:
        for user in sorted(set(batch)):
            counts[user] = counts.get(user, 0) + batch.count(user)
            out.append((user, counts[user]))
    return sorted(out)


def _initial(session: Any) -> Any:
    return session.createDataFrame(INITIAL, "user STRING, initial BIGINT")


def run_spark(spark: Any, work: Path) -> list[tuple[str, int]]:
    session = rocksdb_session(spark)
    for i, users in enumerate(BATCHES):  # one query run per file: a restart in between
        write_batch(work / "in", i, [{"user": u} for u in users])
        out = session.readStream.schema("user STRING").json(str(work / "in")).groupBy(
            "user").transformWithStateInPandas(
            statefulProcessor=SeededCount(), outputStructType=OUT, outputMode="Append",
            timeMode="None", initialState=_initial(session).groupBy("user"))
        run_query(out, work, "initial")
    rows = session.read.schema(OUT).parquet(str(work / "out")).collect()
    return sorted((r[0], r[1]) for r in rows)


def run_statehold(spark: Any, work: Path) -> list[tuple[str, int]]:
    for i, users in enumerate(BATCHES):  # a new driver and query per file
        write_batch(work / "in", i, [{"user": u} for u in users])
        with StatefulJob(spark, str(work / "jobs"), "seeded", max_parallelism=16,
                         parallelism=2, local_dir=str(work / f"local-{i}")) as job:
            run = job.foreach_batch(SeededCount(), OUT, key="user", initial_state=_initial(spark),
                                    sink=replace_output(str(work / "out")))
            query = (spark.readStream.schema("user STRING").json(str(work / "in"))
                     .writeStream.foreachBatch(run)
                     .option("checkpointLocation", job.spark_checkpoint_location)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            assert query.exception() is None
    rows = spark.read.schema(OUT).json(str(work / "out" / "batch-*")).collect()
    return sorted((r[0], r[1]) for r in rows)


@needs_transform_with_state
def test_initial_state_matches_spark(spark: Any, tmp_path: Path) -> None:
    expected = reference()
    assert ("c", 101) in expected and ("b", 13) in expected  # initial-only key; two rows
    spark_rows = run_spark(spark, tmp_path / "spark")
    assert spark_rows == expected
    assert run_statehold(spark, tmp_path / "statehold") == spark_rows


class Budget(sh.StatefulProcessor):
    """snake_case: a budget per user from the initial state (added up, so applying it
    twice would show), spent by events; a processing-time timer set by the initial state
    reports what is left."""

    def init(self, handle: sh.StatefulProcessorHandle) -> None:
        self.handle = handle
        self.budget = handle.get_value_state("budget")

    def handle_initial_state(self, key: Any, initial_state: Any,
                             timer_values: sh.TimerValues) -> None:
        assert isinstance(key, str) and all(r["who"] == key for r in initial_state)
        self.budget.update((self.budget.get() or 0) + sum(r["budget"] for r in initial_state))
        self.handle.register_timer(timer_values.get_current_processing_time_in_ms() + 1000)

    def handle_input_rows(self, key: Any, rows: Any, timer_values: sh.TimerValues) -> Any:
        self.budget.update((self.budget.get() or 0) - len(rows))
        return [(key, "spent", self.budget.get())]

    def handle_expired_timer(self, key: Any, timer_values: sh.TimerValues,
                             expired_timer_info: sh.ExpiredTimerInfo) -> Any:
        return [(key, "timer", self.budget.get())]


def test_initial_state_applied_once(spark: Any, tmp_path: Path) -> None:
    initial = spark.createDataFrame([("x", 3), ("y", 1), ("x", 1)], "who string, budget long")
    out: list[tuple[Any, ...]] = []
    for now, users in ((0, ["x"]), (2000, ["y"])):  # a new driver per batch: a restart
        with StatefulJob(spark, str(tmp_path / "jobs"), "budget", max_parallelism=16,
                         parallelism=2, local_dir=str(tmp_path / f"local-{now}")) as job:
            df = spark.createDataFrame([(u,) for u in users], "user string")
            r = job.transform_with_state(
                df, Budget(), "user string, what string, left long", key="user",
                time_mode="ProcessingTime", processing_time_ms=now, initial_state=initial,
                initial_state_key="who")
            assert r.output is not None
            out.extend(tuple(row) for row in r.output.collect())
    # batch 0: x 4-1; batch 1 (initial state not applied again): y 1-1, timers of x and y
    assert sorted(out) == [("x", "spent", 3), ("x", "timer", 3), ("y", "spent", 0),
                           ("y", "timer", 0)]
