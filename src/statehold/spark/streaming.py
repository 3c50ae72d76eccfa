"""A stateful processor in Structured Streaming: `ProcessorBatches` is the function
``writeStream.foreachBatch`` calls (``job.foreach_batch(processor, ...)``).

Each Spark micro-batch N runs the processor as one statehold checkpoint (exactly once,
like `StatefulJob.transform_with_state` with a sink), recording ``spark_batch_id = N`` in
the checkpoint's source position. Then, as Spark's own ``transformWithStateInPandas``
runs a no-data micro-batch when its watermark has moved past a timer
(``spark.sql.streaming.noDataMicroBatches.enabled``), it runs checkpoints without input
while timers are due (``no_data_batches``). Spark never calls ``foreachBatch`` without
new input, so on an idle stream nothing else fires them: `fire_due_timers` runs those
batches when the driver asks (e.g. every few seconds while the query waits).

So checkpoint ids count statehold's batches, not Spark's: batches that only fire timers
take ids too. A Spark batch whose id the newest checkpoint already records is a replay
of a batch whose checkpoint completed before Spark committed it: its input is skipped,
only due timers fire. The sink is called with the checkpoint id (each checkpoint's
output replaces that id's earlier, uncommitted output). One lock serialises the batches
of Spark's thread and the driver's calls of `fire_due_timers`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError
from statehold.spark.checkpoint_run import ReplayCheck
from statehold.spark.connect import is_connect
from statehold.spark.progress import RecentRecords

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from statehold.format.metadata import CheckpointMetadata
    from statehold.spark.batch import BatchResult

log = logging.getLogger("statehold.spark")

SPARK_BATCH = "spark_batch_id"
#: Spark's local property naming the streaming query whose micro-batch a thread runs.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: The longest a stop waits for Spark to mark its query stopped.
STOP_WAIT_SECONDS = 60.0
#: Batches without input run in a row at most this many times per call: more are only
#: due when the processor keeps registering timers that are already due.
MAX_TIMER_BATCHES = 16


def is_processor(obj: Any) -> bool:
    """A stateful processor (an ``init`` and handle methods), not a plain function."""
    return callable(getattr(obj, "init", None)) and any(
        callable(getattr(obj, m, None)) for m in ("handle_input_rows", "handleInputRows")
    )


@dataclass(frozen=True)
class ProcessorJob:
    """What `ProcessorBatches` needs of its `StatefulJob`."""

    #: one checkpoint of the processor: (input, source position, processing time or
    #: None for now) -> its result (`StatefulJob.transform_with_state`)
    run: Callable[[DataFrame, Mapping[str, Any], int | None], BatchResult]
    #: whether a timer is due at a processing time (None: now)
    timers_due: Callable[[int | None], bool]
    #: the newest checkpoint's document (None: no checkpoint yet)
    newest: Callable[[], CheckpointMetadata | None]
    replays: ReplayCheck
    #: where the progress listener finds each Spark batch's checkpoint
    recent: RecentRecords
    #: makes the empty input of batches that only fire timers
    spark: SparkSession
    #: marks a Spark micro-batch (requests from outside wait for its end)
    streaming: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
    #: serves requests from outside at the end of each micro-batch
    boundary: Callable[[], None] = lambda: None
    #: whether a stop from outside ended the job (or is ending it)
    stopped: Callable[[], bool] = lambda: False


class ProcessorBatches:
    """The ``foreachBatch`` function of one processor (see the module's docstring);
    `input_schema` lets timers fire before the first micro-batch of this driver."""

    def __init__(
        self,
        job: ProcessorJob,
        *,
        no_data_batches: bool = True,
        input_schema: StructType | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.job = job
        self.no_data_batches = no_data_batches
        self.on_batch = on_batch
        self._schema = input_schema
        self._lock = threading.Lock()
        #: Spark Connect: the newest batch's session (the foreachBatch process may be
        #: handed a new one per batch), for the empty input of timer batches
        self._session: SparkSession | None = None

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self._lock:
            with self.job.streaming():
                self._schema = batch_df.schema
                if is_connect(batch_df.sparkSession):
                    self._session = batch_df.sparkSession
                done = self.latest_spark_batch()
                self.job.replays.check(batch_id, done, "batch {} recorded")
                ran = None
                if done is None or batch_id > done:
                    ran = self._batch(batch_df, batch_id, timers_only=False).checkpoint_id
                self.job.recent.link(batch_id, ran)  # for the progress listener
                if self.no_data_batches:
                    self._fire(batch_id, None)
            self.job.boundary()

    def fire_due_timers(self, processing_time_ms: int | None = None) -> list[BatchResult]:
        """Run batches without input while timers are due (`StatefulJob.timers_due`; the
        processing time defaults to now). Returns their results ([]: none was due, or a
        stop from outside ended the job, as a driver's loop may ask once more after
        ``awaitTermination`` returned)."""
        with self._lock:
            if self.job.stopped():
                return []
            return self._fire(self.latest_spark_batch(), processing_time_ms)

    def latest_spark_batch(self) -> int | None:
        """The Spark batch id the newest checkpoint records (None: no checkpoint)."""
        newest = self.job.newest()
        if newest is None:
            return None
        recorded = newest.source_position.get(SPARK_BATCH)
        return int(recorded) if isinstance(recorded, int) else newest.checkpoint_id

    def _fire(self, spark_batch: int | None, processing_time_ms: int | None) -> list[BatchResult]:
        results: list[BatchResult] = []
        while (len(results) < MAX_TIMER_BATCHES and not self.job.stopped()
               and self.job.timers_due(processing_time_ms)):
            if self._schema is None:
                raise InvalidArgumentError(
                    "timers are due but no micro-batch has run in this driver yet: pass "
                    "input_schema= to foreach_batch to fire them without one"
                )
            spark = self._session or self.job.spark
            empty = spark.createDataFrame([], self._schema)
            results.append(self._batch(empty, spark_batch, True, processing_time_ms))
        return results

    def _batch(
        self,
        df: DataFrame,
        spark_batch: int | None,
        timers_only: bool,
        processing_time_ms: int | None = None,
    ) -> BatchResult:
        position: dict[str, Any] = {SPARK_BATCH: spark_batch}
        if timers_only:
            position["timers_only"] = True
        result = self.job.run(df, position, processing_time_ms)
        if self.on_batch is not None:
            self.on_batch(result)
        return result


def query_of_this_thread(spark: SparkSession) -> str | None:
    """The id of the streaming query whose micro-batch this thread runs (None outside
    one, and under Spark Connect, where the batch's process cannot see its query)."""
    if is_connect(spark):
        return None
    found: str | None = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    return found


def idle_query(
    spark: SparkSession, query_id: str | None, checkpoint_location: str
) -> StreamingQuery | None:
    """The query a stop served while idle may stop: the active query whose micro-batches
    the job ran (`query_id`; before the first, the one whose checkpoint location is the
    job's), provided no trigger of it is active. A trigger that found new input runs a
    micro-batch, which the stop would interrupt: the stop then waits for its end (the
    batch boundary) or for the next idle moment. None: no such query now."""
    try:
        query = spark.streams.get(query_id) if query_id else _query_at(spark,
                                                                       checkpoint_location)
        if query is None or not query.isActive or query.status.get("isTriggerActive", True):
            return None
    except Exception as e:  # the session stopping under it, say: a boundary serves it
        log.debug("finding the query to stop: %s", e)
        return None
    return query


def _query_at(spark: SparkSession, location: str) -> StreamingQuery | None:
    """The active query checkpointing to `location` (compared as Hadoop qualifies paths),
    through Spark's internal query object: None when it cannot be told."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        path = jvm.org.apache.hadoop.fs.Path(location)
        wanted = str(path.getFileSystem(conf).makeQualified(path).toString()).rstrip("/")
        for query in spark.streams.active:
            root = str(query._jsq.streamingQuery().resolvedCheckpointRoot()).rstrip("/")
            if root == wanted:
                return query
    except Exception as e:  # another Spark's internals: the stop waits for a batch
        log.debug("finding the query checkpointing to %s: %s", location, e)
    return None


def stop_query(query: StreamingQuery, timeout: float) -> bool:
    """``query.stop()`` from another thread (it waits for the query's thread, which may be
    waiting for this one's lock): whether it returned within `timeout` seconds."""

    def stop() -> None:
        try:
            query.stop()
        except Exception as e:  # a stop racing the query's own end: nothing to do
            log.warning("stopping query %s: %s", query.id, e)

    stopper = threading.Thread(target=stop, name="statehold-stop-query", daemon=True)
    stopper.start()
    stopper.join(timeout)
    return not stopper.is_alive()


def await_interruption(spark: SparkSession, query_id: str | None) -> None:
    """In a micro-batch's thread, wait until stopping its query interrupts it. Spark's
    ``stop()`` interrupts the query's JVM thread, and PySpark runs this thread's calls
    into the JVM on that very thread (pinned threads), so a JVM sleep raises there
    (``Py4JJavaError``: ``InterruptedException``), as any call of a micro-batch Spark
    stops does, and Spark takes the failure for its stop. Returns when the query has
    ended without interrupting this thread (pinned threads off), or after
    `STOP_WAIT_SECONDS`."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    waited = 0.0
    ended_at: float | None = None
    while waited < STOP_WAIT_SECONDS:
        jvm.java.lang.Thread.sleep(50)  # raises once interrupted
        waited += 0.05
        query = spark.streams.get(query_id) if query_id else None
        if query is None or not query.isActive:
            ended_at = waited if ended_at is None else ended_at
            if waited - ended_at >= 1.0:  # its interruption would have come by now
                return


def stop_this_query(spark: SparkSession) -> bool:
    """Stop the streaming query whose ``foreachBatch`` function calls this, once that
    function returns: no later micro-batch starts. `StreamingQuery.stop` waits for the
    query's thread, which is waiting for this very function, so another thread calls it;
    this one returns once Spark marked the query stopped (at most `STOP_WAIT_SECONDS`).
    Spark may then interrupt the commit of this micro-batch: a restart replays it, and
    its checkpoint, already completed, is skipped. False when no query is found (not
    inside ``foreachBatch``)."""
    if is_connect(spark):
        log.warning("a stop under Spark Connect ends the job, not the query: stop the "
                    "query from the client (its next batch fails: the job has ended)")
        return False
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    query = None if query_id is None else spark.streams.get(query_id)
    if query is None:
        log.warning("stop asked outside a streaming query's foreachBatch: nothing to stop")
        return False

    def stop() -> None:
        try:
            query.stop()
        except Exception as e:  # a stop racing the query's own end: nothing to do
            log.warning("stopping query %s: %s", query_id, e)

    threading.Thread(target=stop, name="statehold-stop-query", daemon=True).start()
    waited = 0.0
    while query.isActive and waited < STOP_WAIT_SECONDS:
        threading.Event().wait(0.01)
        waited += 0.01
    log.info("query %s stopped after its batch (asked from outside)", query_id)
    return True
