"""Spark's own state store (RocksDBStateStoreProvider) running the bench workload.

One query: file source (one file per trigger) -> groupBy(key) -> a Python stateful
function keeping (count, sum, last payload) per key -> noop sink, output mode update. The
state API is either ``applyInPandasWithState`` (GroupState, API v1) or
``transformWithStateInPandas`` (StatefulProcessor with one ValueState, API v2).

What a run measures, per batch: Spark's own progress (trigger duration, the state
operator's commit time summed over tasks, its RocksDB custom metrics) and the bytes new in
the checkpoint location by listing it before and after the batch.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from _workload import (
    INPUT_DDL,
    OUTPUT_DDL,
    BatchStats,
    RunResult,
    Workload,
    feed,
    listing,
    new_bytes,
    wait_for_batch,
)
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

try:  # PySpark 4.0+; on 3.5 only the applyInPandasWithState baseline runs
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
    )
except ImportError:
    StatefulProcessor = object  # type: ignore[assignment,misc]

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
APIS = ("applyInPandasWithState", "transformWithStateInPandas")
STATE_DDL = "count BIGINT, sum BIGINT, payload STRING"
#: the ValueState's name under transformWithStateInPandas (the state reader needs it)
TWS_STATE_NAME = "agg"

Log = Callable[[str], None]


# -- the stateful functions (module level: workers import them by name) -------------------


def _update_v1(
    key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState: fold this batch's rows of one key into its state."""
    count, total, payload = state.get if state.exists else (0, 0, "")
    for pdf in pdfs:
        if len(pdf):
            count += len(pdf)
            total += int(pdf["value"].sum())
            payload = str(pdf["payload"].iloc[-1])
    state.update((count, total, payload))
    yield pd.DataFrame({"key": [key[0]], "count": [count], "sum": [total]})


class _Aggregate(StatefulProcessor):
    """transformWithStateInPandas: the same fold, state in one ValueState per key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState(TWS_STATE_NAME, STATE_DDL)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        old = self.state.get()
        count, total, payload = (int(old[0]), int(old[1]), str(old[2])) if old else (0, 0, "")
        for pdf in rows:
            if len(pdf):
                count += len(pdf)
                total += int(pdf["value"].sum())
                payload = str(pdf["payload"].iloc[-1])
        self.state.update((count, total, payload))
        yield pd.DataFrame({"key": [key[0]], "count": [count], "sum": [total]})

    def close(self) -> None:
        pass


# -- the run --------------------------------------------------------------------------------


def run_spark_native(
    spark: Any,
    w: Workload,
    files: list[Path],
    work: Path,
    *,
    api: str,
    changelog: bool,
    retain: int,
    partitions: int,
    log: Log = print,
) -> RunResult:
    """Run the workload through Spark's RocksDB state store in a fresh session.

    `files` are `write_inputs`' files: 0..w.batches are fed one per trigger, the last one
    (w.batches + 1) is the first batch after the restart. `work` is emptied and holds the
    source directory and the checkpoint location. Raises NotImplementedError if `api`
    cannot run here (the message says why)."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, not {api!r}")
    if api == "transformWithStateInPandas":
        _check_tws()
    if len(files) < w.batches + 2:
        raise ValueError(f"need {w.batches + 2} input files, got {len(files)}")
    session = spark.newSession()
    confs = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(
            changelog
        ).lower(),
        "spark.sql.streaming.minBatchesToRetain": str(retain),
        "spark.sql.shuffle.partitions": str(partitions),
    }
    for k, v in confs.items():
        session.conf.set(k, v)
    short = "tws" if api == "transformWithStateInPandas" else "apiws"
    name = f"spark-{short}-{'changelog' if changelog else 'snapshot'}"
    result = RunResult(system=name)
    result.notes.append(
        f"{api}, RocksDB provider, changelog={changelog}, minBatchesToRetain={retain}, "
        f"partitions={partitions}"
    )

    shutil.rmtree(work, ignore_errors=True)
    source, checkpoint = work / "source", work / "checkpoint"
    source.mkdir(parents=True)

    query = _start(session, api, source, checkpoint)
    try:
        before = listing(checkpoint)

        def on_batch(i: int, progress: dict[str, Any]) -> None:
            nonlocal before
            after = listing(checkpoint)
            stats = _stats(i, progress, before, after)
            before = after
            stats.footprint_bytes, stats.footprint_files = sum(after.values()), len(after)
            result.batches.append(stats)
            log(
                f"{name} batch {i}: {stats.events} rows, {stats.seconds:.2f}s, "
                f"commit {stats.checkpoint_seconds:.2f}s, "
                f"{stats.bytes_uploaded / 1e6:.2f} MB in {stats.files_uploaded} files"
            )

        feed(query, files[: w.batches + 1], source, on_batch)

        # Old versions are deleted by the executors' background maintenance task; give it
        # two rounds before measuring what retention leaves behind.
        interval = _seconds(session.conf.get("spark.sql.streaming.stateStore.maintenanceInterval"))
        time.sleep(2 * interval + 1)
        footprint = listing(checkpoint)
        late_bytes, late_files = new_bytes(before, footprint)
        result.notes.append(
            f"written after the last batch (background snapshot uploads): "
            f"{late_bytes / 1e6:.2f} MB in {late_files} files"
        )
        result.footprint_bytes = sum(footprint.values())
        result.footprint_files = len(footprint)
        state = {p: s for p, s in footprint.items() if p.startswith("state" + os.sep)}
        result.notes.append(
            f"footprint {result.footprint_bytes / 1e6:.2f} MB in {result.footprint_files} "
            f"files, of which state/ {sum(state.values()) / 1e6:.2f} MB in {len(state)} files"
        )
        log(f"{name}: {result.notes[-1]}")
    finally:
        query.stop()

    # Recovery: the recovery batch's file is put in the source while the query is down,
    # then the clock runs from just before start() until that batch's progress exists.
    # This includes: planning and starting a new query run on the same checkpoint (reading
    # its offset/commit logs and the source's file log), and in the first batch every
    # task's state store load -- a new run id means new providers, so each RocksDB
    # instance is rebuilt from the checkpoint location (latest snapshot copied to the
    # executor's local dir, plus replaying changelog files with changelog checkpointing),
    # then the batch itself and its commit. Same JVM and warm Python workers: no executor
    # or worker start-up is included.
    recovery_file = files[w.batches + 1]
    tmp = source / f".{recovery_file.name}.tmp"
    shutil.copyfile(recovery_file, tmp)
    os.replace(tmp, source / recovery_file.name)
    t0 = time.monotonic()
    query = _start(session, api, source, checkpoint)
    try:
        progress = wait_for_batch(query, w.batches + 1, time.monotonic() + 3600.0)
        result.recovery_seconds = time.monotonic() - t0
        stats = _stats(w.batches + 1, progress, {}, {})
        log(
            f"{name}: recovery {result.recovery_seconds:.2f}s "
            f"(its batch {stats.seconds:.2f}s, commit {stats.checkpoint_seconds:.2f}s)"
        )
        result.notes.append(
            f"recovery batch: trigger {stats.seconds:.2f}s, commit "
            f"{stats.checkpoint_seconds:.2f}s, load/replay metrics {_load_metrics(progress)}"
        )
    finally:
        query.stop()

    try:
        result.totals = _read_totals(session, api, checkpoint)
        log(f"{name}: totals from the state reader {result.totals}")
    except Exception as e:  # the reader's failure is a finding, not a crash of the bench
        result.notes.append(f"state reader failed for {api}: {type(e).__name__}: {e}"[:500])
        log(f"{name}: {result.notes[-1]}")
    return result


def _check_tws() -> None:
    """transformWithStateInPandas talks to the JVM's state server in protobuf messages
    generated for protobuf 6.33.5; without the package its Python runner crashes at the
    first batch (STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE), so refuse up front."""
    try:
        from pyspark.sql.streaming.proto import StateMessage_pb2  # noqa: F401
    except ImportError as e:
        raise NotImplementedError(
            "transformWithStateInPandas needs the 'protobuf' package (>= 6.33.5, which "
            f"pyspark {_pyspark_version()} does not install): {e}"
        ) from e


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _start(session: Any, api: str, source: Path, checkpoint: Path) -> Any:
    """The streaming query, started (one file per trigger, noop sink)."""
    rows = (
        session.readStream.schema(INPUT_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    grouped = rows.groupBy("key")
    if api == "applyInPandasWithState":
        out = grouped.applyInPandasWithState(
            _update_v1, OUTPUT_DDL, STATE_DDL, "update", GroupStateTimeout.NoTimeout
        )
    else:
        try:
            out = grouped.transformWithStateInPandas(
                statefulProcessor=_Aggregate(),
                outputStructType=OUTPUT_DDL,
                outputMode="Update",
                timeMode="None",
            )
        except Exception as e:
            raise NotImplementedError(
                f"transformWithStateInPandas does not run here: {type(e).__name__}: {e}"
            ) from e
    try:
        return (
            out.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    except Exception as e:
        if api == "transformWithStateInPandas":
            raise NotImplementedError(
                f"transformWithStateInPandas does not start here: {type(e).__name__}: {e}"
            ) from e
        raise


def _stats(
    i: int, progress: dict[str, Any], before: dict[str, int], after: dict[str, int]
) -> BatchStats:
    """One batch's numbers from its progress and the listings around it."""
    ops = progress.get("stateOperators") or []
    op = ops[0] if ops else {}
    nbytes, nfiles = new_bytes(before, after)
    state_bytes, state_files = new_bytes(
        {p: s for p, s in before.items() if p.startswith("state" + os.sep)},
        {p: s for p, s in after.items() if p.startswith("state" + os.sep)},
    )
    extra: dict[str, float] = {
        "state_bytes_uploaded": float(state_bytes),
        "state_files_uploaded": float(state_files),
        "numRowsTotal": float(op.get("numRowsTotal", 0)),
        "numRowsUpdated": float(op.get("numRowsUpdated", 0)),
        "memoryUsedBytes": float(op.get("memoryUsedBytes", 0)),
    }
    for k, v in (op.get("customMetrics") or {}).items():
        extra[k] = float(v)
    for k, v in (progress.get("durationMs") or {}).items():
        extra[f"durationMs.{k}"] = float(v)
    return BatchStats(
        batch=i,
        events=int(progress["numInputRows"]),
        seconds=progress["durationMs"]["triggerExecution"] / 1000.0,
        # Spark's commitTimeMs is a timing SQLMetric: each task adds its own commit time,
        # so this is the sum over the state partitions, not wall time.
        checkpoint_seconds=op.get("commitTimeMs", 0) / 1000.0,
        bytes_uploaded=nbytes,
        files_uploaded=nfiles,
        extra=extra,
    )


def _load_metrics(progress: dict[str, Any]) -> dict[str, Any]:
    """The RocksDB metrics of a batch that say what its state load cost."""
    ops = progress.get("stateOperators") or [{}]
    custom = ops[0].get("customMetrics") or {}
    wanted = ("rocksdbLoadedFromSnapshot", "rocksdbReplayChangeLogTimeMs", "rocksdbFilesCopied")
    return {k: v for k, v in custom.items() if k.startswith(wanted) or "Load" in k}


def _read_totals(session: Any, api: str, checkpoint: Path) -> tuple[int, int, int]:
    """(distinct keys, sum of counts, sum of values) from Spark's state data source."""
    from pyspark.sql import functions as F

    reader = session.read.format("statestore")
    if api == "transformWithStateInPandas":
        reader = reader.option("stateVarName", TWS_STATE_NAME)
    df = reader.load(str(checkpoint))
    value = df.schema["value"].dataType
    # applyInPandasWithState nests the user state as value.groupState; transformWithState's
    # ValueState is the value itself.
    prefix = "value.groupState" if "groupState" in value.fieldNames() else "value"
    fields = (
        value["groupState"].dataType.fieldNames() if prefix != "value" else value.fieldNames()
    )
    if "count" not in fields or "sum" not in fields:
        raise ValueError(f"unexpected state value schema: {value.simpleString()}")
    row = df.agg(
        F.countDistinct("key.key").alias("keys"),
        F.sum(f"{prefix}.count").alias("count"),
        F.sum(f"{prefix}.sum").alias("sum"),
    ).first()
    return int(row["keys"] or 0), int(row["count"] or 0), int(row["sum"] or 0)


def _seconds(duration: str) -> float:
    """A Spark duration string ('5s', '60000ms', '1m', '5') in seconds."""
    d = duration.strip().lower()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if d.endswith(suffix) and d[: -len(suffix)].strip().replace(".", "", 1).isdigit():
            return float(d[: -len(suffix)]) * scale
    value = float(d) / 1000.0  # Spark's default unit for this conf is ms
    return value if math.isfinite(value) else 60.0
