"""The keyed running-aggregation workload both systems run, and what a run reports.

Input: one Parquet file per micro-batch, the same files for every system. Batch 0 holds
every key once (the initial load); batch i >= 1 holds `fraction` of the keys, each once,
chosen at random, so exactly that share of the state changes per batch. A row is
``(key: string, value: int64, payload: string of value_size random ASCII bytes)``; the
state per key is ``(count, sum, last payload)``, the output per batch ``(key, count, sum)``
of the keys it touched.

Both systems read the files through the same Structured Streaming file source, one file
per trigger (`feed`), so the source's cost is the same on both sides.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

INPUT_SCHEMA = pa.schema(
    [("key", pa.string()), ("value", pa.int64()), ("payload", pa.string())]
)
INPUT_DDL = "key STRING, value BIGINT, payload STRING"
OUTPUT_DDL = "key STRING, count BIGINT, sum BIGINT"


@dataclass(frozen=True)
class Workload:
    keys: int
    fraction: float
    batches: int  # batches after the initial load
    value_size: int
    seed: int = 7

    def key_name(self, i: int) -> str:
        return f"k{i:09d}"

    def rows_in(self, batch: int) -> int:
        return self.keys if batch == 0 else max(1, round(self.keys * self.fraction))

    def changed_bytes(self, batch: int) -> int:
        """Key + value bytes a batch changes: the least a checkpoint must persist
        (key, two 8-byte numbers, the payload)."""
        return self.rows_in(batch) * (len(self.key_name(0)) + 16 + self.value_size)

    def live_state_bytes(self) -> int:
        return self.changed_bytes(0)


def _payloads(rng: np.random.Generator, n: int, size: int) -> pa.Array:
    """n random printable-ASCII strings of `size` bytes (random, so compression cannot
    make the state look smaller than it is)."""
    if size == 0:
        return pa.array([""] * n, pa.string())
    raw = rng.integers(33, 127, size=n * size, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(raw))


def write_inputs(w: Workload, directory: Path) -> list[Path]:
    """One Parquet file per batch: 0 = the load, 1..batches, and one more (batches + 1)
    for the recovery measurement. Reused if already written for `w`."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / "workload.txt"
    files = [directory / f"batch-{b:05d}.parquet" for b in range(w.batches + 2)]
    if stamp.exists() and stamp.read_text() == repr(w) and all(f.exists() for f in files):
        return files
    rng = np.random.default_rng(w.seed)
    names = np.array([w.key_name(i) for i in range(w.keys)], dtype=object)
    for b, path in enumerate(files):
        n = w.rows_in(b)
        idx = np.arange(w.keys) if b == 0 else rng.choice(w.keys, size=n, replace=False)
        rng.shuffle(idx)
        table = pa.table(
            {
                "key": pa.array(names[idx], pa.string()),
                "value": pa.array(rng.integers(0, 1000, size=n), pa.int64()),
                "payload": _payloads(rng, n, w.value_size),
            },
            schema=INPUT_SCHEMA,
        )
        pq.write_table(table, path, compression="snappy")
    stamp.write_text(repr(w))
    return files


def expected_totals(files: list[Path], upto: int) -> tuple[int, int, int]:
    """(distinct keys, sum of counts, sum of values) after batches 0..upto: what the
    state of a correct run holds."""
    keys: set[str] = set()
    count = total = 0
    for f in files[: upto + 1]:
        t = pq.read_table(f, columns=["key", "value"])
        keys.update(t.column("key").to_pylist())
        count += t.num_rows
        total += int(pa.compute.sum(t.column("value")).as_py())
    return len(keys), count, total


# -- what a run reports -----------------------------------------------------------------


@dataclass
class BatchStats:
    batch: int
    events: int
    #: the whole micro-batch (Spark's triggerExecution)
    seconds: float
    #: the checkpoint's own work: state commits summed over tasks + the system's own
    #: driver-side commit (not Spark's offset and commit logs, which both systems write)
    checkpoint_seconds: float
    #: bytes and files new in the checkpoint location after this batch (by listing)
    bytes_uploaded: int
    files_uploaded: int
    #: the whole checkpoint location right after this batch (cleanup may lag behind)
    footprint_bytes: int = 0
    footprint_files: int = 0
    #: system-specific numbers for cross-checks (e.g. Spark's RocksDB custom metrics)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    system: str
    batches: list[BatchStats] = field(default_factory=list)
    footprint_bytes: int = 0
    footprint_files: int = 0
    recovery_seconds: float = float("nan")
    #: (distinct keys, sum of counts, sum of values) read back from the stored state
    totals: tuple[int, int, int] | None = None
    notes: list[str] = field(default_factory=list)

    def steady(self) -> list[BatchStats]:
        """Batches after the initial load."""
        return [b for b in self.batches if b.batch > 0]

    def median(self, attr: str) -> float:
        return float(statistics.median(float(getattr(b, attr)) for b in self.steady()))

    def p95(self, attr: str) -> float:
        values = sorted(float(getattr(b, attr)) for b in self.steady())
        return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]

    def mean(self, attr: str) -> float:
        return float(statistics.mean(float(getattr(b, attr)) for b in self.steady()))

    def throughput(self) -> float:
        steady = self.steady()
        return sum(b.events for b in steady) / sum(b.seconds for b in steady)


# -- listing a checkpoint location ------------------------------------------------------


def listing(root: Path) -> dict[str, int]:
    """Every file under `root` with its size (the location's storage footprint)."""
    out: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with contextlib.suppress(FileNotFoundError):  # deleted while we walk
                out[os.path.relpath(p, root)] = os.stat(p).st_size
    return out


def new_bytes(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """(bytes, files) written between two listings: new paths, or paths whose size
    changed (rewritten)."""
    changed = [p for p, s in after.items() if before.get(p) != s]
    return sum(after[p] for p in changed), len(changed)


# -- feeding a streaming query one file per trigger -------------------------------------


def feed(
    query: Any,
    files: list[Path],
    source_dir: Path,
    on_batch: Callable[[int, dict[str, Any]], None],
    *,
    first_batch_id: int = 0,
    timeout: float = 3600.0,
) -> None:
    """Put the input files into the query's source directory one at a time (the query
    reads one file per trigger), each time waiting until the query has processed it, and
    call ``on_batch(index, progress)`` with that trigger's progress.

    A file is copied under a hidden temporary name and renamed, so the source never sees
    it half written."""
    for i, f in enumerate(files):
        tmp = source_dir / f".{f.name}.tmp"
        shutil.copyfile(f, tmp)
        os.replace(tmp, source_dir / f.name)
        on_batch(i, wait_for_batch(query, first_batch_id + i, time.monotonic() + timeout))


def wait_for_batch(query: Any, batch_id: int, deadline: float) -> dict[str, Any]:
    """The progress of trigger `batch_id`."""
    while time.monotonic() < deadline:
        query.processAllAvailable()
        for p in reversed(query.recentProgress):
            if p["batchId"] == batch_id and p["numInputRows"] > 0:
                return dict(p)
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        time.sleep(0.05)
    raise TimeoutError(f"batch {batch_id} was not processed in time")


def make_session(partitions: int, driver_memory: str = "8g") -> Any:
    """One local Spark session for every system of a run: local[cores], `partitions`
    shuffle partitions (= statehold's parallelism), Python workers on this interpreter
    with bench/ importable (functions defined here are pickled by reference)."""
    from statehold.spark.session import use_this_python

    use_this_python()
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(f"local[{os.cpu_count() or 2}]")
        .appName("statehold-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        # Spark deletes old state versions in a background maintenance task; run it often
        # enough that retention shows within a bench run (default 60 s).
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "5s")
        # Spark keeps 100 batches of its offset and commit logs by default; keep what
        # statehold keeps (the Spark runs set the same per query, with their state).
        .config("spark.sql.streaming.minBatchesToRetain", "3")
        .getOrCreate()
    )
