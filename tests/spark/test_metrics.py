"""Metrics of a real Spark streaming run: a Spark listener gets statehold's figures for
every micro-batch, the Prometheus endpoint scraped during the run agrees with each
`BatchResult`, the history (also as a DataFrame) holds the same figures, and a restart on
a fresh local disk reports what its tasks downloaded."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from statehold.format.metadata import read_metadata
from statehold.job.history import HistoryRecord, read_history
from statehold.spark import BatchResult, StatefulJob, read_history_df
from statehold.storage import open_storage
from tests.support.keyed_totals import MAXP, OUT, make_batches, totals

pytestmark = [pytest.mark.spark, pytest.mark.matrix]  # each Spark's streaming listener


def scrape(port: int) -> dict[str, float]:
    """The endpoint's samples as {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_listener_prometheus_and_history_agree(spark: SparkSession, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i, batch in enumerate(make_batches(3, seed=5)):
        lines = [json.dumps({"key": k, "value": v, "seq": s}) for k, v, s in batch]
        (src / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")
    results: list[BatchResult] = []
    scraped: dict[int, dict[str, float]] = {}
    heard: dict[int, tuple[Any, HistoryRecord | None]] = {}
    job = StatefulJob(spark, str(tmp_path / "ckpt"), "m", max_parallelism=MAXP,
                      parallelism=2, metrics_port=0)
    assert job.metrics is not None
    port = job.metrics.port

    def on_batch(result: BatchResult) -> None:
        results.append(result)
        scraped[result.checkpoint_id] = scrape(port)  # during the run

    listener = job.progress_listener(lambda p, r: heard.__setitem__(int(p.batchId), (p, r)))
    spark.streams.addListener(listener)
    try:
        stream = (spark.readStream.schema("key string, value long, seq long")
                  .option("maxFilesPerTrigger", 1).json(str(src)))
        query = (stream.writeStream
                 .foreachBatch(job.foreach_batch(totals, OUT, sink=lambda df, n: None,
                                                 order_by=["seq"], on_batch=on_batch))
                 .option("checkpointLocation", job.spark_checkpoint_location)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # type: ignore[union-attr]
    finally:
        spark.streams.removeListener(listener)
        job.close()

    assert [r.checkpoint_id for r in results] == [0, 1, 2]
    job_label = 'job="m"'
    for r in results:
        samples = scraped[r.checkpoint_id]
        assert samples[f"statehold_last_checkpoint_id{{{job_label}}}"] == r.checkpoint_id
        assert samples[f"statehold_last_checkpoint_uploaded_bytes{{{job_label}}}"] == (
            r.bytes_uploaded)
        assert samples[f"statehold_state_size_bytes{{{job_label}}}"] == r.state_size
        assert samples[f'statehold_checkpoints_total{{{job_label},outcome="completed"}}'] == (
            r.checkpoint_id + 1)
        assert samples[f"statehold_epoch{{{job_label}}}"] == 1
        assert 0 <= samples[f"statehold_seconds_since_last_checkpoint{{{job_label}}}"] < 3600
        assert samples[f"statehold_cleanup_backlog{{{job_label}}}"] >= 0
        progress, record = heard[r.checkpoint_id]
        assert record is not None and progress.numInputRows == r.rows_in
        assert (record.bytes_uploaded, record.state_size, record.keys, record.rows) == (
            r.bytes_uploaded, r.state_size, r.keys, r.rows_in)
        assert record.snapshot_seconds == pytest.approx(r.snapshot_seconds)
    assert scraped[2][f"statehold_uploaded_bytes_total{{{job_label}}}"] == sum(
        r.bytes_uploaded for r in results)

    history = read_history(open_storage(str(tmp_path / "ckpt" / "m")))
    assert [(h.checkpoint_id, h.bytes_uploaded, h.files_reused) for h in history] == [
        (r.checkpoint_id, r.bytes_uploaded, r.files_reused) for r in results]
    df = read_history_df(spark, str(tmp_path / "ckpt" / "m"))
    assert [(row.checkpoint_id, row.state_size) for row in df.orderBy("checkpoint_id").collect()] \
        == [(r.checkpoint_id, r.state_size) for r in results]

    # A restart on a fresh local disk downloads the newest checkpoint's files. One task
    # (both ranges merged into it), so no task can link a file another just restored:
    # with two, a file both ranges hold (same name and checksum) is downloaded once or
    # twice depending on which task reaches it first.
    storage = open_storage(str(tmp_path / "ckpt" / "m"))
    latest = read_metadata(storage, "chk-2/_metadata")
    job = StatefulJob(spark, str(tmp_path / "ckpt"), "m", max_parallelism=MAXP,
                      parallelism=1, local_dir=str(tmp_path / "fresh"))
    try:
        more: DataFrame = spark.createDataFrame([("k1", 1, 0)], "key string, value long, seq long")
        restarted = job.run_batch(more, totals, OUT, batch_id=3)
    finally:
        job.close()
    stored = sum(f.size for _op, _kg, f in latest.state_files())
    assert restarted.bytes_downloaded == stored > 0
    assert restarted.files_downloaded == sum(1 for _ in latest.state_files())
    assert read_history(storage)[-1].bytes_downloaded == stored
