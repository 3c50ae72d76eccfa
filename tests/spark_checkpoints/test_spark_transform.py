"""Transform, delete and migrate on the committed fixtures, without Spark. Keys deleted by
a function and by ``statehold state delete`` are gone when DEST is read back, every other
row as it was and where Spark's hash puts it; the other operator's files are copied byte
for byte; values changed and a value column added (schema migration) read back, with
DEST's schema file saying the new schema (the key's text kept as Spark wrote it); a key
whose type changes is routed by its new value's hash. The source's listing never
changes. A stream-stream join's key deleted (both sides, one side, by the CLI's --side)
loses its count and every indexed row, the stores left consistent. Refusals (a full DEST,
an unknown operator, a join transformed, a batch not committed, fn returning other
columns, types or things, a side of what is not a join; for transformWithState: no state
variable named, a timer family, a new schema) come in one line with nothing written. A
transformWithState state variable transformed (a grouping key's value deleted, the others
changed) reads back so, its other families (the timers, the deleted key's too) as they
were; the identity writes back every record byte for byte. Restarts by Spark on DEST:
test_spark_repartition_live.py."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.spark_hash import partition_of
from statehold.spark_checkpoints.spark_types import Atomic, Field, Struct
from statehold.spark_checkpoints.state_reader import resolved, store_records, store_schema
from statehold.spark_checkpoints.state_schema import read_state_schema, read_state_schema_texts
from statehold.spark_checkpoints.tws_records import tws_records
from statehold.spark_checkpoints.tws_state import tws_operator
from statehold.spark_checkpoints.unsafe_row import decode_row
from tests.spark_checkpoints.test_spark_repartition import PARTITIONING
from tests.support.spark_locations.committed_fixtures import TWS, TWS_GROUPING, fixture, manifests
from tests.support.spark_locations.disk_trees import listing

#: (version, query, provider): every version's single-store queries over the layouts, and
#: the two-operator query (its operator 0 transformed, operator 1 copied).
CASES = [(v, q, p) for v in sorted(manifests())
         for q, p in (("window", "hdfs"), ("dedup", "rocksdb"), ("multi", "hdfs"),
                      ("pandas_state", "rocksdb_changelog"))
         if not (q == "pandas_state" and v.startswith("3."))]
# checkpoint format v2 (written by 4.3.0 only): commits/N names the new snapshots' ids
CASES += [(v, "multi", "rocksdb_v2") for v in sorted(manifests()) if v.startswith("4.3")]


def _rows(location: Any, operator: int) -> collections.Counter[str]:
    return collections.Counter(
        json.dumps(row, sort_keys=True, default=str)
        for batch in location.read_state(operator=operator) for row in batch.to_pylist())


def _placed(location: Any, op: int, partitions: int, columns: list[str],
            store: str = "default") -> int:
    """Every record of `op`'s `store` sits in the partition Spark's hash of `columns`
    gives it; the records counted."""
    found = location.scan()
    schema = store_schema(location, found, StoreId(op, 0, store))
    at = [i for i, f in enumerate(schema.key.fields) if f.name in columns]
    types = [schema.key.fields[i].type for i in at]
    rocksdb = found.stores[StoreId(op, 0, store)].provider == "rocksdb"
    count = 0
    for p in range(partitions):
        for key, _value in store_records(location, found, StoreId(op, p, store),
                                         location.listing().newest_committed):
            values = decode_row(key[1:] if rocksdb else key, schema.key, "k")
            assert partition_of([values[i] for i in at], types, partitions) == p
            count += 1
    return count


@pytest.mark.parametrize(("version", "query", "provider"), CASES)
def test_deleting_a_key_leaves_every_other_row_where_it_was(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str,
) -> None:
    fx = fixture(extracted(version), version, query, provider)
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)
    dest = tmp_path / "dest"

    report = source.transform(
        str(dest), operator=0, fn=lambda b: b.filter(pc.not_equal(b.column("key"), "k1")))

    assert listing(fx.checkpoint) == before
    old = _rows(source, 0)
    kept = collections.Counter({r: n for r, n in old.items() if json.loads(r)["key"] != "k1"})
    assert 0 < sum(kept.values()) < sum(old.values())
    out = open_spark_checkpoint(str(dest))
    assert out.verify().ok and out.listing().newest_committed == report.batch == fx.last_batch
    assert _rows(out, 0) == kept
    assert (report.rows_read, report.rows_written) == (sum(old.values()), sum(kept.values()))
    assert report.per_partition and sum(report.per_partition) == report.rows_written
    assert not report.key_schema_changed and not report.value_schema_changed
    assert _placed(out, 0, 2, PARTITIONING[query][0]["default"]) == report.rows_written
    # the schema file is the source's, byte for byte
    schema = "state/0/0/_metadata/schema"
    assert (dest / schema).read_bytes() == (fx.checkpoint / schema).read_bytes()
    # the state was written again (one snapshot a partition), the logs copied
    n = report.batch + 1
    snapshot = "zip" if provider.startswith("rocksdb") else "snapshot"
    ids = out.commit(report.batch).stateUniqueIds
    for p in (0, 1):
        stem = f"{n}_{ids['0'][p][0]}" if ids else str(n)
        assert (dest / "state" / "0" / str(p) / f"{stem}.{snapshot}").is_file()
    logs = ("offsets",) if ids else ("offsets", "commits")
    for log in logs:
        assert (dest / log / str(n - 1)).read_bytes() == (fx.checkpoint / log / str(n - 1)
                                                          ).read_bytes()
    if ids:  # v2: operator 0's snapshots under new ids, operator 1's ids as they were
        source_ids = source.commit(report.batch).stateUniqueIds
        assert source_ids is not None and ids["1"] == source_ids["1"]
        assert not {i for part in ids["0"] for i in part} & {
            i for part in source_ids["0"] for i in part}
    if query == "multi":  # operator 1 copied as it is
        op1 = {p.relative_to(fx.checkpoint) for p in (fx.checkpoint / "state" / "1").rglob("*")
               if p.is_file()}
        copied = {p.relative_to(dest) for p in (dest / "state" / "1").rglob("*") if p.is_file()}
        assert copied and copied <= op1
        assert all((dest / p).read_bytes() == (fx.checkpoint / p).read_bytes() for p in copied)
        assert _rows(out, 1) == _rows(source, 1)


def test_values_changed_and_a_column_added_read_back_with_the_new_schema(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    version = "4.3.0"
    for provider in ("hdfs", "rocksdb"):
        fx = fixture(extracted(version), version, "window", provider)
        source = open_spark_checkpoint(str(fx.checkpoint))
        before = listing(fx.checkpoint)
        old = sorted(_rows(source, 0).elements())

        # change values: every count times ten
        def tenfold(b: pa.RecordBatch) -> pa.RecordBatch:
            return b.set_column(2, "count", pc.multiply(b.column("count"), 10))

        changed = source.transform(str(tmp_path / provider / "x10"), operator=0, fn=tenfold)
        assert not changed.value_schema_changed
        rows = sorted(_rows(open_spark_checkpoint(changed.dest.removeprefix("file://")),
                            0).elements())
        assert [json.loads(r)["count"] for r in rows] == [
            json.loads(r)["count"] * 10 for r in old]

        # migrate: a value column `max` added, filled by fn
        new_value = pa.schema([("count", pa.int64()), ("sum", pa.int64()),
                               ("max", pa.int64())])

        def with_max(b: pa.RecordBatch) -> pa.RecordBatch:
            return b.append_column("max", pc.add(b.column("sum"), 1))

        dest = tmp_path / provider / "migrated"
        report = source.transform(str(dest), operator=0, fn=with_max, value_schema=new_value)

        assert listing(fx.checkpoint) == before
        assert report.value_schema_changed and not report.key_schema_changed
        schema_file = dest / "state" / "0" / "0" / "_metadata" / "schema"
        key_text, value_text = read_state_schema_texts(schema_file.read_bytes(), "s")
        source_key, _v = read_state_schema_texts(
            (fx.checkpoint / "state/0/0/_metadata/schema").read_bytes(), "s")
        assert key_text == source_key and "spark.timeWindow" in key_text
        parsed = read_state_schema(schema_file.read_bytes(), "s")
        assert [(f.name, f.type, f.nullable) for f in parsed.value.fields] == [
            ("count", Atomic("long"), True), ("sum", Atomic("long"), True),
            ("max", Atomic("long"), True)]
        # a checksum of the new file where Spark keeps them (HDFS-backed locations)
        crc = schema_file.parent / ".schema.crc"
        assert crc.exists() == (fx.checkpoint / "state/0/0/_metadata/.schema.crc").exists()
        out = open_spark_checkpoint(str(dest))
        assert out.verify().ok
        got = sorted(_rows(out, 0).elements())
        assert [{k: v for k, v in json.loads(r).items() if k != "max"} for r in got] == [
            json.loads(r) for r in old]
        assert all(json.loads(r)["max"] == json.loads(r)["sum"] + 1 for r in got)


def test_a_key_whose_type_changes_goes_where_its_new_value_hashes(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    """dropDuplicates' key column ``key`` ("k0".."k3") migrated to an integer (0..3): each
    key routed by Spark's hash of (integer, event_time), 2 -> 3 partitions too."""
    fx = fixture(extracted("3.5.9"), "3.5.9", "dedup", "hdfs")
    source = open_spark_checkpoint(str(fx.checkpoint))
    new_key = json.dumps({"type": "struct", "fields": [
        {"name": "key", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "event_time", "type": "timestamp", "nullable": True, "metadata": {}}]})

    def to_int(b: pa.RecordBatch) -> pa.RecordBatch:
        numbers = pc.cast(pc.utf8_slice_codeunits(b.column("key"), 1), pa.int32())
        return b.set_column(0, "key", numbers)

    for partitions in (None, 3):
        dest = tmp_path / f"p{partitions}"
        report = source.transform(str(dest), operator=0, fn=to_int, key_schema=new_key,
                                  partitions=partitions)
        assert report.key_schema_changed and report.partitions == (partitions or 2)
        out = open_spark_checkpoint(str(dest))
        assert out.verify().ok
        schema = store_schema(out, out.scan(), StoreId(0, 0, "default"))
        assert schema.key == Struct((Field("key", Atomic("integer")),
                                     Field("event_time", Atomic("timestamp"))))
        assert _placed(out, 0, partitions or 2, ["key", "event_time"]) == report.rows_read
        assert sorted(json.loads(r)["key"] for r in _rows(out, 0).elements()) == sorted(
            int(json.loads(r)["key"][1:]) for r in _rows(source, 0).elements())
    # the new type's hash sends some keys elsewhere than the old one's (so routing by
    # the old key would have put them in the wrong partition)
    ts = Atomic("timestamp")
    moved = [r for r in source.read_state(operator=0) for r in r.to_pylist()
             if partition_of([r["key"], 0], [Atomic("string"), ts], 2)
             != partition_of([int(r["key"][1:]), 0], [Atomic("integer"), ts], 2)]
    assert moved


def test_refusals_write_nothing(extracted: Callable[[str], Path], tmp_path: Path) -> None:
    version = "4.3.0"
    root = extracted(version)

    def at(query: str, provider: str = "hdfs") -> Any:
        return open_spark_checkpoint(str(fixture(root, version, query, provider).checkpoint))

    window = at("window")
    tws = at("transform", "rocksdb")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    keep: Callable[[Any], Any] = lambda b: b  # noqa: E731
    refusals: list[tuple[Any, str, dict[str, Any]]] = [
        (window, "not empty", {"dest": full}),
        (window, "no operator 3", {"operator": 3}),
        (at("join"), "stores left-keyToNumValues", {}),
        (tws, r"is transformWithState's: name a state variable \(state_var\): count;", {}),
        (tws, "Spark's own column family", {"state_var": "$eventTimers_keyToTimestamp"}),
        (tws, "has no state variable 'nope'", {"state_var": "nope"}),
        (tws, "evolves its state schemas itself",
         {"state_var": "count", "value_schema": pa.schema([("count", pa.int64())])}),
        (tws, r"fn returned columns \(key\), not the schema's \(key, count\)",
         {"state_var": "count", "fn": lambda b: b.drop_columns(["count"])}),
        (window, "not transformWithState's: it has no state variable 'count'",
         {"state_var": "count"}),
        (window, "batch 99", {"batch": 99}),
        (window, r"fn returned columns \(window, key, count\)",
         {"fn": lambda b: b.drop_columns(["sum"])}),
        (window, "fn returned column count as string",
         {"fn": lambda b: b.set_column(2, "count", pc.cast(b.column("count"), pa.string()))}),
        (window, "fn returned list", {"fn": lambda b: []}),
        (window, r"not the new schema's \(window, key, count, sum, max\)",
         {"value_schema": pa.schema([("count", pa.int64()), ("sum", pa.int64()),
                                     ("max", pa.int64())])}),
        (window, "Arrow type .*no Spark state type",
         {"value_schema": pa.schema([("count", pa.uint64())])}),
    ]
    for i, (location, message, args) in enumerate(refusals):
        dest = args.pop("dest", tmp_path / f"dest{i}")
        before = listing(Path(location.uri.removeprefix("file://")))
        with pytest.raises(SparkCheckpointError, match=message) as refused:
            location.transform(str(dest), **{"operator": 0, "fn": keep, **args})
        assert "\n" not in str(refused.value), message
        assert listing(Path(location.uri.removeprefix("file://"))) == before
        if dest == full:
            assert [p.name for p in full.iterdir()] == ["x"]
        else:
            assert not dest.exists(), message


def test_a_function_that_changes_its_columns_midway_leaves_no_commit(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    fx = fixture(extracted("4.0.5"), "4.0.5", "window", "hdfs")
    calls = []

    def fickle(b: pa.RecordBatch) -> pa.RecordBatch:
        calls.append(b.num_rows)
        return b if len(calls) < 3 else b.drop_columns(["sum"])

    with pytest.raises(SparkCheckpointError, match="fn returned columns"):
        open_spark_checkpoint(str(fx.checkpoint)).transform(
            str(tmp_path / "d"), operator=0, fn=fickle)
    assert not (tmp_path / "d" / "commits").exists()
    assert open_spark_checkpoint(str(tmp_path / "d")).listing().newest_committed is None


def test_the_cli_deletes_the_keys_of_a_json_lines_file(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    fx = fixture(extracted("4.3.0"), "4.3.0", "window", "rocksdb_changelog")
    source = open_spark_checkpoint(str(fx.checkpoint))
    rows = [json.loads(r) for r in _rows(source, 0).elements()]
    gone = rows[:2]
    keys = tmp_path / "keys.jsonl"
    # a window as ISO text and as microseconds, and a key the state does not hold
    lines = [{"window": {"start": str(r["window"]["start"]).replace(" ", "T"),
                         "end": str(r["window"]["end"]).replace(" ", "T")}, "key": r["key"]}
             for r in gone]
    lines.append({"window": {"start": 0, "end": 300_000_000}, "key": "nobody"})
    keys.write_text("".join(json.dumps(k) + "\n" for k in lines) + "\n")
    runner = CliRunner()
    done = runner.invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "d"),
                               "--operator", "0", "--keys", str(keys), "--json"])
    assert done.exit_code == 0, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert (doc["keys_given"], doc["deleted"], doc["not_found"], doc["verified"]) == (
        3, 2, 1, True)
    assert doc["rows_written"] == len(rows) - 2 and doc["kind"] == "spark-checkpoint"
    left = [json.loads(r) for r in _rows(open_spark_checkpoint(str(tmp_path / "d")),
                                         0).elements()]
    assert sorted(map(json.dumps, left)) == sorted(json.dumps(r) for r in rows[2:])
    # the read command is still `statehold state CKPT --out DIR`
    read = runner.invoke(app, ["state", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                               "--format", "jsonl"])
    assert read.exit_code == 0 and f"{len(rows) - 2} rows" in read.stdout

    keys.write_text('{"window": {"start": 0, "end": 1}, "key": "a"}\n[1]\n')
    bad = runner.invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "e"),
                              "--operator", "0", "--keys", str(keys)])
    assert bad.exit_code == 1 and "line 2: not a JSON object" in bad.stderr
    keys.write_text('{"key": "a"}\n')
    bad = runner.invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "e"),
                              "--operator", "0", "--keys", str(keys)])
    assert bad.exit_code == 1 and "not the key's columns (window, key)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()


_JOIN_STORES = [f"{side}-{kind}" for side in ("left", "right")
                for kind in ("keyToNumValues", "keyWithIndexToValue")]
#: The join's committed locations: every layout of 4.3.0 (format v2 too), 3.5.9's without
#: operator metadata.
JOIN_CASES = [("4.3.0", p) for p in ("hdfs", "rocksdb", "rocksdb_changelog", "rocksdb_v2")]
JOIN_CASES += [("3.5.9", "hdfs"), ("3.5.9", "rocksdb_changelog")]


@pytest.mark.parametrize(("version", "provider"), JOIN_CASES)
def test_deleting_a_join_key_removes_its_count_and_every_buffered_row(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, provider: str,
) -> None:
    """A join key deleted from both sides, then from the left only: its count and each
    indexed row gone from the side's two stores (the other side's as they were), every
    other record kept where Spark's hash of its join key puts it; DEST verifies (deep);
    the source never changes."""
    fx = fixture(extracted(version), version, "join", provider)
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)
    old = {store: _store_rows(source, store) for store in _JOIN_STORES}
    victim = json.loads(next(iter(old["left-keyToNumValues"])))["field0"]
    assert any(json.loads(r)["field0"] == victim for r in old["right-keyWithIndexToValue"])
    for side in (None, "left"):
        dest = tmp_path / f"dest-{side}"
        report = source.delete_keys(str(dest), operator=0, side=side,
                                    keys=[{"field0": victim}, {"field0": "nobody"}])

        assert listing(fx.checkpoint) == before
        changed = [s for s in _JOIN_STORES if side is None or s.startswith(side)]
        assert (report.keys_given, report.deleted, report.not_found, report.side) == (
            2, 1, 1, side)
        out = open_spark_checkpoint(str(dest))
        assert out.verify(deep=True).ok
        assert out.listing().newest_committed == report.batch == fx.last_batch
        for store in _JOIN_STORES:
            kept = collections.Counter({r: n for r, n in old[store].items()
                                        if json.loads(r)["field0"] != victim
                                        or store not in changed})
            assert _store_rows(out, store) == kept, (side, store)
            gone = sum(old[store].values()) - sum(kept.values())
            assert report.removed.get(store, 0) == gone, store
            if store in changed:
                assert gone > 0, store
            assert _placed(out, 0, 2, ["field0"], store) == sum(kept.values())
        assert set(report.removed) == set(changed)
        # the count of each key still held is the number of its indexed rows, 0..n-1
        for s in ("left", "right"):
            counts = {json.loads(r)["field0"]: json.loads(r)["value"]
                      for r in _store_rows(out, f"{s}-keyToNumValues")}
            indexes = collections.defaultdict(list)
            for r in _store_rows(out, f"{s}-keyWithIndexToValue").elements():
                indexes[json.loads(r)["field0"]].append(json.loads(r)["index"])
            assert {k: sorted(v) for k, v in indexes.items()} == {
                k: list(range(n)) for k, n in counts.items()}, s


def _store_rows(location: Any, store: str) -> collections.Counter[str]:
    return collections.Counter(
        json.dumps(row, sort_keys=True, default=str)
        for batch in location.read_state(operator=0, store=store) for row in batch.to_pylist())


def test_the_cli_deletes_a_join_key_from_one_side(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    fx = fixture(extracted("4.3.0"), "4.3.0", "join", "rocksdb_changelog")
    keys = tmp_path / "keys.jsonl"
    keys.write_text('{"field0": "k1"}\n')
    runner = CliRunner()
    done = runner.invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "d"),
                               "--operator", "0", "--keys", str(keys), "--side", "right",
                               "--json"])
    assert done.exit_code == 0, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert (doc["deleted"], doc["not_found"], doc["side"], doc["verified"]) == (
        1, 0, "right", True)
    assert sorted(doc["removed"]) == ["right-keyToNumValues", "right-keyWithIndexToValue"]
    out = open_spark_checkpoint(str(tmp_path / "d"))
    assert not [r for r in _store_rows(out, "right-keyWithIndexToValue")
                if json.loads(r)["field0"] == "k1"]
    assert [r for r in _store_rows(out, "left-keyWithIndexToValue")
            if json.loads(r)["field0"] == "k1"]
    # a side is a join's; a side is left or right
    window = fixture(extracted("4.3.0"), "4.3.0", "window", "hdfs")
    bad = runner.invoke(app, ["state", "delete", str(window.checkpoint), str(tmp_path / "e"),
                              "--operator", "0", "--keys", str(keys), "--side", "left"])
    assert bad.exit_code == 1 and "not a stream-stream join" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = runner.invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "e"),
                              "--operator", "0", "--keys", str(keys), "--side", "middle"])
    assert bad.exit_code != 0
    with pytest.raises(SparkCheckpointError, match="left or right"):
        open_spark_checkpoint(str(fx.checkpoint)).delete_keys(
            str(tmp_path / "e"), operator=0, keys=[{"field0": "k1"}], side="middle")
    keys.write_text('{"key": "k1"}\n')
    with pytest.raises(SparkCheckpointError, match=r"not the key's columns \(field0\)"):
        open_spark_checkpoint(str(fx.checkpoint)).delete_keys(
            str(tmp_path / "e"), operator=0, keys=[{"key": "k1"}])
    assert not (tmp_path / "e").exists()




def _tws_rows(location: Any, state_var: str) -> list[dict[str, Any]]:
    return [r for b in location.read_state(state_var=state_var) for r in b.to_pylist()]


@pytest.mark.parametrize(("version", "provider"), TWS)
def test_a_deleted_grouping_key_loses_its_state_and_its_timers(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, provider: str,
) -> None:
    """``delete_keys`` on a transformWithState operator: the grouping keys given lose
    their records in every column family (the value state and both timer families), every
    other record kept as it was, where Spark's hash of its grouping key puts it."""
    fx = fixture(extracted(version), version, "transform", provider)
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)
    gone = {"k0", "k2"}
    report = source.delete_keys(str(tmp_path / "d"), operator=0,
                                keys=[{"key": k} for k in [*sorted(gone), "nobody"]])
    assert listing(fx.checkpoint) == before
    out = open_spark_checkpoint(str(tmp_path / "d"))
    assert out.verify().ok
    removed = 0
    for state_var, grouping in TWS_GROUPING.items():
        rows = _tws_rows(source, state_var)
        left = _tws_rows(out, state_var)
        kept = [r for r in rows if grouping(r) not in gone]
        assert len(kept) < len(rows) and kept, state_var
        assert sorted(map(json.dumps, left)) == sorted(map(json.dumps, kept)), state_var
        removed += len(rows) - len(kept)
        for p in range(2):
            for r in out.read_state(state_var=state_var, partition=p):
                for row in r.to_pylist():
                    assert partition_of([grouping(row)], [Atomic("string")], 2) == p
    assert (report.keys_given, report.not_found, report.deleted) == (3, 1, removed)
    assert report.rows_written == report.rows_read - removed


def test_the_cli_deletes_grouping_keys_of_transform_with_state(
    extracted: Callable[[str], Path], tmp_path: Path,
) -> None:
    fx = fixture(extracted("4.3.0"), "4.3.0", "transform", "rocksdb_v2")
    keys = tmp_path / "keys.jsonl"
    keys.write_text('{"key": "k1"}\n')
    done = CliRunner().invoke(app, ["state", "delete", str(fx.checkpoint), str(tmp_path / "d"),
                                    "--operator", "0", "--keys", str(keys), "--json"])
    assert done.exit_code == 0, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert (doc["keys_given"], doc["not_found"], doc["verified"]) == (1, 0, True)
    out = open_spark_checkpoint(str(tmp_path / "d"))
    assert [r for r in _tws_rows(out, "count") if r["key"] == "k1"] == []
    assert all(r["key"]["key"] != "k1" for r in _tws_rows(out, "$eventTimers_keyToTimestamp"))
    bad = keys.with_name("bad.jsonl")
    bad.write_text('{"name": "k1"}\n')
    refused = CliRunner().invoke(app, ["state", "delete", str(fx.checkpoint),
                                       str(tmp_path / "e"), "--operator", "0", "--keys",
                                       str(bad)])
    assert refused.exit_code == 1 and "not the key's columns (key)" in refused.stderr
    assert not (tmp_path / "e").exists()


def _raw_records(location: Any) -> dict[int, list[tuple[bytes, bytes]]]:
    """Each partition's records of transformWithState operator 0, every column family's,
    as their bytes."""
    found = location.scan()
    tws = tws_operator(location, found, 0)
    assert tws is not None
    out = {}
    for sid in sorted(s for s in found.stores if s.operator == 0):
        _files, needs = resolved(location, found, sid, found.newest_committed)
        out[sid.partition] = list(tws_records(location, sid, needs, tws.delimiter,
                                              tws.list_prefixes))
    return out


@pytest.mark.parametrize("provider", ["rocksdb", "rocksdb_changelog"])
def test_a_state_variable_transformed_keeps_every_other_family(
    extracted: Callable[[str], Path], tmp_path: Path, provider: str,
) -> None:
    """``transform(state_var="count")`` on the transform fixture: ``fn`` gets the
    variable's rows as ``read_state`` gives them; a grouping key's count deleted and the
    others' multiplied by ten read back so, each row where Spark's hash of its grouping
    key puts it (3 partitions: routed, not copied); the timers, the deleted key's too,
    as they were. The identity writes every record back byte for byte."""
    fx = fixture(extracted("4.3.0"), "4.3.0", "transform", provider)
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)
    given: list[dict[str, Any]] = []

    def fn(b: pa.RecordBatch) -> pa.RecordBatch:
        given.extend(b.to_pylist())
        kept = b.filter(pc.not_equal(b.column("key"), "k0"))
        return kept.set_column(1, "count", pc.multiply(kept.column("count"), 10))

    report = source.transform(str(tmp_path / "d"), operator=0, state_var="count", fn=fn,
                              partitions=3)
    assert listing(fx.checkpoint) == before
    rows = _tws_rows(source, "count")
    assert sorted(map(json.dumps, given)) == sorted(map(json.dumps, rows))
    expected = [{"key": r["key"], "count": r["count"] * 10} for r in rows if r["key"] != "k0"]
    assert len(expected) == len(rows) - 1
    out = open_spark_checkpoint(str(tmp_path / "d"))
    assert out.verify().ok
    assert sorted(map(json.dumps, _tws_rows(out, "count"))) == sorted(map(json.dumps, expected))
    assert (report.state_var, report.rows_read, report.rows_written, report.partitions) == (
        "count", len(rows), len(expected), 3)
    assert not report.key_schema_changed and not report.value_schema_changed
    for state_var, grouping in TWS_GROUPING.items():
        if state_var != "count":
            left = _tws_rows(out, state_var)
            assert sorted(map(json.dumps, left)) == sorted(
                map(json.dumps, _tws_rows(source, state_var))), state_var
            assert any(grouping(r) == "k0" for r in left), state_var
        for p in range(3):
            for b in out.read_state(state_var=state_var, partition=p):
                for row in b.to_pylist():
                    assert partition_of([grouping(row)], [Atomic("string")], 3) == p

    same = source.transform(str(tmp_path / "same"), operator=0, state_var="count",
                            fn=lambda b: b)
    assert same.rows_written == same.rows_read == len(rows)
    assert _raw_records(open_spark_checkpoint(str(tmp_path / "same"))) == _raw_records(source)
