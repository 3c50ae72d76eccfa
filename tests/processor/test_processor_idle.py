"""Processing-time timers of a processor run by ``foreach_batch`` on an idle stream: Spark
runs no micro-batch without new input, so a timer that comes due afterwards waits until
the driver calls ``fire_due_timers()``, which runs a batch without input (also in a new
driver, given ``input_schema=``) and writes the timers' output through the sink."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from statehold.checkpoint.requests import submit
from statehold.errors import InvalidArgumentError
from statehold.format.requests import Action
from statehold.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from statehold.spark import StatefulJob, replace_output
from tests.support.spark_reference_queries import write_batch

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

OUT = "what string, user string"
DELAY_MS = 60_000


class Reminder(StatefulProcessor):
    """Says "in" for a user's rows, and "timer" a minute (processing time) later."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        self.handle.register_timer(timer_values.get_current_processing_time_in_ms() + DELAY_MS)
        return [("in", key)]

    def handle_expired_timer(self, key: Any, timer_values: TimerValues,
                             expired_timer_info: ExpiredTimerInfo) -> Any:
        return [("timer", key)]


def _written(spark: Any, out: Path) -> list[tuple[str, str]]:
    rows = spark.read.schema(OUT).json(str(out / "batch-*")).collect()
    return sorted((r[0], r[1]) for r in rows)


def test_idle_stream_fires_timers_on_request(spark: Any, tmp_path: Path) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    write_batch(inp, 0, [{"user": "a"}, {"user": "b"}])
    write_batch(inp, 1, [{"user": "c"}])
    opts: dict[str, Any] = dict(key="user", sink=replace_output(str(out)),
                                time_mode="ProcessingTime")
    with StatefulJob(spark, str(tmp_path / "jobs"), "idle", max_parallelism=16,
                     parallelism=2, local_dir=str(tmp_path / "local")) as job:
        run = job.foreach_batch(Reminder(), OUT, **opts)
        query = (spark.readStream.schema("user string").option("maxFilesPerTrigger", 1)
                 .json(str(inp)).writeStream.foreachBatch(run)
                 .option("checkpointLocation", job.spark_checkpoint_location)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None
        assert _written(spark, out) == [("in", "a"), ("in", "b"), ("in", "c")]
        record = job.recent.for_spark_batch(1)  # what the progress listener hands out
        assert record is not None and record.rows == 1
        assert run.fire_due_timers() == []  # nothing due for a minute
        assert _written(spark, out) == [("in", "a"), ("in", "b"), ("in", "c")]
        later = job.latest_checkpoint_id()
    assert later == 1
    # A new driver while the stream stays idle: the timers come due a minute on.
    with StatefulJob(spark, str(tmp_path / "jobs"), "idle", max_parallelism=16,
                     parallelism=2, local_dir=str(tmp_path / "local-2")) as job:
        due = int(time.time() * 1000) + 2 * DELAY_MS
        blind = job.foreach_batch(Reminder(), OUT, **opts)
        with pytest.raises(InvalidArgumentError, match="input_schema"):
            blind.fire_due_timers(due)
        run = job.foreach_batch(Reminder(), OUT, input_schema="user string", **opts)
        results = run.fire_due_timers(due)
        assert [r.timers_fired for r in results] == [3]
        assert not job.timers_due(due)
        # stopped from outside while idle: the driver's loop may ask once more, harmlessly
        submit(job.storage, job.coordinator.ha, "idle", Action.STOP)
        job.serve_requests()
        assert job.stop_requested and run.fire_due_timers(due + DELAY_MS) == []
    assert _written(spark, out) == [("in", "a"), ("in", "b"), ("in", "c"), ("timer", "a"),
                             ("timer", "b"), ("timer", "c")]
