"""Repartition and transform against Spark itself: statehold's Murmur3 (spark_hash)
equals Spark's ``pmod(hash(...), M)`` on many typed values in one query; a join's
HDFS-backed and RocksDB (changelog on) locations, repartitioned from 2 to 5 partitions at
an early batch and restarted by Spark side by side with the rest of their input, write the
rows of the run that never stopped (a key put in the wrong partition loses its matches, so
the output would differ); a session window on RocksDB (keys laid out for prefix scans)
and HDFS-backed, repartitioned 2 -> 5 (and 5 -> 3) and restarted, likewise;
transformWithState's list, map and value state, with and without a TTL (every column
family Spark writes for them), read against Spark's readers, repartitioned and restarted;
and transformed state (keys deleted, a schema migrated) restarted by Spark writes what the
changed state implies. The Spark-free checks of every
fixture are in test_spark_repartition.py and test_spark_transform.py."""

from __future__ import annotations

import datetime
import json
import math
import shutil
from collections import Counter
from collections.abc import Callable
from decimal import Decimal as D
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.spark_hash import partition_of, spark_hash
from statehold.spark_checkpoints.spark_types import (
    Array,
    Atomic,
    Decimal,
    Field,
    SparkType,
    Struct,
)
from tests.spark_checkpoints.test_spark_savepoint import copy_output
from tests.spark_checkpoints.test_spark_state_parity import frozen
from tests.support.spark_locations.committed_fixtures import rows, running
from tests.support.spark_locations.disk_trees import restartable_batches

pytestmark = pytest.mark.spark

_UTC = datetime.UTC
#: (column, Spark SQL type, statehold type, values): nulls, extremes, -0.0 and NaN,
#: non-ASCII and empty strings, strings whose length is not a multiple of 4, decimals
#: stored as a long and as bytes (negative too), dates and timestamps before 1970.
_COLUMNS: list[tuple[str, str, SparkType, list[Any]]] = [
    ("b", "boolean", Atomic("boolean"), [True, False, None]),
    ("y", "tinyint", Atomic("byte"), [-128, 127, 0]),
    ("h", "smallint", Atomic("short"), [-32768, 32767, -1]),
    ("i", "int", Atomic("integer"), [0, -1, 2**31 - 1, -(2**31), 42, None]),
    ("l", "bigint", Atomic("long"), [0, -1, 2**63 - 1, -(2**63), 1_700_000_000_000]),
    ("f", "float", Atomic("float"), [0.0, -0.0, 1.5, -3.25, math.nan, math.inf]),
    ("d", "double", Atomic("double"), [0.0, -0.0, 1e300, -2.5, math.nan, -math.inf]),
    ("s", "string", Atomic("string"),
     ["", "a", "ab", "abc", "abcd", "abcde", "héllo", "日本語テキスト", "k0", "🙂x", None]),
    ("bin", "binary", Atomic("binary"), [b"", b"\x00", b"\xff\xfe\xfd", b"12345"]),
    ("ds", "decimal(10,2)", Decimal(10, 2), [D("0.00"), D("-12345678.90"), D("3.14")]),
    ("db", "decimal(38,6)", Decimal(38, 6),
     [D("0.000000"), D("-1.000000"), D("12345678901234567890123456789012.123456"),
      D("-0.000128"), D("170141183460469231731687303.715884")]),
    ("dt", "date", Atomic("date"),
     [datetime.date(2024, 2, 29), datetime.date(1960, 1, 1), datetime.date(1970, 1, 1)]),
    ("ts", "timestamp", Atomic("timestamp"),
     [datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=_UTC),
      datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=_UTC)]),
]
_STRUCT = Struct((Field("start", Atomic("timestamp")), Field("key", Atomic("string"))))
_ARRAY = Array(Atomic("integer"))
PARTITIONS = (1, 5, 200)


def _rows(count: int) -> list[tuple[Any, ...]]:
    """`count` rows mixing every column's values (each value of each column at least once)."""
    out = []
    for r in range(count):
        row = [values[(r * (k + 3) + k) % len(values)] for k, (*_x, values) in enumerate(_COLUMNS)]
        out.append(tuple(row))
    return out


def _ours(row: Any, name: str, t: SparkType) -> Any:
    """A column's value as statehold's decoder gives it: dates in days and timestamps in
    microseconds (Spark's own, selected beside the column: Python's would be local times)."""
    if t in (Atomic("date"), Atomic("timestamp")):
        return row[f"{name}_raw"]
    return row[name]


def test_murmur3_and_pmod_equal_sparks(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows_ = _rows(60)
    schema = ", ".join(f"{name} {sql}" for name, sql, _t, _v in _COLUMNS)
    df = spark.createDataFrame(rows_, schema)
    names = [c[0] for c in _COLUMNS]
    df = df.withColumn("st", F.struct(F.col("ts").alias("start"), F.col("s").alias("key")))
    df = df.withColumn("arr", F.array(F.col("i"), F.lit(7), F.lit(None).cast("int")))
    hashed = [F.hash(F.col(n)).alias(f"h_{n}") for n in [*names, "st", "arr"]]
    together = [F.pmod(F.hash(*[F.col(n) for n in [*names, "st"]]), F.lit(m)).alias(f"p{m}")
                for m in PARTITIONS]
    raw = [F.unix_date("dt").alias("dt_raw"), F.unix_micros("ts").alias("ts_raw"),
           F.unix_micros("st.start").alias("st_raw")]
    got = df.select(*names, "st", "arr", *raw, *hashed, *together,
                    F.hash(F.col("st"), F.col("i")).alias("h_st_i")).collect()

    types = [t for _n, _s, t, _v in _COLUMNS]
    assert len(got) == len(rows_)
    for row in got:
        values = [_ours(row, n, t) for n, t in zip(names, types, strict=True)]
        st = (row["st_raw"], row["st"]["key"])
        arr = list(row["arr"])
        for n, t, v in zip(names, types, values, strict=True):
            assert spark_hash([v], [t]) == row[f"h_{n}"], (n, v)
        assert spark_hash([st], [_STRUCT]) == row["h_st"]
        assert spark_hash([arr], [_ARRAY]) == row["h_arr"]
        # a struct hashes as its fields in order (a window key's struct, then the key)
        assert spark_hash([st, values[3]], [_STRUCT, Atomic("integer")]) == row["h_st_i"]
        for m in PARTITIONS:
            assert partition_of([*values, st], [*types, _STRUCT], m) == row[f"p{m}"]


def test_a_join_repartitioned_2_to_5_restarts_with_the_uninterrupted_output(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """The join's HDFS-backed, RocksDB (changelog checkpointing on) and checkpoint format
    v2 locations, each repartitioned 2 -> 5 at its oldest restartable batch, restarted side
    by side in one run: Spark loads the snapshots statehold wrote (RocksDB's: the zip, its
    SSTs and RocksDB's MANIFEST, in its own rocksdbjni; v2's by the new ids ``commits/N``
    names), runs the rest of the input with 5 partitions and writes the uninterrupted
    run's rows; its state at the end is the uninterrupted run's, read offline.

    In the same run, the RocksDB location (changelog off) with a join key deleted from
    both sides at k (`delete_keys`: its counts and buffered rows): restarted, the rows of
    that key arriving after k find none of its rows from before to match, every other
    pair is written as the uninterrupted run writes it."""
    from tests.support.spark_locations.queries import QueryRun, all_rows, run_queries

    runs, cases = [], []
    for provider in ("hdfs", "rocksdb_changelog", "rocksdb_v2"):
        base = tmp_path / provider
        fx, inputs = running(extracted, "join", provider, base)
        k = restartable_batches(fx.checkpoint)[0]
        files = int(fx.entry["files"])
        assert k < files - 1, "no input left after the oldest restartable batch"
        source = open_spark_checkpoint(str(fx.checkpoint))

        report = source.repartition(str(base / "five"), partitions=5, batch=k)

        assert (report.batch, report.partitions_before, report.partitions) == (k, 2, 5)
        stores = report.operators[0].stores
        assert [s.partitioning for s in stores] == [["field0"]] * 4
        # the keys spread over the new partitions (2 -> 5 moves some of them)
        assert sum(1 for c in stores[0].per_partition if c) >= 3
        copy_output(fx.output, base / "out", k)
        runs.append(QueryRun(provider, str(base / "five"), inputs, base / "out", files - 1))
        cases.append((fx, base))

    deleted, expected = _join_with_a_key_deleted(extracted, tmp_path / "deleted")
    runs.append(deleted)

    *lasts, _last = run_queries(spark, "join", runs)

    assert all_rows(deleted.output) == expected
    for (fx, base), last in zip(cases, lasts, strict=True):
        assert all_rows(base / "out") == rows(fx), fx.provider
        # Spark ran the new batches with 5 partitions: each wrote its state to all five
        state = base / "five" / "state" / "0"
        assert sorted(p.name for p in state.iterdir() if p.name.isdigit()) == list("01234")
        written = "delta" if fx.provider == "hdfs" else "changelog"
        stem = f"{last + 1}_*" if fx.provider == "rocksdb_v2" else str(last + 1)
        assert all(list((state / str(p) / "left-keyToNumValues").glob(f"{stem}.{written}"))
                   for p in range(5)), fx.provider
        assert last == fx.last_batch
        done = open_spark_checkpoint(str(base / "five"))
        original = open_spark_checkpoint(str(fx.checkpoint))
        for store in ("left-keyToNumValues", "left-keyWithIndexToValue",
                      "right-keyToNumValues", "right-keyWithIndexToValue"):
            assert _state(done, store, last) == _state(original, store, last), store


def _join_pairs(arrived: list[tuple[int, dict[str, Any]]]
                ) -> list[tuple[dict[str, Any], int, int]]:
    """The join query's rows (`queries.join_query`: each row with the same key's rows up
    to 2 minutes later) of the input rows given with the batch each arrived in, each with
    its two rows' batches."""
    return [({"key": left["key"], "lvalue": left["value"], "rvalue": right["value"],
              "lts": left["ts"], "rts": right["ts"]}, at_left, at_right)
            for at_left, left in arrived for at_right, right in arrived
            if left["key"] == right["key"] and left["ts"] <= right["ts"] <= left["ts"] + 120]


def _join_with_a_key_deleted(extracted: Callable[[str], Path], base: Path
                             ) -> tuple[Any, list[dict[str, Any]]]:
    """The join's RocksDB location with a key deleted from both sides at its oldest
    restartable batch k, to restart on; and the rows a restart must leave in its output:
    every pair of the input but those of the key that join a row from before k with one
    after (the earlier row's state is gone)."""
    from tests.support.spark_locations.queries import QueryRun, input_rows

    fx, inputs = running(extracted, "join", "rocksdb", base)
    k = restartable_batches(fx.checkpoint)[0]
    files = int(fx.entry["files"])
    pairs = _join_pairs([(j, r) for j in range(files) for r in input_rows(j)])
    order = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    # the model is the uninterrupted run's output
    assert sorted((p for p, _l, _r in pairs), key=order) == rows(fx)
    crossing = [(p, a, b) for p, a, b in pairs if min(a, b) <= k < max(a, b)]
    assert crossing, "no pair joins a row from before k with one after"
    victim = crossing[0][0]["key"]
    source = open_spark_checkpoint(str(fx.checkpoint))
    report = source.delete_keys(str(base / "dest"), operator=0, batch=k,
                                keys=[{"field0": victim}])
    assert (report.deleted, report.batch) == (1, k)
    copy_output(fx.output, base / "out", k)
    expected = sorted((p for p, a, b in pairs
                       if not (p["key"] == victim and min(a, b) <= k < max(a, b))),
                      key=order)
    assert len(expected) < len(pairs)
    return QueryRun("rocksdb", str(base / "dest"), inputs, base / "out", files - 1), expected


def _state(location: Any, store: str, batch: int) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True, default=str)
                  for b in location.read_state(operator=0, store=store, batch=batch)
                  for row in b.to_pylist())


def test_transformed_state_restarts_with_the_output_it_implies(
    spark: Any, extracted: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark restarts on what `transform` wrote (test_spark_transform.py checks the files
    without Spark):

    (a) keys deleted: the dropDuplicates location (HDFS-backed) at its oldest restartable
    batch k, without every (key, event time) of one key; restarted, the query emits again
    exactly the rows of later input that repeat a deleted key (each once), the rest as
    the run that never stopped;
    (b) schema migration: the windowed count and sum (RocksDB, changelog on) migrated to
    count, sum and max, the new column filled by fn with the max of the window's input,
    restarted with the query that computes all three: Spark accepts DEST's state schema
    and every row after k is the uninterrupted run's with its exact max;
    (c) a dropDuplicates key column widened from int to bigint (below)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    from tests.support.spark_locations.queries import (
        QUERIES,
        STEP,
        Query,
        QueryRun,
        _events,
        all_rows,
        input_rows,
        read_output,
        run_queries,
    )

    # (a) delete keys
    base = tmp_path / "dedup"
    fx, inputs = running(extracted, "dedup", "hdfs", base)
    k = restartable_batches(fx.checkpoint)[0]
    files = int(fx.entry["files"])
    assert k < files - 1
    source = open_spark_checkpoint(str(fx.checkpoint))
    victim = input_rows(k)[2]["key"]  # file k + 1 repeats this row of file k
    state = [r for b in source.read_state(batch=k) for r in b.to_pylist()]
    deleted = {(r["key"], r["event_time"]) for r in state if r["key"] == victim}
    assert deleted
    keys = [{"key": key, "event_time": t.isoformat()} for key, t in sorted(deleted)]
    report = source.delete_keys(str(base / "dest"), operator=0, keys=keys, batch=k)
    assert (report.deleted, report.not_found) == (len(deleted), 0)
    copy_output(fx.output, base / "out", k)
    [last] = run_queries(spark, "dedup", [QueryRun("hdfs", str(base / "dest"), inputs,
                                                   base / "out", files - 1)])
    assert last == fx.last_batch
    seen: set[tuple[str, int]] = set()
    again = []
    epoch = {(key, int(t.timestamp())) for key, t in deleted}
    for j in range(k + 1, files):
        for row in input_rows(j):
            if (row["key"], row["ts"]) in epoch and (row["key"], row["ts"]) not in seen:
                seen.add((row["key"], row["ts"]))
                again.append(row)
    assert again, "no later input repeats a deleted key: the test would prove nothing"
    expected = sorted(rows(fx) + again, key=lambda r: json.dumps(r, sort_keys=True))
    assert all_rows(base / "out") == expected

    # (b) migration: count, sum -> count, sum, max
    base = tmp_path / "window"
    fx, inputs = running(extracted, "window", "rocksdb_changelog", base)
    k = restartable_batches(fx.checkpoint)[0]
    files = int(fx.entry["files"])
    highest: dict[tuple[str, int], int] = {}
    for j in range(files):
        for row in input_rows(j):
            window = (row["key"], row["ts"] - row["ts"] % STEP)
            highest[window] = max(highest.get(window, row["value"]), row["value"])

    def with_max(b: pa.RecordBatch) -> pa.RecordBatch:
        starts = pc.cast(pc.struct_field(b.column("window"), [0]), pa.int64()).to_pylist()
        values = [highest[(key, start // 1_000_000)]
                  for key, start in zip(b.column("key").to_pylist(), starts, strict=True)]
        return b.append_column("max", pa.array(values, pa.int64()))

    new_value = pa.schema([("count", pa.int64()), ("sum", pa.int64()), ("max", pa.int64())])
    report = open_spark_checkpoint(str(fx.checkpoint)).transform(
        str(base / "dest"), operator=0, batch=k, fn=with_max, value_schema=new_value)
    assert report.value_schema_changed and report.rows_written == report.rows_read > 0

    def window_max(source: Any) -> Any:
        return _events(source).groupBy(F.window("event_time", "5 minutes"), "key").agg(
            F.count("*").alias("count"), F.sum("value").alias("sum"),
            F.max("value").alias("max"),
        ).select("key", F.col("window.start").cast("long").alias("start"), "count", "sum",
                 "max")

    monkeypatch.setitem(QUERIES, "window_max", Query(window_max, "append"))
    copy_output(fx.output, base / "out", k)
    [last] = run_queries(spark, "window_max", [QueryRun(
        "rocksdb_changelog", str(base / "dest"), inputs, base / "out", files - 1)])
    assert last == fx.last_batch
    got, reference = read_output(base / "out"), read_output(fx.output)
    assert sorted(got) == sorted(reference)
    after = 0
    for batch, old in reference.items():
        if batch <= k:
            assert got[batch] == old
            continue
        assert got[batch] == sorted(
            ({**r, "max": highest[(r["key"], r["start"])]} for r in old),
            key=lambda r: json.dumps(r, sort_keys=True))
        after += len(old)
    assert after, "no window closed after the restart: the test would prove nothing"

    # (c) a dropDuplicates key column widened from int to bigint (RocksDB): a fresh run
    # on the first files, the key migrated (each key routed by its bigint's hash), the
    # widened query restarted on the rest: every later row a key seen before repeats is
    # dropped, the others written once, as the run that never stopped would
    from tests.support.spark_locations.queries import write_inputs
    from tests.support.spark_reference_queries import write_batch

    def dedup_by(kind: str) -> Callable[[Any], Any]:
        def build(source: Any) -> Any:
            return source.withColumn("n", F.col("value").cast(kind)).dropDuplicates(
                ["key", "n"]).select("key", "value", "ts")
        return build

    monkeypatch.setitem(QUERIES, "dedup_int", Query(dedup_by("int"), "append"))
    monkeypatch.setitem(QUERIES, "dedup_long", Query(dedup_by("bigint"), "append"))
    base = tmp_path / "widen"
    inputs = base / "in"
    write_inputs(inputs, 0, 3)
    [first] = run_queries(spark, "dedup_int", [QueryRun(
        "rocksdb", str(base / "ckpt"), inputs, base / "out", 2)])
    before = open_spark_checkpoint(str(base / "ckpt"))
    state = {(r["key"], r["n"]) for b in before.read_state(batch=first) for r in b.to_pylist()}
    widened = pa.schema([("key", pa.string()), ("n", pa.int64())])
    report = before.transform(
        str(base / "dest"), operator=0, batch=first, key_schema=widened,
        fn=lambda b: b.set_column(1, "n", pc.cast(b.column("n"), pa.int64())))
    assert report.key_schema_changed and report.rows_written == len(state)
    # two more files, then one repeating every row the state holds
    write_inputs(inputs, 3, 2)
    again = [r for j in range(first + 1) for r in input_rows(j)]
    write_batch(inputs, 5, again)
    [last] = run_queries(spark, "dedup_long", [QueryRun(
        "rocksdb", str(base / "dest"), inputs, base / "out", 5)])
    assert last == 5
    seen, expected, repeats = set(state), [], []
    for row in [*input_rows(3), *input_rows(4), *again]:
        pair = (row["key"], row["value"])
        if pair in seen:
            if pair in state:
                repeats.append(pair)
            continue
        seen.add(pair)
        expected.append(row)
    out = read_output(base / "out")
    assert sorted((r for n in range(first + 1, 6) for r in out.get(n, [])),
                  key=lambda r: json.dumps(r, sort_keys=True)) == sorted(
        expected, key=lambda r: json.dumps(r, sort_keys=True))
    # some repeated keys sit elsewhere by the bigint's hash than by the int's: put by the
    # old hash, Spark would not have found them and would have written their rows again
    text, int32, int64 = Atomic("string"), Atomic("integer"), Atomic("long")
    assert any(partition_of([k, v], [text, int32], 2) != partition_of([k, v], [text, int64], 2)
               for k, v in repeats), repeats


def _session_query(source: Any) -> Any:
    """A count and sum per key and session (a 4-minute gap: a key's sessions run across
    input files, so those open at a restart go on in the state Spark loads)."""
    from pyspark.sql import functions as F

    from tests.support.spark_locations.queries import _events

    return _events(source).groupBy(F.session_window("event_time", "4 minutes"), "key").agg(
        F.count("*").alias("count"), F.sum("value").alias("sum"),
    ).select("key", F.col("session_window.start").cast("long").alias("start"),
             F.col("session_window.end").cast("long").alias("end"), "count", "sum")


def _placed_by_key(location: Any, partitions: int) -> int:
    """Every row of the session window's store sits in the partition Spark's hash of its
    grouping column (``key``) gives; the rows counted."""
    count = 0
    for p in range(partitions):
        for b in location.read_state(partition=p):
            for row in b.to_pylist():
                assert partition_of([row["key"]], [Atomic("string")], partitions) == p, row
                count += 1
    return count


def _by_partition(location: Any, batch: int) -> Counter[tuple[Any, ...]]:
    """The session store's rows read offline, with their partitions."""
    out: Counter[tuple[Any, ...]] = Counter()
    for sid in sorted({s for s in location.scan().stores if s.operator == 0}):
        for b in location.read_state(batch, partition=sid.partition):
            columns = [c.to_pylist() for c in b.columns]  # by place: key and value share names
            out.update((sid.partition, *map(frozen, row)) for row in zip(*columns, strict=True))
    return out


def _sparks_rows(spark: Any, uri: str, batch: int) -> Counter[tuple[Any, ...]]:
    """The same rows as Spark's state data source (``statestore``) reads them."""
    table = spark.read.format("statestore").option("batchId", batch).load(uri).toArrow()
    return Counter((r["partition_id"], *map(frozen, r["key"].values()),
                    *map(frozen, r["value"].values())) for r in table.to_pylist())


def test_a_session_window_repartitioned_restarts_with_the_uninterrupted_output(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session window on RocksDB (its keys laid out for prefix scans: the grouping key,
    then the session start) with changelog checkpointing off and on, and HDFS-backed, run
    with 2 partitions on 4 input files; repartitioned to 5 (changelog on: 5, then 3,
    chained), every key where Spark's hash of its grouping column sends it, the state as
    it was, and every key decoding as the source's do (`verify --deep`); restarted by
    Spark on the rest of the input: every row is the run that never stopped's (a key in
    the wrong partition loses its open sessions, so a session would be split). A session
    deleted offline (`delete_keys`) is gone when read back, the rest as it was. On Spark 4
    the rows read offline are those of Spark's own state reader, partition by partition."""
    import pyspark

    from tests.support.spark_locations.queries import (
        QUERIES,
        Query,
        QueryRun,
        all_rows,
        run_queries,
        write_inputs,
    )

    spark_4 = int(pyspark.__version__.split(".")[0]) >= 4  # 3.5 has no state reader
    monkeypatch.setitem(QUERIES, "session", Query(_session_query, "append"))
    first, total = 4, 8
    inputs, everything = tmp_path / "in", tmp_path / "all"
    write_inputs(inputs, 0, first)
    write_inputs(everything, 0, total)
    layouts = {"rocksdb": (5,), "rocksdb_changelog": (5, 3), "hdfs": (5,)}
    runs = [QueryRun(p, str(tmp_path / p), inputs, tmp_path / f"out-{p}", first - 1)
            for p in layouts]
    reference = tmp_path / "out-reference"
    lasts = run_queries(spark, "session", [
        *runs, QueryRun("hdfs", str(tmp_path / "reference"), everything, reference,
                        total - 1)])
    restarts = []
    for (provider, chain), last in zip(layouts.items(), lasts[:-1], strict=True):
        source = open_spark_checkpoint(str(tmp_path / provider))
        before = _state(source, "default", last)
        assert before, provider
        if spark_4:  # the offline rows are Spark's own reader's, partition by partition
            assert _by_partition(source, last) == _sparks_rows(spark, source.uri, last)
        assert source.verify(deep=True).ok, provider  # its keys decode where Spark's do
        at = source
        for m in chain:
            dest = tmp_path / f"{provider}-{m}"
            report = at.repartition(str(dest), partitions=m)
            assert (report.batch, report.partitions) == (last, m)
            assert report.operators[0].stores[0].partitioning == ["key"]
            at = open_spark_checkpoint(str(dest))
            assert _state(at, "default", last) == before, (provider, m)
            assert _placed_by_key(at, m) == len(before)
            assert at.verify(deep=True).ok
        restarts.append(QueryRun(provider, str(dest), inputs, tmp_path / f"out-{provider}",
                                 last + total - first))
        # a session deleted (transform's path: its key written again in the same layout)
        gone = json.loads(before[0])
        report = source.delete_keys(
            str(tmp_path / f"{provider}-deleted"), operator=0,
            keys=[{"key": gone["key"], "sessionStartTime": gone["sessionStartTime"]}])
        assert (report.deleted, report.not_found) == (1, 0)
        less = open_spark_checkpoint(str(tmp_path / f"{provider}-deleted"))
        assert _state(less, "default", last) == before[1:]
        assert less.verify(deep=True).ok
    write_inputs(inputs, first, total - first)

    run_queries(spark, "session", restarts)

    expected = all_rows(reference)
    assert expected
    for provider, chain in layouts.items():
        assert all_rows(tmp_path / f"out-{provider}") == expected, provider
        state = tmp_path / f"{provider}-{chain[-1]}" / "state" / "0"
        assert sorted(p.name for p in state.iterdir() if p.name.isdigit()) == [
            str(p) for p in range(chain[-1])]


#: RichState's state variables (tests.support.spark_locations.queries): a list, a map
#: and a value, then the same kinds with a TTL.
RICH_VARIABLES = ["items", "buckets", "total", "recent", "firsts", "seen"]
#: Every column family Spark 4.3 writes for RichState: the variables, a TTL index per TTL'd
#: variable, the TTL'd list's minimum expiry and count per key, and the plain list's
#: count per key.
RICH_FAMILIES = {*RICH_VARIABLES, "$ttl_recent", "$ttl_firsts", "$ttl_seen", "$min_recent",
                 "$count_recent", "$rowCounter_items"}


def _leaves(value: Any) -> tuple[Any, ...]:
    """A row's values with every struct flattened (nested as Arrow's dicts or as tuples)."""
    if isinstance(value, dict):
        value = tuple(value.values())
    if isinstance(value, tuple):
        return tuple(leaf for v in value for leaf in _leaves(v))
    return (frozen(value),)


def _grouping(row: dict[str, Any]) -> str:
    key = row["key"]
    return key if isinstance(key, str) else key["key"]


def _tws_offline(location: Any, var: str, batch: int, partitions: int
                 ) -> Counter[tuple[Any, ...]]:
    """A state variable's rows read offline with their partitions, each checked to sit in
    the partition Spark's hash of its grouping key gives."""
    out: Counter[tuple[Any, ...]] = Counter()
    for p in range(partitions):
        for b in location.read_state(batch, state_var=var, partition=p):
            for row in b.to_pylist():
                assert partition_of([_grouping(row)], [Atomic("string")], partitions) == p
                out[(p, *_leaves(row))] += 1
    return out


def _sparks_variable(spark: Any, checkpoint: Path, batch: int, var: str
                     ) -> Counter[tuple[Any, ...]]:
    """The same rows as Spark's state reader gives them (``stateVarName``)."""
    rows = (spark.read.format("statestore").option("batchId", batch)
            .option("stateVarName", var).load(str(checkpoint)).toArrow().to_pylist())
    return Counter((r.pop("partition_id"), *_leaves(r)) for r in rows)


def _families(location: Any, batch: int, partitions: int) -> Counter[tuple[Any, ...]]:
    """Every column family's records read offline: (partition, family, grouping key, key,
    value), structs flattened; each record checked to sit where Spark's hash of its
    grouping key sends it."""
    from statehold.spark_checkpoints.tws_state import tws_operator

    tws = tws_operator(location, location.scan(), 0)
    assert tws is not None
    out: Counter[tuple[Any, ...]] = Counter()
    for name, family in tws.families.items():
        width = len(family.key.fields)
        for p in range(partitions):
            for b in location.read_state(batch, state_var=name, partition=p):
                for row in zip(*(c.to_pylist() for c in b.columns), strict=True):
                    key = tuple(_nested(v) for v in row[:width])
                    grouping = family.grouping(key)
                    assert partition_of(grouping, family.grouping_types, partitions) == p
                    out[(p, name, grouping, _leaves(key), _leaves(row[width:]))] += 1
    return out


def _nested(value: Any) -> Any:
    """An Arrow struct (a dict) as decode_row gives it: a tuple of its fields."""
    return tuple(map(_nested, value.values())) if isinstance(value, dict) else value


def _sparks_families(spark: Any, location: Any, batch: int) -> Counter[tuple[Any, ...]]:
    """The same as Spark 4.3 reads them with its all-families option (internal, made for
    its own offline repartition): each family's key and value UnsafeRows (Spark's, without
    RocksDB's layout: no family id, version byte or range encoding) decoded with the
    family's schemas, the grouping key as Spark extracts it, the partition its reader
    task's (one per state partition). A value Spark keeps as a placeholder only (a TTL
    index's) is left out, as statehold reads it."""
    from pyspark.sql import functions as F

    from statehold.spark_checkpoints.tws_state import tws_operator
    from statehold.spark_checkpoints.unsafe_row import decode_row

    tws = tws_operator(location, location.scan(), 0)
    assert tws is not None
    table = (spark.read.format("statestore").option("batchId", batch)
             .option("_readAllColumnFamilies", "true").load(location.uri)
             .withColumn("p", F.spark_partition_id()).toArrow())
    out: Counter[tuple[Any, ...]] = Counter()
    for r in table.to_pylist():
        name = r["column_family_name"]
        family = tws.families[name]
        key = decode_row(r["key_bytes"], family.key, name)
        value = decode_row(r["value_bytes"], family.value, name)
        shown = value if family.schema().value.fields else ()
        out[(r["p"], name, tuple(r["partition_key"].values()), _leaves(key),
             _leaves(shown))] += 1
    return out


def _rich_expected(files: int) -> list[dict[str, Any]]:
    """RichState's output over input files 0..files-1, one batch a file."""
    from tests.support.spark_locations.queries import input_rows

    values: dict[str, list[int]] = {}
    out = []
    for j in range(files):
        rows = input_rows(j)
        for key in sorted({r["key"] for r in rows}):
            values.setdefault(key, []).extend(r["value"] for r in rows if r["key"] == key)
            seen = values[key]
            firsts: dict[int, int] = {}
            for v in seen:
                firsts.setdefault(v % 5, v)
            out.append({"key": key, "total": sum(seen), "items": len(seen),
                        "buckets": len({v % 3 for v in seen}), "seen": len(seen),
                        "recent": sum(seen), "firsts": sum(firsts.values())})
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


#: The key whose list state (``items``) a transform clears on one copy before its restart.
CLEARED = "k0"


def _items_cleared(moved: Any, dest: Path, last: int, partitions: int) -> str:
    """``transform(state_var="items")`` on a repartitioned copy: CLEARED's list dropped,
    every other key's written again by statehold (its elements and row counter), read
    back so; the other variables as they were. Through the identity, the list and the
    map are the copy's byte for byte. Returns DEST, which restarts instead of the copy."""
    import pyarrow.compute as pc

    from tests.spark_checkpoints.test_spark_transform import _raw_records

    moved.transform(str(dest), operator=0, state_var="items",
                    fn=lambda b: b.filter(pc.not_equal(b.column("key"), CLEARED)))
    out = open_spark_checkpoint(str(dest))
    before = _tws_offline(moved, "items", last, partitions)
    after = _tws_offline(out, "items", last, partitions)
    assert after == Counter({r: n for r, n in before.items() if r[1] != CLEARED}) != before
    counts = Counter(r[1] for r in after.elements())
    counters = {r["key"]: r["count"] for b in out.read_state(state_var="$rowCounter_items")
                for r in b.to_pylist()}
    assert counters == dict(counts)
    for var in RICH_VARIABLES[1:]:
        assert _tws_offline(out, var, last, partitions) == _tws_offline(
            moved, var, last, partitions), var
    for var in ("items", "buckets"):
        same = moved.transform(f"{dest}-{var}", operator=0, state_var=var, fn=lambda b: b)
        assert _raw_records(open_spark_checkpoint(same.dest)) == _raw_records(moved), var
    return str(dest)


def _with_items_cleared(expected: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """RichState's output when CLEARED's list was emptied after file `first` - 1: its
    rows after the restart (those counting more than the values before) count the
    values since."""
    from tests.support.spark_locations.queries import input_rows

    before = sum(r["key"] == CLEARED for j in range(first) for r in input_rows(j))
    return sorted(({**r, "items": r["items"] - before}
                   if r["key"] == CLEARED and r["items"] > before else r for r in expected),
                  key=lambda r: json.dumps(r, sort_keys=True))


def test_every_kind_of_transform_with_state_is_read_repartitioned_and_restarted(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformWithStateInPandas keeping list, map and value state, each without and
    with a TTL (RichState: the committed transform fixtures hold a value state and
    timers), on RocksDB with changelog checkpointing off and on, 2 partitions, 3 input
    files: each state variable's rows read offline equal Spark's own reader's
    (``stateVarName``: a TTL'd variable's with each value's expiry), and every column
    family's (the TTL indexes, the list's minimum expiry and counts too, which that option
    does not read) equal Spark 4.3's all-families reader's, partition by partition, each
    record's grouping key as Spark extracts it; repartitioned (to 5, and to 3), every
    record of every family where Spark's hash of its grouping key sends it, the records
    as they were, and Spark's all-families reader reads the same from the copy; the
    sources removed, Spark restarts on the copies with 2 more files and writes what the
    state implies (the output reads every variable back: a key's state lost or split
    would change its counts); on the changelog copy, a key's list cleared by a transform
    first (`_items_cleared`), the restart counting its values since. The TTL (hours) runs
    out in no test: the expiry is read, not applied."""
    import pyspark

    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    if version < (4, 0):
        pytest.skip("transformWithStateInPandas needs PySpark 4")
    # Spark's all-families reader, and the families RICH_FAMILIES lists, are 4.3's
    every_family = version >= (4, 3)
    from tests.support.spark_locations import queries
    from tests.support.spark_locations.queries import (
        QUERIES,
        Query,
        QueryRun,
        all_rows,
        run_queries,
        write_inputs,
    )

    monkeypatch.setitem(QUERIES, "rich", Query(queries.rich_state_query, "append",
                                                queries.RICH_CONF))
    first, total = 3, 5
    inputs = tmp_path / "in"
    write_inputs(inputs, 0, first)
    layouts = {"rocksdb": 5, "rocksdb_changelog": 3}
    lasts = run_queries(spark, "rich", [
        QueryRun(p, str(tmp_path / p), inputs, tmp_path / f"out-{p}", first - 1)
        for p in layouts])
    restarts = []
    for (provider, m), last in zip(layouts.items(), lasts, strict=True):
        source = open_spark_checkpoint(str(tmp_path / provider))
        for var in RICH_VARIABLES:
            ours = _tws_offline(source, var, last, 2)
            theirs = _sparks_variable(spark, tmp_path / provider, last, var)
            assert theirs, f"{provider} {var}: Spark reads no rows; nothing is compared"
            assert ours == theirs, (provider, var)
        before = _families(source, last, 2)
        if every_family:
            assert before == _sparks_families(spark, source, last), provider
            assert {name for _p, name, *_r in before} == RICH_FAMILIES, provider
        dest = tmp_path / f"{provider}-{m}"
        report = source.repartition(str(dest), partitions=m)
        assert (report.batch, report.partitions) == (last, m)
        moved = open_spark_checkpoint(str(dest))
        after = _families(moved, last, m)
        assert Counter(r[1:] for r in after.elements()) == Counter(
            r[1:] for r in before.elements()), provider
        if every_family:
            assert after == _sparks_families(spark, moved, last), provider
        restart = str(dest)
        if provider == "rocksdb_changelog":  # a state variable transformed, then restarted
            restart = _items_cleared(moved, tmp_path / f"{provider}-items", last, m)
        shutil.rmtree(tmp_path / provider)
        restarts.append(QueryRun(provider, restart, inputs, tmp_path / f"out-{provider}",
                                 last + total - first))
    write_inputs(inputs, first, total - first)

    run_queries(spark, "rich", restarts)

    expected = _rich_expected(total)
    for provider in layouts:
        wanted = (_with_items_cleared(expected, first) if provider == "rocksdb_changelog"
                  else expected)
        assert all_rows(tmp_path / f"out-{provider}") == wanted, provider
