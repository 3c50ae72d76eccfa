"""Where statehold's per-batch figures show beside Spark's progress, on a real streaming
query: an ``observe()`` on the streaming DataFrame reaches ``progress.observedMetrics``,
one on the batch DataFrame inside ``foreachBatch`` does not (Spark runs it as a query of
its own over the batch's rows), and statehold's listener hands over each batch's progress
with its history record, which the data source's history view also holds, by the same
batch id."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from statehold.job.history import HistoryRecord
from statehold.spark import StatefulJob
from statehold.spark.data_source import data_sources_supported
from tests.support.keyed_totals import MAXP, OUT, make_batches, totals

pytestmark = [pytest.mark.spark, pytest.mark.matrix]  # each Spark's listener events


def test_observed_metrics_listener_and_history_view(
    spark: Any, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    sizes = []
    for i, batch in enumerate(make_batches(3, seed=7)):
        lines = [json.dumps({"key": k, "value": v, "seq": s}) for k, v, s in batch]
        (src / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")
        sizes.append(len(lines))
    job = StatefulJob(spark, str(tmp_path / "ckpt"), "p", max_parallelism=MAXP, parallelism=2)
    run = job.foreach_batch(totals, OUT, sink=lambda df, n: None, order_by=["seq"])
    inner_counts: dict[int, int] = {}
    lock = threading.Lock()

    def batch(df: DataFrame, batch_id: int) -> None:
        # kept, so that the source is read once (Spark's numInputRows counts every read)
        kept = df.persist()
        try:
            n = kept.observe("inner", F.count(F.lit(1)).alias("rows")).count()
            with lock:
                inner_counts[batch_id] = n
            run(kept, batch_id)
        finally:
            kept.unpersist()

    heard: dict[int, tuple[Any, HistoryRecord | None]] = {}
    listener = job.progress_listener(lambda p, r: heard.__setitem__(int(p.batchId), (p, r)))
    spark.streams.addListener(listener)
    try:
        stream = (spark.readStream.schema("key string, value long, seq long")
                  .option("maxFilesPerTrigger", 1).json(str(src)))
        stream = stream.observe("input", F.count(F.lit(1)).alias("rows"))
        query = (stream.writeStream.foreachBatch(batch)
                 .option("checkpointLocation", job.spark_checkpoint_location)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # type: ignore[union-attr]
        # a dict per batch on PySpark 3.5, a dict subclass on 4
        progresses = {int(p["batchId"]): p for p in query.recentProgress}
    finally:
        spark.streams.removeListener(listener)
        job.close()

    assert sorted(progresses) == [0, 1, 2] and inner_counts == dict(enumerate(sizes))
    for batch_id, progress in progresses.items():
        observed = progress["observedMetrics"]
        # the streaming plan's observation reaches the progress
        assert observed["input"]["rows"] == sizes[batch_id] == progress["numInputRows"]
        # the batch DataFrame's observation ran as its own job: not in the progress
        assert "inner" not in observed
        heard_progress, record = heard[batch_id]
        assert int(heard_progress.batchId) == batch_id
        assert record is not None and record.checkpoint_id == batch_id
        assert record.rows == sizes[batch_id]

    if not data_sources_supported():
        return  # PySpark 3.5: no format("statehold")
    history = (spark.read.format("statehold").option("view", "history")
               .load(str(tmp_path / "ckpt" / "p")))
    by_batch = {r["checkpoint_id"]: r for r in history.collect()}
    for batch_id, (_, record) in heard.items():
        assert record is not None
        assert by_batch[batch_id]["bytes_uploaded"] == record.bytes_uploaded
        assert by_batch[batch_id]["rows"] == record.rows
