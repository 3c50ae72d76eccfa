"""Spark's own Structured Streaming queries (not statehold jobs), run to a known batch on a
checkpoint location, for the tests that inspect, savepoint, roll back and garbage-collect
Spark checkpoints: one query per kind of stateful operator (`QUERIES`), one session setting
per state store layout (`PROVIDERS`), deterministic inputs, and a sink whose output can be
compared with an uninterrupted run's.

Determinism. The file source reads one input file per batch (``maxFilesPerTrigger=1``,
files taken in modification-time order, which `write_inputs` makes the name order), so on a
fresh checkpoint batch ``i`` reads file ``i``. Event times only move forward and no row is
ever behind the watermark, so no row is dropped as late; and Spark restores the watermark
from the commit log on restart. A query stopped and restarted therefore writes the same rows
as one that ran through, only possibly in other batches: a stop may add a batch without
data (the watermark's) that an uninterrupted run folds into its next data batch. Compare
runs with `all_rows`; `read_output` keeps the batches apart. For the same reason an
uninterrupted run that reads all its files in one batch (``files_per_trigger``) writes the
same rows in two batches (its data, then the watermark's batch without data): a reference
run that costs Spark two batches rather than one per file.

``python -m tests.support.spark_locations.queries`` (`main`) runs one in a driver process of
its own, for the tests that kill it; or one query on several checkpoints side by side in
that one driver (`run_queries`), so that a test of several state store providers starts
one JVM rather than one per provider; or, with ``--serve`` (`ServingDriver`), one run after
another as the test asks, so a test that works on the stopped location between its runs
starts one JVM rather than one per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyspark

from tests.support.spark_reference_queries import write_batch

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

#: Whether this PySpark has transformWithStateInPandas and state checkpoint format v2 (4.x).
SPARK_4 = int(pyspark.__version__.split(".")[0]) >= 4

INPUT_SCHEMA = "key STRING, value BIGINT, ts BIGINT"
#: Event times start on a 5-minute boundary (windows line up with input files).
BASE_TS = 1_699_999_800
#: Seconds of event time per input file: the watermark (10 minutes behind) moves 5 minutes
#: a batch, so windows close, duplicates and join rows expire and timers fire within a few
#: batches, while every row of file ``i`` (times from ``i * STEP``) is ahead of the
#: watermark of batch ``i`` (at most ``i * STEP - 10 minutes``).
STEP = 300
ROWS_PER_FILE = 6
KEYS = 4
WATERMARK = "10 minutes"
TRIGGER = "100 milliseconds"
#: Spark's file-based state store and its RocksDB one.
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

#: Small numbers, so a few batches give several state versions, snapshots and cleanup:
#: maintenance (snapshots, deletion of old versions) every 500 ms (once per JVM: see
#: `restart_state_store_maintenance`), a snapshot after 2 deltas, and 3 batches to keep
#: (the offset and commit logs then hold the last 4). `run_query` stops the maintenance
#: when it returns, so that a stopped query's checkpoint stays as it is.
COMMON_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.minBatchesToRetain": "3",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.maintenanceInterval": "500ms",
}

#: Session settings per state store layout. ``hdfs`` writes a delta per version and
#: snapshots; ``rocksdb`` a zip per version (RocksDB's manifest and the list of its SST
#: files, kept apart in ``SSTs/`` and shared between versions); ``rocksdb_changelog`` a
#: changelog per version and zips as snapshots; ``rocksdb_v2`` (PySpark 4.1+) names each
#: version's files with a unique id that the commit log records (checkpoint format v2;
#: PySpark 4.0 accepts the setting and writes format v1).
PROVIDERS: dict[str, dict[str, str]] = {
    "hdfs": {"spark.sql.streaming.stateStore.providerClass": HDFS_PROVIDER},
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER, CHANGELOG: "false",
    },
    "rocksdb_changelog": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER, CHANGELOG: "true",
    },
}
if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 1):
    PROVIDERS["rocksdb_v2"] = {
        **PROVIDERS["rocksdb_changelog"],
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
    }


class QueryFailed(RuntimeError):
    """The streaming query stopped with an error (Spark's, in the message) or ran past its
    time limit."""


# -- inputs -----------------------------------------------------------------------------------
def input_rows(index: int) -> list[dict[str, Any]]:
    """The rows of input file `index`: ROWS_PER_FILE rows of KEYS keys with event times in
    ``[index * STEP, (index + 1) * STEP)`` after BASE_TS, one exact duplicate of its first
    row, and (after file 0) a repeat of a row of the file before, for dropDuplicates."""
    start = BASE_TS + index * STEP
    rows = [
        {"key": f"k{(index + j) % KEYS}", "value": (index * 13 + j * 7) % 50,
         "ts": start + j * 47}
        for j in range(ROWS_PER_FILE)
    ]
    rows.append(dict(rows[0]))
    if index:
        rows.append(input_rows(index - 1)[2])
    return rows


def write_inputs(directory: Path, first: int, count: int) -> list[Path]:
    """Input files `first` .. `first + count - 1` (``NNNNN.jsonl``), each written atomically
    with an mtime in name order, so Spark's file source reads them in that order."""
    for index in range(first, first + count):
        write_batch(directory, index, input_rows(index))
    return [directory / f"{i:05d}.jsonl" for i in range(first, first + count)]


# -- the queries --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    """A streaming DataFrame built on the input (`build`), the output mode it needs and
    the session settings it runs with besides COMMON_CONF and the provider's (`conf`)."""

    build: Callable[[DataFrame], DataFrame]
    output_mode: str
    conf: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, source: DataFrame) -> DataFrame:
        return self.build(source)


def _events(source: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return source.withColumn("event_time", F.timestamp_seconds("ts")).withWatermark(
        "event_time", WATERMARK)


def _windows(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return events.groupBy(F.window("event_time", "5 minutes"), "key").agg(
        F.count("*").alias("count"), F.sum("value").alias("sum")
    ).select("key", F.col("window.start").cast("long").alias("start"), "count", "sum")


def window_query(source: DataFrame) -> DataFrame:
    """A 5-minute windowed count and sum per key, each window written once it closes."""
    return _windows(_events(source))


def dedup_query(source: DataFrame) -> DataFrame:
    """The first row of each (key, event time); the memory of it expires with the watermark."""
    return _events(source).dropDuplicates(["key", "event_time"]).select("key", "value", "ts")


def join_query(source: DataFrame) -> DataFrame:
    """The input joined with itself: each row with the same key's rows up to 2 minutes later
    (both sides kept in state until the watermark passes them)."""
    from pyspark.sql import functions as F

    events = source.withColumn("event_time", F.timestamp_seconds("ts"))
    left = events.select(
        F.col("key").alias("lkey"), F.col("value").alias("lvalue"), F.col("ts").alias("lts"),
        F.col("event_time").alias("ltime"),
    ).withWatermark("ltime", WATERMARK)
    right = events.select(
        F.col("key").alias("rkey"), F.col("value").alias("rvalue"), F.col("ts").alias("rts"),
        F.col("event_time").alias("rtime"),
    ).withWatermark("rtime", WATERMARK)
    joined = left.join(right, F.expr(
        "lkey = rkey AND rtime >= ltime AND rtime <= ltime + interval 2 minutes"))
    return joined.select(F.col("lkey").alias("key"), "lvalue", "rvalue", "lts", "rts")


def running_totals(
    key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState's function: the key's running count and sum."""
    import pandas as pd

    count, total = state.get if state.exists else (0, 0)
    for pdf in batches:
        count += len(pdf)
        total += int(pdf["value"].sum())
    state.update((count, total))
    yield pd.DataFrame({"key": [key[0]], "count": [count], "sum": [total]})


def pandas_state_query(source: DataFrame) -> DataFrame:
    """A running count and sum per key with applyInPandasWithState (no timeout)."""
    return source.groupBy("key").applyInPandasWithState(
        running_totals, "key STRING, count BIGINT, sum BIGINT", "count BIGINT, total BIGINT",
        "update", "NoTimeout",
    )


def multi_query(source: DataFrame) -> DataFrame:
    """Two stateful operators in one query: dropDuplicates, then the windowed aggregation
    (Spark carries the watermark between them in append mode)."""
    return _windows(_events(source).dropDuplicates(["key", "event_time"]))


QUERIES: dict[str, Query] = {
    "window": Query(window_query, "append"),
    "dedup": Query(dedup_query, "append"),
    "join": Query(join_query, "append"),
    "pandas_state": Query(pandas_state_query, "update"),
    "multi": Query(multi_query, "append"),
}

if SPARK_4:
    from pyspark.sql.streaming.stateful_processor import (
        ExpiredTimerInfo,
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
    )

    TIMER_DELAY_MS = 60_000
    TRANSFORM_OUT = "key STRING, kind STRING, value BIGINT"

    class CountWithTimers(StatefulProcessor):
        """A running count per key (a ValueState), written per batch as ("count", n); each
        batch also sets an event-time timer a minute after its newest row, written as
        ("timer", expiry seconds) when the watermark passes it. The timer output depends on
        nothing but the timer, so it is the same whether a restart's batch without data
        fires it before the next rows or the next batch fires it after them."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "count BIGINT")

        def handleInputRows(  # noqa: N802
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues  # noqa: N803
        ) -> Iterator[pd.DataFrame]:
            import pandas as pd

            seen, newest = 0, 0
            for pdf in rows:
                seen += len(pdf)
                newest = max(newest, int(pdf["ts"].max()))
            current = self.count.get()
            count = (int(current[0]) if current is not None else 0) + seen
            self.count.update((count,))
            self.handle.registerTimer(newest * 1000 + TIMER_DELAY_MS)
            yield pd.DataFrame({"key": [key[0]], "kind": ["count"], "value": [count]})

        def handleExpiredTimer(  # noqa: N802
            self, key: Any, timerValues: TimerValues,  # noqa: N803
            expiredTimerInfo: ExpiredTimerInfo,  # noqa: N803
        ) -> Iterator[pd.DataFrame]:
            import pandas as pd

            expiry = expiredTimerInfo.getExpiryTimeInMs() // 1000
            yield pd.DataFrame({"key": [key[0]], "kind": ["timer"], "value": [expiry]})

        def close(self) -> None:
            pass

    def transform_query(source: DataFrame) -> DataFrame:
        """transformWithStateInPandas: a running count per key with event-time timers."""
        return _events(source).groupBy("key").transformWithStateInPandas(
            statefulProcessor=CountWithTimers(), outputStructType=TRANSFORM_OUT,
            outputMode="Append", timeMode="EventTime",
        )

    QUERIES["transform"] = Query(transform_query, "append")

    RICH_OUT = ("key STRING, total BIGINT, items BIGINT, buckets BIGINT, seen BIGINT, "
                "recent BIGINT, firsts BIGINT")
    #: RichState's TTL: hours, so that nothing expires in a test and the output stays a
    #: function of the input alone.
    RICH_TTL_MS = 6 * 3600 * 1000
    #: RichState needs processing time (a TTL is refused in any other time mode), in which
    #: Spark would run a batch without data every trigger for ever: without them the query
    #: runs only batches with data and `run_queries` sees it idle.
    RICH_CONF = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}

    class RichState(StatefulProcessor):
        """Each kind of state variable, with and without a TTL, each read back into the
        output so the output depends on all of it. Without a TTL: a list of the key's
        values (`items`), a map of their value mod 3 to a count (`buckets`), a running
        total (`total`). With a TTL of RICH_TTL_MS (Spark adds a TTL index family per
        variable, and for the list its elements' minimum expiry and count): the rows
        seen (`seen`, a value), the key's values again (`recent`, a list, written out as
        their sum), the first value of each value mod 5 (`firsts`, a map, written out as
        their sum). Per batch and key: (key, total, len(items), len(buckets), seen,
        sum(recent), sum(firsts)). Processing time for the TTL, without batches
        without data (RICH_CONF). Not in QUERIES: a test registers it where it runs it
        (tests/spark_checkpoints/test_spark_repartition_live.py)."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.items = handle.getListState("items", "v BIGINT")
            self.buckets = handle.getMapState("buckets", "b BIGINT", "n BIGINT")
            self.total = handle.getValueState("total", "total BIGINT")
            self.seen = handle.getValueState("seen", "n BIGINT", RICH_TTL_MS)
            self.recent = handle.getListState("recent", "v BIGINT", RICH_TTL_MS)
            self.firsts = handle.getMapState("firsts", "r BIGINT", "v BIGINT", RICH_TTL_MS)

        def handleInputRows(  # noqa: N802
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues  # noqa: N803
        ) -> Iterator[pd.DataFrame]:
            import pandas as pd

            # one call to Spark's state server per variable and batch where one does: each
            # call is a round trip between the Python worker and the JVM
            values = [int(v) for pdf in rows for v in pdf["value"]]
            self.items.appendList([(v,) for v in values])
            self.recent.appendList([(v,) for v in values])
            for b, n in Counter(v % 3 for v in values).items():
                old = self.buckets.getValue((b,))[0] if self.buckets.containsKey((b,)) else 0
                self.buckets.updateValue((b,), (old + n,))
            for r, v in {v % 5: v for v in reversed(values)}.items():  # each one's first
                if not self.firsts.containsKey((r,)):
                    self.firsts.updateValue((r,), (v,))
            current = self.total.get()
            total = (int(current[0]) if current is not None else 0) + sum(values)
            self.total.update((total,))
            before = self.seen.get()
            seen = (int(before[0]) if before is not None else 0) + len(values)
            self.seen.update((seen,))
            yield pd.DataFrame({
                "key": [key[0]], "total": [total],
                "items": [sum(1 for _ in self.items.get())],
                "buckets": [sum(1 for _ in self.buckets.keys())],  # noqa: SIM118 (a MapState)
                "seen": [seen], "recent": [sum(int(r[0]) for r in self.recent.get())],
                "firsts": [sum(int(r[0]) for r in self.firsts.values())]})

        def close(self) -> None:
            pass

    def rich_state_query(source: DataFrame) -> DataFrame:
        """transformWithStateInPandas with RichState (processing time, for the TTL; no
        timers, no watermark)."""
        return source.groupBy("key").transformWithStateInPandas(
            statefulProcessor=RichState(), outputStructType=RICH_OUT, outputMode="Append",
            timeMode="ProcessingTime")


def unsupported(query: str, provider: str) -> str | None:
    """Why `query` cannot run on `provider` with this PySpark, or None when it can."""
    if query == "transform" and provider == "hdfs":
        return "Spark runs transformWithState on RocksDB only (STORE_BACKEND_NOT_SUPPORTED_FOR_TWS)"
    if query == "pandas_state" and not SPARK_4:
        import pyarrow

        return (
            "PySpark 3.5's applyInPandasWithState worker slices Arrow batches at float offsets, "
            f"which pyarrow {pyarrow.__version__} refuses (TypeError) once a key has two rows "
            "in a batch"
        )
    return None


# -- the sink -------------------------------------------------------------------------------------
Row = dict[str, Any]


def _row_order(row: Row) -> str:
    return json.dumps(row, sort_keys=True)


def batch_writer(output: Path) -> Callable[[DataFrame, int], None]:
    """A foreachBatch function writing batch N's rows to ``<output>/batch-N.json`` (JSON
    lines, sorted), replacing the file a replay of the batch wrote before."""
    output.mkdir(parents=True, exist_ok=True)

    def write(df: DataFrame, batch_id: int) -> None:
        rows = sorted((r.asDict(recursive=True) for r in df.collect()), key=_row_order)
        tmp = output / f".batch-{batch_id}.json.tmp"
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        os.replace(tmp, output / f"batch-{batch_id}.json")

    return write


def read_output(output: Path) -> dict[int, list[Row]]:
    """Each batch's rows (sorted), by batch id; a batch without output rows maps to ``[]``."""
    batches = {}
    for path in output.glob("batch-*.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        batches[int(path.stem.split("-", 1)[1])] = sorted(rows, key=_row_order)
    return dict(sorted(batches.items()))


def all_rows(output: Path) -> list[Row]:
    """Every batch's rows in one sorted list: what a stopped and restarted query has in
    common with one that ran through."""
    return sorted((r for rows in read_output(output).values() for r in rows), key=_row_order)


# -- running ---------------------------------------------------------------------------------
def query_session(spark: SparkSession, provider: str) -> SparkSession:
    """A session of `spark`'s context with the COMMON_CONF and `provider`'s settings."""
    session = spark.newSession()
    for name, value in {**COMMON_CONF, **PROVIDERS[provider]}.items():
        session.conf.set(name, value)
    return session


def committed_batches(spark: SparkSession, checkpoint: str) -> list[int]:
    """The batch ids in the checkpoint's commit log, listed with Hadoop's file system (so
    ``s3a://`` works wherever the session can write the checkpoint)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/commits")
    fs = path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    if not fs.exists(path):
        return []
    names = [status.getPath().getName() for status in fs.listStatus(path)]
    return sorted(int(n) for n in names if n.isdigit())


def restart_state_store_maintenance(spark: SparkSession) -> None:
    """Stop the JVM's state store maintenance, so that the next query starts it again with
    its own interval: Spark starts it once per JVM, with the settings of the first stateful
    query, and the shared test session may have run one with the default of a minute.
    Only while no streaming query runs (it also unloads every loaded state store)."""
    if spark.streams.active:
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    package = jvm.org.apache.spark.sql.execution.streaming.state
    store = package.StateStore
    # Spark 4.0's stop() holds the providers' lock while it waits (300 s) for the maintenance
    # pool, whose threads need that lock to start a provider's maintenance: a deadlock when
    # one is starting. Unloaded first (no wait inside), nothing is left for the pool to
    # start; then the stop only ends idle threads.
    getattr(getattr(package, "StateStore$"), "MODULE$").unloadAll()
    deadline = time.monotonic() + 60
    while _maintenance_busy(jvm) and time.monotonic() < deadline:
        time.sleep(_POLL)
    store.stop()
    # The stop does not wait for a maintenance run in progress, which may still write a
    # snapshot or delete old versions (seen with PySpark 3.5): wait for its threads to end.
    deadline = time.monotonic() + 60
    while _maintenance_threads(jvm) and time.monotonic() < deadline:
        time.sleep(_POLL)


#: Seconds between two looks at the JVM's threads while waiting for maintenance to end.
#: A look costs tens of milliseconds of CPU (a py4j call per thread), so a wait polled
#: every 50 ms kept a core more than half busy: waits add up over the suite's queries.
_POLL = 0.2


def _maintenance_busy(jvm: Any) -> bool:
    """Whether a maintenance pool thread is inside a provider's maintenance."""
    traces = jvm.java.lang.Thread.getAllStackTraces()
    for thread in traces.keySet().toArray():
        if str(thread.getName()).startswith("state-store-maintenance-thread"):
            frames = traces.get(thread)
            if any("doMaintenance" in str(frame.getMethodName()) for frame in frames):
                return True
    return False


def _maintenance_threads(jvm: Any) -> list[str]:
    """The JVM's live state store maintenance threads (Spark names them
    ``state-store-maintenance-...``)."""
    threads = jvm.java.lang.Thread.getAllStackTraces().keySet().toArray()
    named = ((t, str(t.getName())) for t in threads)  # one py4j call a thread
    return [name for t, name in named
            if name.startswith("state-store-maintenance") and t.isAlive()]


def start_query(
    session: SparkSession,
    query: str,
    checkpoint: str,
    inputs: Path,
    output: Path,
    pause: Path | None = None,
    files_per_trigger: int = 1,
) -> StreamingQuery:
    """`pause`: read the input in union with `pause_source`'s source, armed by that
    file (its mark: the same name with ``.paused``), for a driver to be killed between
    the file source's log write and the offsets write (PySpark 4). `files_per_trigger`:
    input files a batch reads (more than one only for a reference run's rows)."""
    spec = QUERIES[query]
    for name, value in spec.conf.items():
        session.conf.set(name, value)
    source = (
        session.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(str(inputs))
    )
    if pause is not None:
        from tests.support.spark_locations.pause_source import pause_stream

        source = source.union(pause_stream(session, checkpoint, str(pause), f"{pause}.paused"))
    return (
        spec(source).writeStream.foreachBatch(batch_writer(output))
        .outputMode(spec.output_mode)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=TRIGGER)
        .queryName(f"{query}_{os.getpid()}_{time.monotonic_ns()}")
        .start()
    )


def run_query(
    spark: SparkSession,
    query: str,
    provider: str,
    checkpoint: str,
    inputs: Path,
    output: Path,
    until_batch: int,
    timeout: float = 300.0,
    pause: Path | None = None,
    files_per_trigger: int = 1,
) -> int:
    """Run `query` with `provider`'s state store on `checkpoint` (a local path or a Hadoop
    URI such as ``s3a://bucket/prefix``) over the files in `inputs`, writing to `output`,
    and stop it once it is idle with batch `until_batch` committed; returns the last
    committed batch id.

    Idle means that Spark found nothing to run: every input file read and no batch without
    data left to run for the watermark (`StreamingQuery.processAllAvailable`). Batch ids
    count the batches without data too, so on a fresh checkpoint with F files a query
    with a watermark stops after batch F (without data: it applies the watermark that the
    last file moved), pandas_state after batch F - 1. `until_batch` is a lower bound: below
    it the query waits for more input, up to `timeout` (a driver to be killed meanwhile
    can be given a large one).

    Raises `QueryFailed` with Spark's error if the query fails, or after `timeout` seconds
    (then the query is stopped)."""
    run = QueryRun(provider, checkpoint, inputs, output, until_batch)
    return run_queries(spark, query, [run], timeout, pause, files_per_trigger)[0]


@dataclass(frozen=True)
class QueryRun:
    """One query of `run_queries`: `provider`'s state store on `checkpoint` over the files
    in `inputs`, writing to `output`, until it is idle with `until_batch` committed."""

    provider: str
    checkpoint: str
    inputs: Path
    output: Path
    until_batch: int


def _query_id(checkpoint: str) -> str | None:
    """The query id in a local checkpoint's ``metadata`` (None: not local, or none yet)."""
    path = Path(checkpoint) / "metadata"
    if "://" in checkpoint or not path.is_file():
        return None
    return str(json.loads(path.read_text().splitlines()[0])["id"])


def run_queries(
    spark: SparkSession,
    query: str,
    runs: Sequence[QueryRun],
    timeout: float = 300.0,
    pause: Path | None = None,
    files_per_trigger: int = 1,
) -> list[int]:
    """`run_query` for several checkpoints at once: `query` runs on each of `runs` (each
    in a session of its own, with its provider's settings) side by side in this JVM, and
    all are stopped once each is idle with its `until_batch` committed; returns the last
    committed batch id of each, in order. One driver JVM then serves several locations
    (a test killing it kills them all at the same moment). The checkpoints must be of
    different queries: copies of one location (a savepoint, a rolled back copy) hold one
    query id, and Spark stops the active run of a query id when another starts
    (``spark.sql.streaming.stopActiveRunOnRestart``), so the first would never finish.

    Raises `QueryFailed` if one fails, or after `timeout` seconds (then all are stopped);
    ValueError, before starting any, for two local checkpoints of one query id."""
    ids = [i for i in map(_query_id, (r.checkpoint for r in runs)) if i is not None]
    if len(set(ids)) < len(ids):
        raise ValueError(f"checkpoints of one query id cannot run side by side: {runs}")
    restart_state_store_maintenance(spark)
    started: list[tuple[QueryRun, SparkSession, StreamingQuery]] = []
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        for _, _, running in started:
            running.stop()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    try:
        for run in runs:
            session = query_session(spark, run.provider)
            running = start_query(session, query, run.checkpoint, run.inputs, run.output, pause,
                                  files_per_trigger)
            started.append((run, session, running))
        timer.start()
        last: dict[int, int] = {}
        while len(last) < len(started):
            for i, (run, session, running) in enumerate(started):
                if i in last:
                    continue
                try:
                    running.processAllAvailable()
                except Exception as error:  # Spark's StreamingQueryException
                    raise QueryFailed(f"{query} on {run.provider} failed: {error}") from error
                if timed_out.is_set():
                    raise QueryFailed(
                        f"{query} on {run.provider}: batch {run.until_batch} not committed "
                        f"after {timeout} s; status {running.status}"
                    )
                committed = committed_batches(session, run.checkpoint)
                if committed and committed[-1] >= run.until_batch:
                    last[i] = committed[-1]
            if len(last) < len(started):
                time.sleep(0.2)
        return [last[i] for i in range(len(started))]
    finally:
        timer.cancel()
        for _, _, running in started:
            running.stop()
        # Spark's maintenance would go on snapshotting and deleting old versions in the
        # background: stopped, the checkpoints stay as the queries left them.
        restart_state_store_maintenance(spark)


# -- the driver process ------------------------------------------------------------------------
def driver_session(checkpoint: str, s3_endpoint: str | None) -> SparkSession:
    """A local[2] session like tests.support.spark_session.make_session; for ``s3a://``
    checkpoints with hadoop-aws (tests/support/infra/jvm.py) on the class path and the S3
    settings from `s3_endpoint` and the ``AWS_*`` variables."""
    from statehold.spark.session import s3a_conf
    from tests.support.spark_session import make_session

    conf: dict[str, str] = {}
    if checkpoint.startswith("s3a://"):
        from tests.support.infra import jvm

        # appended, so this driver's JVM maps Spark's archived classes (jvm.py says why)
        os.environ.update(jvm.appended_classpath(jvm.fetch(jvm.hadoop_aws())))
        conf.update(s3a_conf({"endpoint": s3_endpoint} if s3_endpoint else None))
    return make_session(conf)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.support.spark_locations.queries",
        description="Run one of Spark's stateful queries on a checkpoint until a batch "
        "(or on several checkpoints at once, each given with --run).",
    )
    p.add_argument("--query", required=True, choices=sorted(QUERIES))
    p.add_argument("--provider", choices=sorted(PROVIDERS))
    p.add_argument("--checkpoint", help="a local path or an s3a:// URI")
    p.add_argument("--input", type=Path)
    p.add_argument("--output", type=Path)
    p.add_argument("--until-batch", type=int)
    p.add_argument("--run", nargs=5, action="append", default=[],
                   metavar=("PROVIDER", "CHECKPOINT", "INPUT", "OUTPUT", "UNTIL_BATCH"),
                   help="one query of several run side by side in this driver (may repeat; "
                   "instead of the five options above)")
    p.add_argument("--serve", action="store_true",
                   help="run one query after another as asked on standard input, one JSON "
                   "line each (ServingDriver), until it ends")
    p.add_argument("--s3-endpoint", help="the S3 endpoint of an s3a:// checkpoint")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--pause-source", type=Path,
                   help="read through pause_source.py's source, armed by this file")
    args = p.parse_args(argv)
    single = (args.provider, args.checkpoint, args.input, args.output, args.until_batch)
    if args.serve:
        if args.run or any(v is not None for v in single):
            p.error("--serve takes its runs on standard input")
        return args
    if args.run and any(v is not None for v in single):
        p.error("--run replaces --provider, --checkpoint, --input, --output and --until-batch")
    if not args.run and any(v is None for v in single):
        p.error("--provider, --checkpoint, --input, --output and --until-batch (or --run)")
    for provider, *_, until in args.run:
        if provider not in PROVIDERS or not until.isdigit():
            p.error(f"--run {provider} ... {until}: a provider of {sorted(PROVIDERS)} "
                    "and a batch id")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Prints ``{"last_batch": N}`` once the query stopped at batch N (with --run:
    ``{"last_batches": [N, ...]}``, in the order of the runs); exits 1 with Spark's error
    when one failed. Spark's JVM is a child process: to kill the driver, kill its process
    group (start it with ``start_new_session=True``)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.serve:
        return serve(args.query, args.s3_endpoint, args.timeout)
    runs = [
        QueryRun(provider, checkpoint, Path(inputs).absolute(), Path(output).absolute(),
                 int(until))
        for provider, checkpoint, inputs, output, until in args.run
    ] or [
        QueryRun(args.provider, args.checkpoint, args.input.absolute(),
                 args.output.absolute(), args.until_batch)
    ]
    s3a = next((r.checkpoint for r in runs if r.checkpoint.startswith("s3a://")), None)
    spark = driver_session(s3a or runs[0].checkpoint, args.s3_endpoint)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        last = run_queries(spark, args.query, runs, args.timeout, args.pause_source)
    except QueryFailed as error:
        print(error, file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(json.dumps({"last_batches": last} if args.run else {"last_batch": last[0]}),
          flush=True)
    return 0


def serve(query: str, s3_endpoint: str | None, timeout: float) -> int:
    """`ServingDriver`'s far side: each line of standard input a run (``{"provider",
    "checkpoint", "input", "output", "until"}``), answered on standard output with
    ``{"last_batch": N}`` once the query stopped there, or ``{"error": ...}``. The session
    starts with the first run (its checkpoint says whether S3A's settings are needed)."""
    spark: SparkSession | None = None
    try:
        for line in sys.stdin:
            ask = json.loads(line)
            run = QueryRun(ask["provider"], ask["checkpoint"], Path(ask["input"]).absolute(),
                           Path(ask["output"]).absolute(), int(ask["until"]))
            if spark is None:
                spark = driver_session(run.checkpoint, s3_endpoint)
                spark.sparkContext.setLogLevel("ERROR")
            try:
                (last,) = run_queries(spark, query, [run], timeout)
            except QueryFailed as error:
                print(json.dumps({"error": str(error)}), flush=True)
                continue
            print(json.dumps({"last_batch": last}), flush=True)
    finally:
        if spark is not None:
            spark.stop()
    return 0


class ServingDriver:
    """One driver process (``--serve``) that runs `query` on one checkpoint after another,
    each until a batch and then stopped, as the test asks: the test works on the stopped
    location (gc, savepoint, rollback) between runs, and one JVM serves them all. A context
    manager: leaving it ends the driver; its standard error goes to `log`."""

    def __init__(self, query: str, log: Path, s3_endpoint: str | None = None,
                 env: Mapping[str, str] | None = None, timeout: float = 300.0) -> None:
        self.log = log
        args = ["--query", query, "--serve", "--timeout", str(timeout)]
        if s3_endpoint:
            args += ["--s3-endpoint", s3_endpoint]
        with open(log, "wb") as sink:
            self.proc = subprocess.Popen(
                driver_cmd(*args), env=driver_env(env), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=sink, text=True,
            )

    def run(self, provider: str, checkpoint: str, inputs: Path, output: Path,
            until: int) -> int:
        """Runs until `until` is committed; the last committed batch (AssertionError with
        Spark's error or the driver's log if the run failed or the driver ended)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        ask = {"provider": provider, "checkpoint": checkpoint, "input": str(inputs),
               "output": str(output), "until": until}
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("{"):
                answer = json.loads(line)
                assert "error" not in answer, answer["error"]
                last: int = answer["last_batch"]
                return last
        raise AssertionError(f"the driver ended (exit {self.proc.wait()}): "
                             f"{self.log.read_text()[-5000:]}")

    def __enter__(self) -> ServingDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def driver_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.spark_locations.queries", *args]


def driver_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: this tree's code and tests.support importable."""
    from tests.support.paths import ROOT, SRC, python_path

    return {**os.environ, "PYTHONPATH": python_path([SRC, ROOT]), **dict(extra or {})}


if __name__ == "__main__":
    # Run main from the module imported by name, so that the functions Spark pickles are
    # imported by the Python workers rather than pickled from __main__.
    from tests.support.spark_locations.queries import main as named_main

    sys.exit(named_main())
