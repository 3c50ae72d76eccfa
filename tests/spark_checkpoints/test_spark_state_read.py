"""Spark's own state read offline (`SparkCheckpointLocation.read_state`) from the committed
fixtures (tests/fixtures/spark/, written by real Spark 3.5, 4.0 and the newest 4.x) on
every state store layout (HDFS-backed; RocksDB with changelogs off, on, and checkpoint
format v2), without a JVM: at every batch a location can restart from, the rows of every
partition equal the state the query's input implies, computed here from the input files
(tests.support.spark_locations.queries.input_rows: batch i reads file i) and the
watermark they imply (checked against the one Spark recorded in the offsets).

transformWithState's state (transformWithStateInPandas, ``CountWithTimers``: a ValueState
``count`` and event-time timers in RocksDB column families) is read by state variable,
each batch's against the counts and timers the input implies.

Then what is refused, in one line: transformWithState's state read without a state
variable (the error names them) or by one it does not have, a batch not committed, a
store without a schema file (a schema given instead reads it), a damaged delta, a
damaged or missing SST.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import Kind
from statehold.spark_checkpoints.location import unique_id
from statehold.spark_checkpoints.stores import resolve
from tests.support.spark_locations.committed_fixtures import Fixture, copy_of, fixture, manifests
from tests.support.spark_locations.handmade_files import big_hdfs_store
from tests.support.spark_locations.queries import STEP, input_rows
from tests.support.traced_peak import traced_peaks

#: Each batch's timer is set this long after its key's newest row (CountWithTimers').
TIMER_DELAY_MS = 60_000
TWS_CASES = [(v, loc["provider"]) for v in sorted(manifests())
             for loc in manifests()[v]["locations"] if loc["query"] == "transform"]

#: Spark's watermark delay of the queries (10 minutes), in ms.
DELAY_MS = 600_000
#: (query, operator, store kind) of each HDFS-backed location's stores checked here.
CHECKED = [("window", 0, "window"), ("dedup", 0, "dedup"), ("pandas_state", 0, "totals"),
           ("multi", 0, "window-distinct"), ("multi", 1, "dedup")]
CASES = [(v, q, loc["provider"], op, kind) for v in sorted(manifests())
         for q, op, kind in CHECKED for loc in manifests()[v]["locations"]
         if loc["query"] == q]


def files_read(fx: Fixture, batch: int) -> range:
    """The input files batches 0 .. `batch` read (one a batch; later batches read none)."""
    return range(min(batch, int(fx.entry["files"]) - 1) + 1)


def rows_of(files: range) -> list[dict[str, Any]]:
    return [row for i in files for row in input_rows(i)]


def watermark_ms(fx: Fixture, batch: int) -> int:
    """The watermark of `batch`: the newest event time of the batches before it, less the
    delay (0 before any)."""
    before = rows_of(files_read(fx, batch - 1)) if batch else []
    return max([0, *(r["ts"] * 1000 - DELAY_MS for r in before)])


def expected(fx: Fixture, kind: str, batch: int) -> Counter[tuple[Any, ...]]:
    """The state rows the input implies after `batch`, as `actual` gives them."""
    rows = rows_of(files_read(fx, batch))
    wm = watermark_ms(fx, batch)
    if kind == "dedup":  # every (key, event time) whose time is after the watermark
        return Counter({(r["key"], r["ts"], None) for r in rows if r["ts"] * 1000 > wm})
    if kind == "totals":  # applyInPandasWithState's (count, total) per key
        totals: dict[str, tuple[int, int]] = {}
        for r in rows:
            count, total = totals.get(r["key"], (0, 0))
            totals[r["key"]] = (count + 1, total + r["value"])
        return Counter((k, c, t) for k, (c, t) in totals.items())
    if kind == "window-distinct":  # the windowed aggregation after dropDuplicates
        rows = [dict(t) for t in {tuple(sorted(r.items())) for r in rows}]
    groups: dict[tuple[int, str], tuple[int, int]] = {}
    for r in rows:
        start = r["ts"] // STEP * STEP
        count, total = groups.get((start, r["key"]), (0, 0))
        groups[(start, r["key"])] = (count + 1, total + r["value"])
    # a window stays in state until the watermark reaches its end
    return Counter((s, s + STEP, k, c, t) for (s, k), (c, t) in groups.items()
                   if (s + STEP) * 1000 > wm)


def _seconds(value: datetime.datetime) -> int:
    assert value.tzinfo is not None
    return int(value.timestamp())


def actual(fx: Fixture, kind: str, operator: int, batch: int) -> Counter[tuple[Any, ...]]:
    location = open_spark_checkpoint(str(fx.checkpoint))
    out: Counter[tuple[Any, ...]] = Counter()
    for record_batch in location.read_state(batch, operator=operator, batch_rows=3):
        assert record_batch.num_rows <= 3
        for r in record_batch.to_pylist():
            if kind == "dedup":
                out[(r["key"], _seconds(r["event_time"]), r["__dummy__"])] += 1
            elif kind == "totals":
                out[(r["key"], r["groupState"]["count"], r["groupState"]["total"])] += 1
            else:
                w = r["window"]
                out[(_seconds(w["start"]), _seconds(w["end"]), r["key"], r["count"],
                     r["sum"])] += 1
    return out


def readable_batches(fx: Fixture, operator: int) -> list[int]:
    """The committed batches whose state version every partition holds whole."""
    location = open_spark_checkpoint(str(fx.checkpoint))
    found = location.scan()
    stores = [s for s in found.stores if s.operator == operator]
    order = location.store_order(found, operator)

    def readable(batch: int) -> bool:
        commit = location.commit(batch)
        return all(resolve(found.stores[s], batch + 1, location,
                           unique_id(commit, s, order)).ok for s in stores)

    return [b for b in sorted(found.commits) if readable(b)]


@pytest.mark.parametrize(("version", "query", "provider", "operator", "kind"), CASES,
                         ids=[f"{v}-{q}-{p}-{op}" for v, q, p, op, _k in CASES])
def test_offline_rows_equal_what_the_input_implies(
    extracted: Callable[[str], Path], version: str, query: str, provider: str, operator: int,
    kind: str,
) -> None:
    fx = fixture(extracted(version), version, query, provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    batches = readable_batches(fx, operator)
    assert fx.last_batch in batches and len(batches) >= 2, batches
    for batch in batches:
        recorded = location.offsets(batch).metadata.batchWatermarkMs
        no_watermark = kind == "totals"  # that query has no event time
        assert recorded == (0 if no_watermark else watermark_ms(fx, batch)), (batch, recorded)
        want = expected(fx, kind, batch)
        assert want, "a batch whose state the input says is empty tests nothing"
        assert actual(fx, kind, operator, batch) == want, batch


def tws_expected(fx: Fixture, batch: int) -> tuple[Counter[tuple[Any, ...]],
                                                  Counter[tuple[Any, ...]]]:
    """The counts per key, and the timers (key, expiry ms) not yet fired, after `batch`:
    each batch sets a timer per key it has rows of, its newest row's time plus the delay;
    a timer fires once the batch's watermark reaches it."""
    counts: Counter[str] = Counter()
    timers: set[tuple[str, int]] = set()
    for i in files_read(fx, batch):
        rows = input_rows(i)
        counts.update(r["key"] for r in rows)
        for key in {r["key"] for r in rows}:
            timers.add((key, max(r["ts"] for r in rows if r["key"] == key) * 1000
                        + TIMER_DELAY_MS))
    wm = watermark_ms(fx, batch)
    return (Counter(counts.items()),
            Counter(t for t in timers if t[1] > wm))


def tws_actual(fx: Fixture, batch: int) -> tuple[Counter[tuple[Any, ...]],
                                                Counter[tuple[Any, ...]]]:
    location = open_spark_checkpoint(str(fx.checkpoint))
    counts: Counter[tuple[Any, ...]] = Counter()
    for b in location.read_state(batch, state_var="count", batch_rows=3):
        assert b.num_rows <= 3 and b.schema.names == ["key", "count"]
        counts.update((r["key"], r["count"]) for r in b.to_pylist())
    timers: Counter[tuple[Any, ...]] = Counter()
    for b in location.read_state(batch, state_var="$eventTimers_keyToTimestamp"):
        timers.update((r["key"]["key"], r["expiryTimestampMs"]) for r in b.to_pylist())
    by_time: Counter[tuple[Any, ...]] = Counter()
    for b in location.read_state(batch, state_var="$eventTimers_timestampToKey"):
        by_time.update((r["key"]["key"], r["expiryTimestampMs"]) for r in b.to_pylist())
    assert by_time == timers, "the timers' two families disagree"
    return counts, timers


@pytest.mark.parametrize(("version", "provider"), TWS_CASES,
                         ids=[f"{v}-{p}" for v, p in TWS_CASES])
def test_transform_with_state_read_by_state_variable(
    extracted: Callable[[str], Path], version: str, provider: str
) -> None:
    fx = fixture(extracted(version), version, "transform", provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    batches = readable_batches(fx, 0)
    assert fx.last_batch in batches and len(batches) >= 2, batches
    fired = 0
    for batch in batches:
        assert location.offsets(batch).metadata.batchWatermarkMs == watermark_ms(fx, batch)
        counts, timers = tws_expected(fx, batch)
        assert counts and timers, "a batch whose state the input says is empty tests nothing"
        assert tws_actual(fx, batch) == (counts, timers), batch
        fired += len(tws_expected(fx, batch - 1)[1] - timers) if batch else 0
    assert fired, "no timer fired between the batches compared: their removal is untested"


def test_the_expected_state_changes_between_batches(extracted: Callable[[str], Path]) -> None:
    """The batches compared hold different states (rows are evicted and added), so a
    reader that ignored the batch asked for would fail the test above."""
    version = sorted(manifests())[0]
    fx = fixture(extracted(version), version, "window", "hdfs")
    batches = readable_batches(fx, 0)
    states = [expected(fx, "window", b) for b in batches]
    assert all(a != b for a, b in zip(states, states[1:], strict=False)), batches


def test_state_schema_of_a_location(extracted: Callable[[str], Path]) -> None:
    version = sorted(manifests())[-1]
    fx = fixture(extracted(version), version, "window", "hdfs")
    schema = open_spark_checkpoint(str(fx.checkpoint)).state_schema(partition=1)
    assert schema.arrow().names == ["window", "key", "count", "sum"]
    assert [f.name for f in schema.key.fields] == ["window", "key"]


def _one_line(call: Callable[[], object], match: str) -> str:
    with pytest.raises(SparkCheckpointError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_what_is_not_read_is_refused_in_one_line(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    version = sorted(manifests())[-1]
    any_schema = open_spark_checkpoint(str(fixture(extracted(version), version, "window",
                                                   "hdfs").checkpoint)).state_schema()
    for provider in ("rocksdb", "rocksdb_changelog"):
        transform = open_spark_checkpoint(str(fixture(extracted(version), version,
                                                      "transform", provider).checkpoint))
        _one_line(lambda: list(transform.read_state()),  # noqa: B023
                  r"transformWithState's: name a state variable .*: count, "
                  r"\$eventTimers_keyToTimestamp$")
        _one_line(lambda: list(transform.read_state(schema=any_schema)),  # noqa: B023
                  "name a state variable")
        _one_line(lambda: list(transform.read_state(state_var="nope")),  # noqa: B023
                  "no state variable 'nope'")
    window = open_spark_checkpoint(str(fixture(extracted(version), version, "window",
                                               "rocksdb").checkpoint))
    _one_line(lambda: list(window.read_state(state_var="count")), "not transformWithState's")
    fx = copy_of(extracted(version), version, "dedup", "hdfs", tmp_path / "dedup")
    location = open_spark_checkpoint(str(fx.checkpoint))
    _one_line(lambda: list(location.read_state(fx.last_batch + 1)), "not committed")
    _one_line(lambda: list(location.read_state(operator=3)), "no store 'default' of operator 3")
    schema = location.state_schema()
    shutil.rmtree(fx.checkpoint / "state/0/0/_metadata")
    _one_line(lambda: list(location.read_state()), r"no state schema file .*give the key")
    assert sum(b.num_rows for b in location.read_state(schema=schema)) > 0


def test_a_damaged_delta_is_refused_in_one_line(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    version = sorted(manifests())[-1]
    fx = copy_of(extracted(version), version, "window", "hdfs", tmp_path / "window")
    location = open_spark_checkpoint(str(fx.checkpoint))
    found = location.scan()
    files = next(f for s, f in found.stores.items() if s.partition == 0)
    newest = max(v for k, v, _u in files.versions if k is Kind.DELTA)
    path = fx.checkpoint / files.key(Kind.DELTA, newest)
    path.write_bytes(path.read_bytes()[:-12])
    # a snapshot of the same version would be read instead of the delta
    (fx.checkpoint / files.key(Kind.HDFS_SNAPSHOT, newest)).unlink(missing_ok=True)
    message = _one_line(lambda: list(location.read_state(fx.last_batch, partition=0)),
                        f"{newest}.delta")
    assert "cut short" in message or "end" in message


def test_a_damaged_or_missing_sst_is_refused_in_one_line(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    version = sorted(manifests())[-1]
    fx = copy_of(extracted(version), version, "dedup", "rocksdb", tmp_path / "dedup")
    location = open_spark_checkpoint(str(fx.checkpoint))
    assert sum(b.num_rows for b in location.read_state(partition=0)) > 0
    ssts = sorted((fx.checkpoint / "state/0/0/SSTs").iterdir())
    for sst in ssts:
        sst.write_bytes(b"not an sst " * 100)
    _one_line(lambda: list(location.read_state(partition=0)), "RocksDB cannot")
    for sst in ssts:
        sst.unlink()
    _one_line(lambda: list(location.read_state(partition=0)), "cannot be read")


def test_memory_does_not_grow_with_the_state(tmp_path: Path) -> None:
    """Reading a snapshot ten times larger takes about the same peak: one block, one
    record batch (the rows are counted, not kept)."""
    stores = {rows: str(big_hdfs_store(tmp_path / str(rows), rows)) for rows in (10, 4_000, 40_000)}
    small, big = traced_peaks("tests.support.traced_peak:read_state_rows", [stores[10], 10],
                              [stores[4_000], 4_000], [stores[40_000], 40_000])
    peaks = {4_000: small, 40_000: big}
    assert peaks[40_000] < 1.5 * peaks[4_000] + (1 << 20), peaks


def _rows(fx: Fixture, batch: int, operator: int, store: str) -> Counter[str]:
    location = open_spark_checkpoint(str(fx.checkpoint))
    return Counter(json.dumps(r, default=str, sort_keys=True)
                   for b in location.read_state(batch, operator=operator, store=store)
                   for r in b.to_pylist())


LAYOUTS = [(v, q) for v in sorted(manifests()) for q in ("join", "multi", "dedup")]


@pytest.mark.parametrize(("version", "query"), LAYOUTS, ids=[f"{v}-{q}" for v, q in LAYOUTS])
def test_every_layout_reads_the_same_rows_of_every_store(
    extracted: Callable[[str], Path], version: str, query: str
) -> None:
    """The same query over the same input holds the same state whatever the store's
    layout: for each store (the join's four too) and each batch every layout can restart
    from, the rows read from RocksDB's zips, SSTs and changelogs equal the HDFS-backed
    provider's."""
    providers = sorted({loc["provider"] for loc in manifests()[version]["locations"]
                        if loc["query"] == query})
    hdfs = fixture(extracted(version), version, query, "hdfs")
    found = open_spark_checkpoint(str(hdfs.checkpoint)).scan()
    stores = sorted({(s.operator, s.name) for s in found.stores})
    compared = 0
    for provider in providers:
        fx = fixture(extracted(version), version, query, provider)
        for operator, name in stores:
            batches = set(readable_batches(hdfs, operator)) & set(readable_batches(fx, operator))
            for batch in sorted(batches):
                want = _rows(hdfs, batch, operator, name)
                assert want and _rows(fx, batch, operator, name) == want, (provider, batch)
                compared += provider != "hdfs"
    assert compared >= 2 * len(stores) * (len(providers) - 1), compared


@pytest.mark.parametrize("version", sorted(manifests()))
def test_the_join_stores_agree_with_each_other_and_the_input(
    extracted: Callable[[str], Path], version: str
) -> None:
    """A stream-stream join keeps, per side, how many rows each key has (keyToNumValues)
    and the rows by (key, index) (keyWithIndexToValue): the counts equal the rows held,
    the indexes run 0 .. n-1, and every row held is an input row."""
    fx = fixture(extracted(version), version, "join", "hdfs")
    location = open_spark_checkpoint(str(fx.checkpoint))
    batch = fx.last_batch
    inputs = {(r["key"], r["value"], r["ts"]) for r in rows_of(files_read(fx, batch))}
    for side, p in (("left", "l"), ("right", "r")):
        counts = {r["field0"]: r["value"] for b in location.read_state(
            batch, store=f"{side}-keyToNumValues") for r in b.to_pylist()}
        held = [r for b in location.read_state(batch, store=f"{side}-keyWithIndexToValue")
                for r in b.to_pylist()]
        assert counts and held
        indexes: dict[str, list[int]] = {}
        for r in held:
            assert r["field0"] == r[f"{p}key"]
            assert (r[f"{p}key"], r[f"{p}value"], r[f"{p}ts"]) in inputs, r
            assert _seconds(r[f"{p}time"]) == r[f"{p}ts"]
            indexes.setdefault(r["field0"], []).append(r["index"])
        assert {k: sorted(v) for k, v in indexes.items()} == {
            k: list(range(n)) for k, n in counts.items()}


def test_a_snapshot_zip_naming_a_path_is_refused_before_anything_is_written(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """A RocksDB snapshot zip is unzipped only after every member's name is checked to be
    a plain file name (a crafted ``../x`` would write outside the directory)."""
    import zipfile

    version = sorted(manifests())[-1]
    fx = copy_of(extracted(version), version, "dedup", "rocksdb", tmp_path / "dedup")
    location = open_spark_checkpoint(str(fx.checkpoint))
    newest = max((fx.checkpoint / "state/0/0").glob("*.zip"), key=lambda p: int(p.stem))
    with zipfile.ZipFile(newest) as archive:
        members = {i.filename: archive.read(i) for i in archive.infolist()}
    with zipfile.ZipFile(newest, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("../escaped", b"x")
    _one_line(lambda: list(location.read_state(partition=0)), "unsafe file name")
