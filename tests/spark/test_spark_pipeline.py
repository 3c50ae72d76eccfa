"""The keyed stateful step on local Spark: results equal a plain-Python reference, across
batches, restarts, rescaling up and down, replays and failed batches."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from statehold.backend.engine import RUNS_TRIGGER
from statehold.format import layout
from statehold.format.metadata import read_metadata
from statehold.spark import KeyedState, MalformedInputError, StatefulJob
from statehold.storage import open_storage
from tests.support.keyed_totals import (
    MAXP,
    OUT,
    Reference,
    make_batches,
    outputs,
    stored_state,
    to_df,
    totals,
)

pytestmark = [pytest.mark.spark, pytest.mark.matrix]


@pytest.mark.parametrize("changelog", [False, True], ids=["snapshots", "changelog"])
def test_batches_restart_and_rescale_match_reference(
    spark: SparkSession, tmp_path: Path, changelog: bool
) -> None:
    ref = Reference()
    root = str(tmp_path / "ckpt")
    # 2 tasks, then a restart with 4 tasks (up), then with 1 task (down)
    plan = [2, 2, 4, 4, 1]
    job: StatefulJob | None = None
    second: list[str] = []  # the files checkpoint 1 names
    for batch_id, (rows, parallelism) in enumerate(zip(make_batches(len(plan)), plan, strict=True)):
        if job is None or job.parallelism != parallelism:
            if job is not None:
                job.close()
            job = StatefulJob(
                spark, root, "totals", max_parallelism=MAXP, parallelism=parallelism,
                local_dir=str(tmp_path / f"local-{parallelism}"),
                backend_options={"changelog": True} if changelog else None,
            )
        result = job.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"])
        assert result.checkpoint_id == batch_id and not result.skipped
        assert outputs(result) == ref.apply(rows)
        assert result.files_uploaded > 0 and result.bytes_uploaded > 0
        assert result.snapshot_seconds > 0 and result.complete_seconds > 0
        if batch_id == 1:
            meta = read_metadata(job.storage, layout.checkpoint_metadata_key(1))
            second = [f.name or "" for r in meta.operators[0].ranges for f in r.files]
    assert job is not None
    job.close()
    state = stored_state(open_storage(root).child("totals"))
    assert state == ref.state
    meta = read_metadata(job.storage, layout.checkpoint_metadata_key(len(plan) - 1))
    assert [r.key_groups.end for r in meta.operators[0].ranges] == [MAXP - 1]
    # batch 1 extended batch 0's state (same tasks): by changelog only when asked
    assert any(n.startswith("changelog-") for n in second) == changelog


def test_replay_is_skipped_and_failed_batch_restores_previous(
    spark: SparkSession, tmp_path: Path
) -> None:
    ref = Reference()
    root = str(tmp_path / "ckpt")
    b0, b1 = make_batches(2, seed=3)
    job = StatefulJob(spark, root, "j", max_parallelism=MAXP, parallelism=2)
    assert outputs(job.run_batch(to_df(spark, b0), totals, OUT, order_by=["seq"])) == ref.apply(b0)
    job.close()

    # a new attempt replays batch 0 (crash after our checkpoint, before Spark's commit)
    job = StatefulJob(spark, root, "j", max_parallelism=MAXP, parallelism=2)
    written: list[int] = []
    replay = job.run_batch(
        to_df(spark, b0), totals, OUT, batch_id=0, sink=lambda df, n: written.append(n)
    )
    assert replay.skipped and written == []

    # batch 1 fails in the user function after some keys were updated in the task
    def flaky(key: str, rows: list[dict[str, Any]], state: KeyedState) -> Any:
        out = totals(key, rows, state)
        if key == "k3":
            raise RuntimeError("boom")
        return out

    with pytest.raises(Exception, match="boom"):
        job.run_batch(to_df(spark, b1), flaky, OUT, batch_id=1, order_by=["seq"])
    assert job.latest_checkpoint_id() == 0

    # a failing sink also aborts: nothing completes
    def bad_sink(df: DataFrame, n: int) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        job.run_batch(to_df(spark, b1), totals, OUT, batch_id=1, sink=bad_sink, order_by=["seq"])
    assert job.latest_checkpoint_id() == 0

    # the retry restores from checkpoint 0: no double counting
    sunk: dict[int, dict[str, tuple[int, int, list[int]]]] = {}

    def sink(df: DataFrame, n: int) -> None:
        sunk[n] = {r.key: (r["count"], r["sum"], list(r["last"])) for r in df.collect()}

    result = job.run_batch(to_df(spark, b1), totals, OUT, batch_id=1, sink=sink, order_by=["seq"])
    assert sunk == {1: ref.apply(b1)} and result.checkpoint_id == 1
    job.close()
    assert stored_state(job.storage) == ref.state


def test_staged_result_is_cached_for_its_batch_only(spark: SparkSession, tmp_path: Path) -> None:
    """The staged result is persisted while its batch runs and unpersisted when the batch
    completed (with a sink) or failed; without a sink it is ``result.output``, kept until
    the job stages its next batch. Else executors would pile up one result per batch."""
    def cached() -> int:
        return int(spark.sparkContext._jsc.getPersistentRDDs().size())  # noqa: SLF001

    def fails(key: str, rows: list[dict[str, Any]], state: KeyedState) -> list[Any]:
        raise RuntimeError("boom")

    base = cached()
    batches = make_batches(3)
    seen: list[int] = []

    def sink(output: DataFrame, _batch_id: int) -> None:
        seen.append(cached() - base)
        output.collect()

    with StatefulJob(spark, str(tmp_path / "ckpt"), "cache", max_parallelism=MAXP,
                     parallelism=2, local_dir=str(tmp_path / "local")) as job:
        job.run_batch(to_df(spark, next(batches)), totals, OUT, batch_id=0, order_by=["seq"],
                      sink=sink)
        assert seen == [1]  # the sink read the cached result ...
        assert cached() == base  # ... unpersisted once the checkpoint completed
        rows = next(batches)
        result = job.run_batch(to_df(spark, rows), totals, OUT, batch_id=1, order_by=["seq"])
        assert cached() == base + 1  # no sink: result.output stays cached
        assert len(outputs(result)) == len({r[0] for r in rows})
        with pytest.raises(Exception, match="boom"):
            job.run_batch(to_df(spark, next(batches)), fails, OUT, batch_id=2)
        assert cached() == base  # the failed batch's and batch 1's output released
        assert job.latest_checkpoint_id() == 1


def test_null_key_fails_the_batch_with_the_row(spark: SparkSession, tmp_path: Path) -> None:
    job = StatefulJob(spark, str(tmp_path / "ckpt"), "j", max_parallelism=MAXP, parallelism=2)
    df = spark.createDataFrame([("a", 1, 0), (None, 2, 1)], "key string, value long, seq long")
    with pytest.raises(Exception, match="null in key column 'key'") as info:
        job.run_batch(df, totals, OUT)
    assert '"value": 2' in str(info.value) or "MalformedInputError" in str(info.value)
    assert job.latest_checkpoint_id() is None
    assert issubclass(MalformedInputError, ValueError)
    job.close()


def test_vectorized_and_multi_column_keys(spark: SparkSession, tmp_path: Path) -> None:
    """The per-batch variant over pandas groups, keyed by two columns."""
    rows = [("a", 1, 5), ("a", 2, 6), ("b", 1, 7), ("a", 1, 8)]

    def per_task(groups: list[tuple[Any, Any]], states: Any) -> list[tuple[Any, ...]]:
        out = []
        for (k1, k2), pdf in groups:
            total = states.for_key((k1, k2)).value("total")
            total.update((total.get() or 0) + int(pdf["v"].sum()))
            out.append((k1, k2, total.get()))
        return out

    job = StatefulJob(spark, str(tmp_path / "ckpt"), "v", max_parallelism=MAXP, parallelism=2)
    schema = "k1 string, k2 long, total long"
    df = spark.createDataFrame(rows, "k1 string, k2 long, v long")
    for batch in range(2):
        res = job.run_batch(
            df, per_task, schema, key=["k1", "k2"], vectorized=True, input_format="pandas"
        )
        got = {(r.k1, r.k2): r.total for r in res.output.collect()}  # type: ignore[union-attr]
        expected = {("a", 1): 5 + 8, ("a", 2): 6, ("b", 1): 7}
        assert got == {k: v * (batch + 1) for k, v in expected.items()}
    job.close()


def test_foreach_batch_streaming_resumes(spark: SparkSession, tmp_path: Path) -> None:
    """Structured Streaming: checkpoint id = batch id, Spark's offsets inside the job dir,
    and a second query resumes and only processes new files."""
    src = tmp_path / "in"
    src.mkdir()
    ref = Reference()
    batches = list(make_batches(3, seed=11))
    sunk: dict[int, dict[str, tuple[int, int, list[int]]]] = {}

    def sink(df: DataFrame, n: int) -> None:
        sunk[n] = {r.key: (r["count"], r["sum"], list(r["last"])) for r in df.collect()}

    def run_query() -> None:
        job = StatefulJob(spark, str(tmp_path / "ckpt"), "s", max_parallelism=MAXP, parallelism=2)
        stream = (
            spark.readStream.schema("key string, value long, seq long")
            .option("maxFilesPerTrigger", 1)
            .json(str(src))
        )
        query = (
            stream.writeStream.foreachBatch(
                job.foreach_batch(totals, OUT, sink=sink, order_by=["seq"])
            )
            .option("checkpointLocation", job.spark_checkpoint_location)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert job.spark_checkpoint_location.startswith(str(tmp_path / "ckpt" / "s"))
        job.close()

    def write(i: int) -> None:
        lines = [json.dumps({"key": k, "value": v, "seq": s}) for k, v, s in batches[i]]
        (src / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")

    write(0)
    write(1)
    run_query()
    write(2)
    run_query()
    assert sorted(sunk) == [0, 1, 2]
    for i in range(3):
        assert sunk[i] == ref.apply(batches[i])
    assert (tmp_path / "ckpt" / "s" / layout.SPARK_DIR / "commits").is_dir()


def test_pipeline_on_s3(spark: SparkSession, s3_server: Any, tmp_path: Path) -> None:
    """Executors open the S3 job directory from the URI and options alone."""
    ref = Reference()
    root = f"s3://{s3_server.bucket}/spark-{random.getrandbits(32)}"
    job = StatefulJob(
        spark, root, "s3job", max_parallelism=MAXP, parallelism=2,
        storage_options=s3_server.options, local_dir=str(tmp_path / "local"),
    )
    for rows in make_batches(2, seed=5):
        assert outputs(job.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"])) == (
            ref.apply(rows)
        )
    job.close()
    storage = open_storage(root, **s3_server.options).child("s3job")
    assert storage.exists(layout.checkpoint_metadata_key(1))
    assert stored_state(storage) == ref.state


def _keep_last(key: Any, rows: list[Any], state: KeyedState) -> list[tuple[Any, ...]]:
    state.value("last").update(rows[-1]["payload"])
    return [(key, len(rows))]


def test_compactions_finish_after_the_tasks(spark: SparkSession, tmp_path: Path) -> None:
    """Every batch rewrites every key, so past `RUNS_TRIGGER` checkpoints RocksDB merges
    runs of the whole state: the snapshot does not wait, a thread of the Python worker
    finishes the merge after the task and keeps it as a local snapshot equivalent to the
    checkpoint, which a later task opens. The stored state stays exact, and checkpoints
    do not pile up runs."""
    rng = random.Random(5)
    local = tmp_path / "local"
    job = StatefulJob(spark, str(tmp_path / "ckpt"), "last", max_parallelism=MAXP,
                      parallelism=2, local_dir=str(local))
    last: dict[str, str] = {}
    compacted = 0
    for _ in range(RUNS_TRIGGER + 4):
        rows = [(f"k{i}", rng.randbytes(150).hex()) for i in range(3000)]
        last.update(rows)
        df = spark.createDataFrame(rows, "key string, payload string")
        result = job.run_batch(df, _keep_last, "key string, n long")
        assert result.rows_in == len(rows)
        compacted += result.compacted_restores
    job.close()
    assert compacted >= 1, "no task opened a copy compacted after the previous batch"
    stored = stored_state(open_storage(str(tmp_path / "ckpt")).child("last"))
    assert {k: v["last"] for k, v in stored.items()} == last
    meta = read_metadata(job.storage, layout.checkpoint_metadata_key(RUNS_TRIGGER + 3))
    for kgs in meta.operators[0].ranges:
        assert sum(1 for f in kgs.files if (f.name or "").endswith(".sst")) <= 2 * RUNS_TRIGGER
