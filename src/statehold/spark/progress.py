"""statehold's per-batch figures beside Spark's streaming progress.

PySpark gives a `foreachBatch` function no way to add figures to Spark's own
`StreamingQueryProgress`: ``observe()`` on the batch DataFrame inside it runs as a query
of its own (Spark hands the function a new plan over the batch's rows), and its metrics
never reach ``progress.observedMetrics``, which only the streaming plan's own
``observe()`` fills; Python data sources report only Spark's built-in Python metrics
(tests/spark/test_progress_observed.py checks this on PySpark 4). So statehold joins them
on the driver instead (and ``format("statehold")`` with ``view=history`` has them too):
`StateholdProgressListener` is a Spark `StreamingQueryListener` (PySpark 3.4+) that,
for every progress event, looks up the job's history record of that batch (checkpoint id
= Spark batch id, or for a processor the checkpoint `statehold.spark.streaming` ran the
batch's input in) and hands both to your callback. Spark reports a batch's progress
after its foreachBatch returned, so the record is there (None for a replayed batch
statehold skipped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from statehold.job.history import HistoryRecord

#: Records kept in memory per job for the listener (the newest ones).
RECENT = 100

ProgressCallback = Callable[[Any, HistoryRecord | None], None]


class RecentRecords:
    """The newest history records of a job's batches, by checkpoint id (bounded)."""

    def __init__(self, size: int = RECENT) -> None:
        self.size = size
        self._records: OrderedDict[int, HistoryRecord] = OrderedDict()
        #: Spark batch id -> checkpoint id (None: skipped), where they differ (processors)
        self._spark: OrderedDict[int, int | None] = OrderedDict()

    def add(self, record: HistoryRecord) -> None:
        self._records[record.checkpoint_id] = record
        self._records.move_to_end(record.checkpoint_id)
        while len(self._records) > self.size:
            self._records.popitem(last=False)

    def get(self, checkpoint_id: int) -> HistoryRecord | None:
        return self._records.get(checkpoint_id)

    def link(self, spark_batch_id: int, checkpoint_id: int | None) -> None:
        """Spark's batch `spark_batch_id` ran as `checkpoint_id` (None: it was skipped)."""
        self._spark[spark_batch_id] = checkpoint_id
        self._spark.move_to_end(spark_batch_id)
        while len(self._spark) > self.size:
            self._spark.popitem(last=False)

    def for_spark_batch(self, batch_id: int) -> HistoryRecord | None:
        """The record of Spark's batch `batch_id`."""
        if batch_id not in self._spark:
            return self.get(batch_id)
        checkpoint_id = self._spark[batch_id]
        return None if checkpoint_id is None else self.get(checkpoint_id)


class StateholdProgressListener(StreamingQueryListener):
    """Calls ``callback(progress, record)`` for each micro-batch of the queries running
    `job.foreach_batch`: Spark's `StreamingQueryProgress` and statehold's record of the
    same batch (from `recent`: the job's). Register it with
    ``spark.streams.addListener(listener)``."""

    def __init__(self, recent: RecentRecords, callback: ProgressCallback) -> None:
        self.recent = recent
        self.callback = callback

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        self.callback(progress, self.recent.for_spark_batch(int(progress.batchId)))

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass
