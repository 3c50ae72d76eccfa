"""Spark's own streaming queries over a file source, the reference the parity tests compare
statehold with: input files that Spark and statehold take in the same order, a session on
Spark's RocksDB state store provider, and a query run until it read every file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def write_batch(directory: Path, index: int, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{index:05d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Spark's file source takes files in modification-time order, statehold's in name order
    os.utime(tmp, (1_600_000_000 + index, 1_600_000_000 + index))
    os.replace(tmp, directory / f"{index:05d}.jsonl")


def rocksdb_session(spark: Any) -> Any:
    session = spark.newSession()
    session.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER)
    session.conf.set("spark.sql.shuffle.partitions", "1")  # fewer Python workers to start
    return session


def run_query(out: Any, work: Path, name: str, files: int | None = None) -> None:
    """Run the query over the files present, then stop it. With `files`, stop once the
    batch that read the last of them is committed: in timeMode ProcessingTime Spark keeps
    running batches without data, so ``availableNow`` never ends."""
    writer = (
        out.writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .outputMode("append")
        .queryName(f"parity_{name}_{work.name}")
    )
    if files is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.start()
        try:
            while not _committed(work / "checkpoint", files - 1) and query.exception() is None:
                time.sleep(0.2)
        finally:
            query.stop()
    if query.exception() is not None:
        raise AssertionError(f"Spark's {name} query failed: {query.exception()}")


def _committed(checkpoint: Path, log_offset: int) -> bool:
    """Whether a committed batch read the file source up to `log_offset`."""
    commits = checkpoint / "commits"
    done = [n for n in os.listdir(commits) if n.isdigit()] if commits.is_dir() else []
    for n in sorted(done, key=int):
        lines = (checkpoint / "offsets" / n).read_text().splitlines()
        if lines and json.loads(lines[-1]).get("logOffset", -1) >= log_offset:
            return True
    return False
