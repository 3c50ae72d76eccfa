"""Parity with Spark: the same processors (written for Spark's `transformWithStateInPandas`)
and the same input run through Spark itself (RocksDB state store provider) and through
statehold, and their outputs are compared row for row, and with a plain-Python reference:
sessions closed by event-time timers, and deduplication whose memory expires by TTL."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from pyspark.sql import functions as F

from tests.support.spark_reference_queries import rocksdb_session, run_query, write_batch
from tests.support.spark_versions import SparkProcessor, needs_transform_with_state

if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import (
        ExpiredTimerInfo,
        StatefulProcessorHandle,
        TimerValues,
    )

pytestmark = [pytest.mark.spark, pytest.mark.matrix, needs_transform_with_state]

GAP = 60  # seconds of silence that close a session
DELAY = 30  # watermark delay, seconds
SESSION_OUT = "user STRING, start BIGINT, end BIGINT, events BIGINT"
SESSION_STATE = "start TIMESTAMP, last TIMESTAMP, events INT, pages ARRAY<STRING>"
DEDUP_OUT = "id STRING, ts BIGINT"
SHORT_TTL_MS = 2_000  # "S" ids are forgotten after this
LONG_TTL_MS = 3_600_000  # "L" ids are remembered through the test


# -- the processors, as a Spark user writes them ------------------------------------------------


class Sessions(SparkProcessor):  # type: ignore[misc]
    """A user's session: its first and last event time, its event count and pages (typed
    state: timestamps and an array). It closes when the watermark passes last + GAP."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        events = sorted(
            (int(ts), str(page))
            for pdf in rows
            for ts, page in zip(pdf["ts"], pdf["page"], strict=True)
        )
        current = self.session.get()
        closed = []
        if current is not None:
            self.handle.deleteTimer(_ms(current[1]) + GAP * 1000)
        for ts, page in events:
            when = pd.Timestamp(ts, unit="s").to_pydatetime()
            if current is not None and _seconds(current[1]) + GAP < ts:
                closed.append(current)
                current = None
            if current is None:
                current = (when, when, 1, [page])
            else:
                current = (current[0], when, current[2] + 1, [*current[3], page])
        assert current is not None
        self.session.update(current)
        self.handle.registerTimer(_ms(current[1]) + GAP * 1000)
        if closed:
            yield _sessions(key[0], closed)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        current = self.session.get()
        if current is not None:
            self.session.clear()
            yield _sessions(key[0], [current])

    def close(self) -> None:
        pass


def _seconds(when: Any) -> int:
    return int(pd.Timestamp(when).timestamp())


def _ms(when: Any) -> int:
    return _seconds(when) * 1000


def _sessions(user: str, sessions: list[Any]) -> pd.DataFrame:
    assert all(s[2] == len(s[3]) for s in sessions)  # the typed state kept its shape
    return pd.DataFrame({
        "user": [user] * len(sessions),
        "start": [_seconds(s[0]) for s in sessions],
        "end": [_seconds(s[1]) for s in sessions],
        "events": [int(s[2]) for s in sessions],
    })


class Dedup(SparkProcessor):  # type: ignore[misc]
    """The first row of each id; "S" ids are remembered SHORT_TTL_MS, "L" ids LONG_TTL_MS."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.short = handle.getValueState("seen_short", "first BIGINT", SHORT_TTL_MS)
        self.long = handle.getValueState("seen_long", "first BIGINT", LONG_TTL_MS)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        first = min(int(ts) for pdf in rows for ts in pdf["ts"])
        seen = self.short if key[0].startswith("S") else self.long
        if seen.get() is None:
            seen.update((first,))
            yield pd.DataFrame({"id": [key[0]], "ts": [first]})

    def close(self) -> None:
        pass


# -- inputs and references -----------------------------------------------------------------------


def session_batches(seed: int, users: int = 10, batches: int = 6) -> list[list[dict[str, Any]]]:
    """Events in batches: per user in time order, never older than the watermark (so
    neither system drops a row as late: batch b's rows lie in [t_b - DELAY/2, t_b] and the
    watermark is at most t_(b-1) - DELAY); then a sentinel far in the future moves the
    watermark past every real session, and one more batch lets the timers fire."""
    rng = random.Random(seed)
    last = {f"u{i}": 0 for i in range(users)}
    now, out = 1_700_000_000, []
    for _ in range(batches):
        now += rng.choice([10, 40, 70, 150])
        rows = []
        for user in rng.sample(sorted(last), k=users // 2 + 1):
            for _ in range(rng.randrange(1, 4)):
                ts = max(last[user], now - rng.randrange(DELAY // 2))
                last[user] = ts
                rows.append({"user": user, "ts": ts, "page": f"p{rng.randrange(9)}"})
        rng.shuffle(rows)
        out.append(rows)
    end = now + 10 * GAP + DELAY
    out.append([{"user": "zz-sentinel", "ts": end, "page": "-"}])
    out.append([{"user": "zz-sentinel", "ts": end + 1, "page": "-"}])
    return out


def reference_sessions(batches: list[list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """Closed sessions computed by plain Python (the sentinel's own session stays open)."""
    by_user: dict[str, list[int]] = {}
    for rows in batches:
        for r in rows:
            by_user.setdefault(r["user"], []).append(r["ts"])
    out = []
    for user, stamps in by_user.items():
        if user == "zz-sentinel":
            continue
        stamps.sort()
        start = end = stamps[0]
        count = 0
        for ts in stamps:
            if ts > end + GAP:
                out.append((user, start, end, count))
                start, count = ts, 0
            end, count = ts, count + 1
        out.append((user, start, end, count))
    return sorted(out)


DEDUP_PHASES = [  # phase 2 starts after the short TTL has passed
    [["S1", "S1", "L1", "L2", "S2"], ["L1", "L3", "L3"]],
    [["S1", "L2", "L4", "L4"]],
]


def reference_dedup() -> list[tuple[str, int]]:
    out = []
    ts = 0
    seen_long: set[str] = set()
    for phase in DEDUP_PHASES:
        seen_short: set[str] = set()
        for batch in phase:
            for i in dict.fromkeys(batch):
                first = ts + batch.index(i)
                seen = seen_short if i.startswith("S") else seen_long
                if i not in seen:
                    seen.add(i)
                    out.append((i, first))
            ts += 100
    return sorted(out)


def dedup_batches() -> list[list[list[dict[str, Any]]]]:
    ts, phases = 0, []
    for phase in DEDUP_PHASES:
        batches = []
        for batch in phase:
            batches.append([{"id": i, "ts": ts + n} for n, i in enumerate(batch)])
            ts += 100
        phases.append(batches)
    return phases


# -- Spark's run ----------------------------------------------------------------------------------


def run_spark_sessions(spark: Any, batches: list[list[dict[str, Any]]], work: Path) -> list[Any]:
    source = work / "in"
    for i, rows in enumerate(batches):
        write_batch(source, i, rows)
    session = rocksdb_session(spark)
    events = (
        session.readStream.schema("user STRING, ts BIGINT, page STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .withColumn("event_time", F.timestamp_seconds("ts"))
        .withWatermark("event_time", f"{DELAY} seconds")
    )
    out = events.groupBy("user").transformWithStateInPandas(
        statefulProcessor=Sessions(), outputStructType=SESSION_OUT,
        outputMode="Append", timeMode="EventTime",
    )
    run_query(out, work, "sessions")
    rows = session.read.schema(SESSION_OUT).parquet(str(work / "out")).collect()
    return sorted(tuple(r) for r in rows)


def run_spark_dedup(spark: Any, phases: list[list[list[dict[str, Any]]]], work: Path) -> list[Any]:
    source, index = work / "in", 0
    session = rocksdb_session(spark)
    for n, phase in enumerate(phases):
        if n:
            time.sleep(SHORT_TTL_MS / 1000 + 1.5)  # the short TTL passes between the phases
        for rows in phase:
            write_batch(source, index, rows)
            index += 1
        ids = (
            session.readStream.schema("id STRING, ts BIGINT")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        out = ids.groupBy("id").transformWithStateInPandas(
            statefulProcessor=Dedup(), outputStructType=DEDUP_OUT,
            outputMode="Append", timeMode="ProcessingTime",
        )
        run_query(out, work, "dedup", files=index)
    rows = session.read.schema(DEDUP_OUT).parquet(str(work / "out")).collect()
    return sorted(tuple(r) for r in rows)


# -- statehold's run: the same processor objects, a driver loop over the same files --------------


def run_statehold_sessions(
    spark: Any, batches: list[list[dict[str, Any]]], work: Path
) -> list[Any]:
    from statehold.spark import StatefulJob

    out: list[Any] = []
    with StatefulJob(spark, str(work / "jobs"), "sessions", max_parallelism=16, parallelism=2,
                     local_dir=str(work / "local")) as job:
        def batch(rows: list[dict[str, Any]]) -> None:
            df = spark.createDataFrame(rows, "user string, ts long, page string").withColumn(
                "event_time", F.timestamp_seconds("ts"))
            r = job.transform_with_state(
                df, Sessions(), SESSION_OUT, key="user", time_mode="EventTime",
                event_time_column="event_time", watermark_delay=DELAY * 1000)
            out.extend(tuple(row) for row in r.output.collect())

        for rows in batches:
            batch(rows)
            while job.timers_due():  # statehold runs the batches without input on request
                batch([])
    return sorted(out)


def run_statehold_dedup(
    spark: Any, phases: list[list[list[dict[str, Any]]]], work: Path
) -> list[Any]:
    from statehold.spark import StatefulJob

    out: list[Any] = []
    for n, phase in enumerate(phases):
        if n:
            time.sleep(SHORT_TTL_MS / 1000 + 1.5)
        # a new driver per phase, as Spark's query restarts: state comes from the checkpoint
        with StatefulJob(spark, str(work / "jobs"), "dedup", max_parallelism=16,
                         parallelism=2, local_dir=str(work / f"local-{n}")) as job:
            for rows in phase:
                df = spark.createDataFrame(rows, "id string, ts long")
                r = job.transform_with_state(df, Dedup(), DEDUP_OUT, key="id",
                                             time_mode="ProcessingTime")
                out.extend(tuple(row) for row in r.output.collect())
    return sorted(out)


# -- the tests ------------------------------------------------------------------------------------


def test_reference_inputs_are_meaningful() -> None:
    """The inputs exercise what the parity tests claim: several sessions per user and ids
    that come back after the short TTL."""
    sessions = reference_sessions(session_batches(7))
    per_user: dict[str, int] = {}
    for user, *_ in sessions:
        per_user[user] = per_user.get(user, 0) + 1
    assert max(per_user.values()) >= 2 and len(sessions) >= 10
    assert [i for i, _ in reference_dedup()].count("S1") == 2


def test_sessions_match_spark(spark: Any, tmp_path: Path) -> None:
    batches = session_batches(7)
    expected = reference_sessions(batches)
    spark_rows = run_spark_sessions(spark, batches, tmp_path / "spark")
    assert spark_rows == expected
    assert run_statehold_sessions(spark, batches, tmp_path / "statehold") == spark_rows


def test_dedup_with_ttl_matches_spark(spark: Any, tmp_path: Path) -> None:
    expected = reference_dedup()
    spark_rows = run_spark_dedup(spark, dedup_batches(), tmp_path / "spark")
    assert spark_rows == expected
    assert run_statehold_dedup(spark, dedup_batches(), tmp_path / "statehold") == spark_rows
