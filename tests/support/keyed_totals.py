"""A keyed running-totals step for the Spark pipeline tests (count, sum and the last eight
values per key), its plain-Python reference, deterministic batches of rows, and the
newest checkpoint's state read back through the backend, independently of Spark."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from statehold.backend.rocks import TaskStateBackend, sources_from_metadata
from statehold.format import layout
from statehold.format.metadata import KeyGroupRange, read_metadata
from statehold.spark import BatchResult, KeyedState
from statehold.storage import Storage

MAXP = 16
OUT = "key string, count long, sum long, last array<long>"


def totals(key: str, rows: list[dict[str, Any]], state: KeyedState) -> list[tuple[Any, ...]]:
    count, total, last = state.value("count"), state.value("sum"), state.list("last")
    values = [r["value"] for r in rows]
    n, s = (count.get() or 0) + len(values), (total.get() or 0) + sum(values)
    count.update(n)
    total.update(s)
    last.update((last.get() + values)[-8:])
    return [(key, n, s, last.get())]


class Reference:
    """The same aggregation in plain Python."""

    def __init__(self) -> None:
        self.state: dict[str, dict[str, Any]] = {}

    def apply(self, rows: list[tuple[str, int, int]]) -> dict[str, tuple[int, int, list[int]]]:
        touched: dict[str, tuple[int, int, list[int]]] = {}
        for key, value, _seq in sorted(rows, key=lambda r: r[2]):
            st = self.state.setdefault(key, {"count": 0, "sum": 0, "last": []})
            st["count"] += 1
            st["sum"] += value
            st["last"] = (st["last"] + [value])[-8:]
            touched[key] = (st["count"], st["sum"], list(st["last"]))
        return touched


def make_batches(n: int, seed: int = 7) -> Iterator[list[tuple[str, int, int]]]:
    rng = random.Random(seed)
    seq = 0
    for _ in range(n):
        rows = []
        for _ in range(60):
            rows.append((f"k{rng.randrange(25)}", rng.randrange(-50, 100), seq))
            seq += 1
        yield rows


def to_df(spark: SparkSession, rows: list[tuple[str, int, int]]) -> DataFrame:
    return spark.createDataFrame(rows, "key string, value long, seq long").repartition(3)


def outputs(result: BatchResult) -> dict[str, tuple[int, int, list[int]]]:
    assert result.output is not None
    got = {}
    for row in result.output.collect():
        assert row.key not in got, f"key {row.key} output twice"
        got[row.key] = (row["count"], row["sum"], list(row["last"]))
    return got


def stored_state(storage: Storage, operator: str = "state") -> dict[str, dict[str, Any]]:
    """Read the newest checkpoint's state back through the backend (one task, all key
    groups), independently of Spark."""
    chk = max(
        layout.parse(f.key).checkpoint_id or 0
        for f in storage.list()
        if layout.parse(f.key).kind is layout.Kind.CHECKPOINT_METADATA
    )
    key = layout.checkpoint_metadata_key(chk)
    meta = read_metadata(storage, key)
    sources = sources_from_metadata(storage, key, meta, operator)
    with TaskStateBackend.open(
        Path(tempfile.mkdtemp(prefix="statehold-reader-")),
        operator,
        KeyGroupRange(start=0, end=MAXP - 1),
        MAXP,
        sources,
    ) as backend:
        return {str(k): v for k, v in backend.items()}
