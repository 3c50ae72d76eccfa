"""Stateful processors through `StatefulJob.transform_with_state` on the shared local
SparkSession: statehold's snake_case API and a class written for Spark 4.x (camelCase,
subclassing pyspark's own `StatefulProcessor`), event-time timers fired by a batch
without input, late rows dropped (counted) or processed, processing-time timers, TTL,
and the state reader counting timers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from statehold.backend.state import TIMERS_NAME
from statehold.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from statehold.spark import StatefulJob, iter_state
from tests.support.spark_versions import SparkProcessor, needs_transform_with_state

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

INPUT = "user string, ts long, page string"
GAP_MS = 100


class LastSeen(StatefulProcessor):
    """Per user: events counted; a timer GAP_MS after the newest event emits the count
    and clears the state (a small session window)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.get_value_state("count")
        self.newest = handle.get_value_state("newest")
        self.pages = handle.get_list_state("pages")

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        newest = max([r["ts"] for r in rows] + [self.newest.get() or 0])
        for t in self.handle.list_timers():
            self.handle.delete_timer(t)
        self.handle.register_timer(newest + GAP_MS)
        self.count.update((self.count.get() or 0) + len(rows))
        self.newest.update(newest)
        self.pages.append_list([r["page"] for r in rows])
        return None

    def handle_expired_timer(
        self, key: Any, timer_values: TimerValues, expired_timer_info: ExpiredTimerInfo
    ) -> Any:
        out = [(key, self.count.get(), ",".join(self.pages.get()),
                expired_timer_info.get_expiry_time_in_ms(),
                timer_values.get_current_watermark_in_ms())]
        self.count.clear()
        self.newest.clear()
        self.pages.clear()
        return out


OUT = "user string, events long, pages string, fired_at long, watermark long"


def _run(job: StatefulJob, session: Any, rows: list[tuple[str, int, str]], **kw: Any) -> Any:
    df = session.createDataFrame(rows, INPUT)
    return job.transform_with_state(
        df, kw.pop("processor", LastSeen()), kw.pop("schema", OUT), key="user",
        time_mode=kw.pop("time_mode", "EventTime"), event_time_column="ts",
        watermark_delay=kw.pop("delay", 10), order_by=["ts"], **kw,
    )


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in result.output.collect())


def test_event_time_timers_fire_in_a_batch_without_input(spark: Any, tmp_path: Path) -> None:
    with StatefulJob(spark, str(tmp_path), "tws", max_parallelism=8, parallelism=2) as job:
        r0 = _run(job, spark, [("ann", 1000, "a"), ("bob", 1010, "b"), ("ann", 1050, "c")])
        assert _rows(r0) == [] and r0.watermark_ms == 1050 - 10
        assert r0.next_timer_ms == 1110 and not job.timers_due()
        # bob's late row (<= watermark 1040) is dropped and counted; ann moves on
        r1 = _run(job, spark, [("bob", 1030, "late"), ("ann", 1300, "d")])
        assert r1.late_rows == 1 and _rows(r1) == []
        assert r1.watermark_ms == 1290 and job.timers_due()  # bob's 1110 is due now
        r2 = _run(job, spark, [])  # no input: only the due timers
        assert _rows(r2) == [("bob", 1, "b", 1110, 1290)]
        assert r2.timers_fired == 1 and not job.timers_due()
        assert r2.next_timer_ms == 1400
        state = dict(iter_state(job.job_dir))
        assert state == {"ann": {"count": 3, "newest": 1300, "pages": ["a", "c", "d"],
                                 TIMERS_NAME: [1400]}}
        # the watermark moves only with input: rows past ann's timer, then it fires
        r3 = _run(job, spark, [("cid", 2000, "x")])
        assert _rows(r3) == [] and job.timers_due()
        assert _rows(_run(job, spark, [])) == [("ann", 3, "a,c,d", 1400, 1990)]


def test_late_rows_processed_when_asked(spark: Any, tmp_path: Path) -> None:
    with StatefulJob(spark, str(tmp_path), "late", max_parallelism=8, parallelism=1) as job:
        _run(job, spark, [("ann", 5000, "a")], late_rows="process")
        r = _run(job, spark, [("ann", 10, "old")], late_rows="process")
        assert r.late_rows == 1
        assert dict(iter_state(job.job_dir))["ann"]["count"] == 2


class SparkCounter(SparkProcessor):  # type: ignore[misc]
    """Written for Spark's transformWithStateInPandas: camelCase, typed schemas, pandas
    in and out, a processing-time timer and a TTL'd map."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")
        self.seen = handle.getMapState("seen", "page string", "n long", 60_000)
        self.log = handle.getListState("log", "page string")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
        n = 0
        for pdf in rows:
            for page in pdf["page"]:
                old = self.seen.getValue((page,))
                self.seen.updateValue((page,), (1 + (old[0] if old else 0),))
                self.log.appendValue((page,))
                n += 1
        total = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((total,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1000)
        yield pd.DataFrame({"user": [key[0]], "total": [total],
                            "pages": [len(list(self.seen.keys()))],
                            "log": [len(list(self.log.get()))]})

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: Any, expiredTimerInfo: Any  # noqa: N803
    ) -> Iterator[Any]:
        yield pd.DataFrame({"user": [key[0]], "total": [-1], "pages": [0], "log": [0]})

    def close(self) -> None:
        pass


@needs_transform_with_state
def test_spark_style_processor_runs_unchanged(spark: Any, tmp_path: Path) -> None:
    schema = "user string, total long, pages long, log long"
    with StatefulJob(spark, str(tmp_path), "spark", max_parallelism=8, parallelism=2) as job:
        kw = {"processor": SparkCounter(), "schema": schema, "time_mode": "ProcessingTime"}
        r0 = _run(job, spark, [("ann", 1, "a"), ("ann", 2, "b"), ("bob", 3, "a")],
                  processing_time_ms=10_000, **kw)
        assert _rows(r0) == [("ann", 2, 2, 2), ("bob", 1, 1, 1)]
        r1 = _run(job, spark, [("ann", 4, "a")], processing_time_ms=10_500, **kw)
        assert _rows(r1) == [("ann", 3, 2, 3)]
        assert job.timers_due(processing_time_ms=11_000)
        # bob's timer (11000) fires; ann's first one too (11000), her second (11500) not
        r2 = _run(job, spark, [], processing_time_ms=11_000, **kw)
        assert _rows(r2) == [("ann", -1, 0, 0), ("bob", -1, 0, 0)]
        # the map's TTL (60 s after its last write) expires bob's pages, not his count
        r3 = _run(job, spark, [("bob", 5, "z")], processing_time_ms=80_000, **kw)
        # ann's second timer (11500) is due as well
        assert _rows(r3) == [("ann", -1, 0, 0), ("bob", 2, 1, 2)]
        assert r3.ttl_expired == 3  # ann's a and b, bob's a
