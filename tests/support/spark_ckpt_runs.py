"""Small real Structured Streaming queries for the savepoint, rollback and relocation
tests: a windowed aggregation with a watermark, dropDuplicates and a stream-stream join,
over JSON files taken one per batch, on each state store provider, writing every batch's
rows to ``<output>/<batch id>.json`` (a rerun of a batch overwrites its file), so two
runs' outputs compare exactly."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
PROVIDERS: dict[str, dict[str, str]] = {
    "hdfs": {"spark.sql.streaming.stateStore.providerClass": HDFS},
    "rocksdb": {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, _CHANGELOG: "false"},
    "rocksdb_changelog": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        _CHANGELOG: "true",
    },
    "rocksdb_v2": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        _CHANGELOG: "true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
    },
}
SCHEMA = "k STRING, ts TIMESTAMP, v LONG"
SIDES = ("a", "b")


def write_inputs(inputs: Path, first: int, count: int) -> None:
    """Files first..first+count-1 of both sides (the join reads side b too)."""
    for side in SIDES:
        directory = inputs / side
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(first, first + count):
            rows = []
            for j in range(6):
                v = i * 10 + j - (7 if side == "b" else 0)
                rows.append({"k": f"k{v % 3}", "ts": 1_700_000_000 + i * 6 + j, "v": v})
            tmp = directory / f".{i:05d}.tmp"
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(tmp, (1_600_000_000 + i, 1_600_000_000 + i))
            os.replace(tmp, directory / f"{i:05d}.json")


def _read(session: Any, inputs: Path, side: str) -> Any:
    return (
        session.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs / side))
    )


def _window(session: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as f

    events = _read(session, inputs, "a").withWatermark("ts", "10 seconds")
    counts = events.groupBy(f.window("ts", "10 seconds"), "k").agg(
        f.count("*").alias("n"), f.sum("v").alias("total")
    )
    return counts.select(f.col("window.start").cast("string").alias("start"), "k", "n", "total")


def _dedup(session: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as f

    events = _read(session, inputs, "a")
    both = events.select("k", (f.col("v") % 17).alias("v"))
    return both.dropDuplicates(["k", "v"])


def _join(session: Any, inputs: Path) -> Any:
    left = _read(session, inputs, "a").selectExpr("k", "v", "ts AS left_ts")
    right = _read(session, inputs, "b").selectExpr("k AS rk", "v AS rv", "ts AS right_ts")
    joined = left.join(right, (left.k == right.rk) & (left.v == right.rv))
    return joined.selectExpr(
        "k", "v", "cast(left_ts AS string) AS lt", "cast(right_ts AS string) AS rt"
    )


QUERIES: dict[str, Callable[[Any, Path], Any]] = {
    "window": _window,
    "dedup": _dedup,
    "join": _join,
}


def session_for(spark: Any, provider: str, **conf: str) -> Any:
    session = spark.newSession()
    session.conf.set("spark.sql.shuffle.partitions", "2")
    for key, value in {**PROVIDERS[provider], **conf}.items():
        session.conf.set(key, value)
    return session


def run_query(
    spark: Any,
    query: str,
    provider: str,
    checkpoint: Path | str,
    inputs: Path,
    output: Path,
    **conf: str,
) -> None:
    """Run `query` over every input file present (one per batch), then stop."""
    output.mkdir(parents=True, exist_ok=True)
    session = session_for(spark, provider, **conf)

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted(r[0] for r in batch.selectExpr("to_json(struct(*))").collect())
        tmp = output / f".{batch_id}.tmp"
        tmp.write_text("".join(r + "\n" for r in rows))
        os.replace(tmp, output / f"{batch_id}.json")

    stream = (
        QUERIES[query](session, inputs)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    if stream.exception() is not None:
        raise AssertionError(f"the {query} query failed: {stream.exception()}")


def read_output(output: Path) -> dict[int, list[str]]:
    """Batch id -> its rows (sorted JSON lines)."""
    return {
        int(p.stem): p.read_text().splitlines()
        for p in output.iterdir()
        if p.suffix == ".json" and p.stem.isdigit()
    }


def all_rows(output: Path) -> list[str]:
    return sorted(r for rows in read_output(output).values() for r in rows)
