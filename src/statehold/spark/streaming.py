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
        processing time defaults to now). Returns their results ([]: none was due)."""
        with self._lock:
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
        while len(results) < MAX_TIMER_BATCHES and self.job.timers_due(processing_time_ms):
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
