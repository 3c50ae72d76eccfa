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

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError
from statehold.spark.checkpoint_run import check_spark_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from statehold.spark.batch import BatchResult
    from statehold.spark.job import StatefulJob

SPARK_BATCH = "spark_batch_id"
#: Batches without input run in a row at most this many times per call: more are only
#: due when the processor keeps registering timers that are already due.
MAX_TIMER_BATCHES = 16


def is_processor(obj: Any) -> bool:
    """A stateful processor (an ``init`` and handle methods), not a plain function."""
    return callable(getattr(obj, "init", None)) and any(
        callable(getattr(obj, m, None)) for m in ("handle_input_rows", "handleInputRows")
    )


class ProcessorBatches:
    """The ``foreachBatch`` function of one processor (see the module's docstring)."""

    def __init__(
        self,
        job: StatefulJob,
        processor: Any,
        output_schema: StructType | str,
        options: Mapping[str, Any],
        *,
        no_data_batches: bool = True,
        input_schema: StructType | str | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.job = job
        self.processor = processor
        self.output_schema = output_schema
        #: the keyword arguments of `StatefulJob.transform_with_state` for every batch
        self.options = dict(options)
        self.no_data_batches = no_data_batches
        self.on_batch = on_batch
        self._schema: StructType | None = None
        if input_schema is not None:
            self._schema = job._struct(input_schema)
        self._lock = threading.Lock()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self._lock:
            self._schema = batch_df.schema
            done = self.latest_spark_batch()
            check_spark_batch(self.job, batch_id, done, "batch {} recorded")
            ran = None
            if done is None or batch_id > done:
                ran = self._batch(batch_df, batch_id, timers_only=False).checkpoint_id
            self.job.recent.link(batch_id, ran)  # for the progress listener
            if self.no_data_batches:
                self._fire(batch_id, None)

    def fire_due_timers(self, processing_time_ms: int | None = None) -> list[BatchResult]:
        """Run batches without input while timers are due (`StatefulJob.timers_due`; the
        processing time defaults to now). Returns their results ([]: none was due)."""
        with self._lock:
            return self._fire(self.latest_spark_batch(), processing_time_ms)

    def latest_spark_batch(self) -> int | None:
        """The Spark batch id the newest checkpoint records (None: no checkpoint)."""
        latest = self.job.coordinator.latest()
        if latest is None:
            return None
        recorded = latest[1].source_position.get(SPARK_BATCH)
        return int(recorded) if isinstance(recorded, int) else latest[1].checkpoint_id

    def _fire(self, spark_batch: int | None, processing_time_ms: int | None) -> list[BatchResult]:
        results: list[BatchResult] = []
        while len(results) < MAX_TIMER_BATCHES and self.job.timers_due(processing_time_ms):
            if self._schema is None:
                raise InvalidArgumentError(
                    "timers are due but no micro-batch has run in this driver yet: pass "
                    "input_schema= to foreach_batch to fire them without one"
                )
            empty = self.job.spark.createDataFrame([], self._schema)
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
        result = self.job.transform_with_state(
            df,
            self.processor,
            self.output_schema,
            source_position=position,
            processing_time_ms=processing_time_ms,
            **self.options,
        )
        if self.on_batch is not None:
            self.on_batch(result)
        return result
