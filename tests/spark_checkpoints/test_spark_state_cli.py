"""``statehold state`` on a Spark checkpoint location (the committed fixtures, no Spark):
one store of one operator as a batch left it, as parquet or JSON lines, one file per
partition, the rows `read_state` gives; ``--batch``, ``--operator``, ``--store``,
``--schema``, ``--state-var`` (transformWithState); the record batches written as they
come; every refusal one line."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner, Result

from statehold.cli.app import app
from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_locations.committed_fixtures import Fixture, copy_of, fixture, manifests
from tests.support.spark_locations.handmade_files import big_hdfs_store
from tests.support.traced_peak import traced_peaks

runner = CliRunner()
VERSION = sorted(manifests())[-1]


def run(*args: str) -> Result:
    return runner.invoke(app, ["state", *args])


def run_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def refused(*args: str) -> str:
    """The one error line of a refused ``statehold state``."""
    result = run(*args)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("statehold: error: ")
    return line


def located(extracted: Callable[[str], Path], query: str, provider: str) -> Fixture:
    return fixture(extracted(VERSION), VERSION, query, provider)


def offline(fx: Fixture, batch: int, **kwargs: Any) -> pa.Table:
    location = open_spark_checkpoint(str(fx.checkpoint))
    return pa.Table.from_batches(list(location.read_state(batch, **kwargs)))


def test_parquet_holds_the_rows_read_state_gives(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    fx = located(extracted, "window", "rocksdb_changelog")
    doc = run_json(str(fx.checkpoint), "--out", str(tmp_path / "out"))
    assert (doc["kind"], doc["batch"], doc["operator"], doc["store"], doc["format"]) == (
        "spark-checkpoint", fx.last_batch, 0, "default", "parquet")
    assert doc["columns"] == ["window", "key", "count", "sum"] and doc["key_columns"] == 2
    assert doc["files"] == ["part-00000.parquet", "part-00001.parquet"]
    written = [pq.read_table(tmp_path / "out" / name) for name in doc["files"]]
    for partition, table in enumerate(written):
        want = offline(fx, fx.last_batch, partition=partition)
        assert table.num_rows and table.equals(want), partition
    assert doc["rows"] == sum(t.num_rows for t in written)
    text = run(str(fx.checkpoint), "--out", str(tmp_path / "again"))
    assert text.exit_code == 0
    assert f"batch {fx.last_batch}): {doc['rows']} rows, columns window, key" in text.stdout


def _plain_rows(table: pa.Table) -> Counter[str]:
    """`table`'s rows as the JSON lines give them (timestamps ISO text)."""
    rows = []
    for r in table.to_pylist():
        rows.append(json.dumps({k: v.isoformat() if hasattr(v, "isoformat") else v
                                for k, v in r.items()}, sort_keys=True))
    return Counter(rows)


def test_jsonl_of_a_join_store_at_an_older_batch(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    fx = located(extracted, "join", "hdfs")
    store = "left-keyWithIndexToValue"
    older = fx.last_batch - 1
    doc = run_json(str(fx.checkpoint), "--out", str(tmp_path / "out"), "--format", "jsonl",
                   "--store", store, "--batch", str(older))
    assert (doc["batch"], doc["store"], doc["key_columns"]) == (older, store, 2)
    lines = [json.loads(line) for name in doc["files"]
             for line in (tmp_path / "out" / name).read_text().splitlines()]
    assert len(lines) == doc["rows"] > 0
    assert all(list(line) == doc["columns"] for line in lines)
    assert all(line["ltime"].endswith("+00:00") for line in lines)
    got = Counter(json.dumps(line, sort_keys=True) for line in lines)
    assert got == _plain_rows(offline(fx, older, store=store))
    # the batch asked for, not the newest: the state differs between them
    assert got != _plain_rows(offline(fx, fx.last_batch, store=store))


def test_operator_and_store_chosen_or_asked_for(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    multi = located(extracted, "multi", "hdfs")
    assert "operators 0, 1; choose one with --operator" in refused(
        str(multi.checkpoint), "--out", str(tmp_path / "a"))
    doc = run_json(str(multi.checkpoint), "--out", str(tmp_path / "b"), "--operator", "1")
    assert doc["operator"] == 1 and doc["columns"] == ["key", "event_time", "__dummy__"]
    assert "no operator 3 (operators: 0, 1)" in refused(
        str(multi.checkpoint), "--out", str(tmp_path / "c"), "--operator", "3")
    assert "operators are numbers" in refused(
        str(multi.checkpoint), "--out", str(tmp_path / "c"), "--operator", "dedup")
    join = located(extracted, "join", "rocksdb")
    line = refused(str(join.checkpoint), "--out", str(tmp_path / "d"))
    assert "stores left-keyToNumValues, left-keyWithIndexToValue, right-keyToNumValues, " \
        "right-keyWithIndexToValue; choose one with --store" in line
    assert "no store nope" in refused(str(join.checkpoint), "--out", str(tmp_path / "d"),
                                      "--store", "nope")
    doc = run_json(str(join.checkpoint), "--out", str(tmp_path / "e"), "--store",
                   "right-keyToNumValues")
    assert doc["columns"] == ["field0", "value"] and doc["rows"] > 0
    assert not any((tmp_path / n).exists() for n in "acd")  # refused before writing


def test_refusals_are_one_line(extracted: Callable[[str], Path], tmp_path: Path) -> None:
    fx = located(extracted, "dedup", "hdfs")
    ckpt = str(fx.checkpoint)
    assert f"batch {fx.last_batch + 1} is not committed" in refused(
        ckpt, "--out", str(tmp_path / "a"), "--batch", str(fx.last_batch + 1))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert "not an empty directory" in refused(ckpt, "--out", str(tmp_path / "full"))
    assert "not a Spark checkpoint location, which --batch, --store apply to only" in refused(
        str(tmp_path / "full"), "--out", str(tmp_path / "b"), "--batch", "1", "--store", "s")
    transform = located(extracted, "transform", "rocksdb")
    assert "name a state variable (--state-var)" in refused(
        str(transform.checkpoint), "--out", str(tmp_path / "c"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"key": {"type": "struct", "fields": []}}')
    assert 'with "key" and "value"' in refused(ckpt, "--out", str(tmp_path / "d"),
                                              "--schema", str(bad))
    assert "cannot be read" in refused(ckpt, "--out", str(tmp_path / "d"), "--schema",
                                       str(tmp_path / "missing.json"))
    assert not any((tmp_path / n).exists() for n in "acd")


DEDUP_SCHEMA = {
    "key": {"type": "struct", "fields": [
        {"name": "key", "type": "string", "nullable": True, "metadata": {}},
        {"name": "event_time", "type": "timestamp", "nullable": True, "metadata": {}}]},
    "value": {"type": "struct", "fields": [
        {"name": "__dummy__", "type": "void", "nullable": True, "metadata": {}}]},
}


def test_a_store_without_a_schema_file_is_read_with_schema(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    fx = copy_of(extracted(VERSION), VERSION, "dedup", "rocksdb", tmp_path / "dedup")
    want = run_json(str(fx.checkpoint), "--out", str(tmp_path / "before"))
    shutil.rmtree(fx.checkpoint / "state/0/0/_metadata")
    line = refused(str(fx.checkpoint), "--out", str(tmp_path / "no"))
    assert "no state schema file" in line and "--schema FILE" in line
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(DEDUP_SCHEMA))
    got = run_json(str(fx.checkpoint), "--out", str(tmp_path / "after"), "--schema",
                   str(schema))
    assert (got["rows"], got["columns"]) == (want["rows"], want["columns"])
    for name in got["files"]:
        assert pq.read_table(tmp_path / "after" / name).equals(
            pq.read_table(tmp_path / "before" / name))


def test_written_a_record_batch_at_a_time(tmp_path: Path) -> None:
    """Parquet: a row group per record batch (4096 rows) as it comes. JSON lines: the peak
    of Python's memory for ten times the rows stays about the same."""
    root = big_hdfs_store(tmp_path / "big", 10_000)
    doc = run_json(str(root), "--out", str(tmp_path / "pq"))
    meta = pq.ParquetFile(tmp_path / "pq" / "part-00000.parquet").metadata
    assert (doc["rows"], meta.num_rows, meta.num_row_groups) == (10_000, 10_000, 3)
    stores = {rows: str(big_hdfs_store(tmp_path / str(rows), rows)) for rows in (10, 4_000, 40_000)}
    small, big = traced_peaks(
        "tests.support.traced_peak:state_command_jsonl", [stores[10], str(tmp_path / "w")],
        *([stores[rows], str(tmp_path / f"j{rows}")] for rows in (4_000, 40_000)))
    peaks = {4_000: small, 40_000: big}
    for rows in (4_000, 40_000):
        assert len((tmp_path / f"j{rows}" / "part-00000.jsonl").read_text().splitlines()) \
            == rows
    assert peaks[40_000] < 1.5 * peaks[4_000] + (1 << 20), peaks


def test_a_transform_with_state_variable_and_its_timers(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """``--state-var`` reads one of a transformWithState operator's column families; the
    operator read without it, or by a name it does not have, is refused in one line that
    names its state variables, and nothing is written."""
    fx = located(extracted, "transform", "rocksdb_changelog")
    ckpt = str(fx.checkpoint)
    for name, columns in [("count", ["key", "count"]),
                          ("$eventTimers_keyToTimestamp", ["key", "expiryTimestampMs"])]:
        out = tmp_path / name
        doc = run_json(ckpt, "--out", str(out), "--format", "jsonl", "--state-var", name)
        key_columns = 1 if name == "count" else 2  # the timers' key: (key, expiry)
        assert (doc["state_var"], doc["columns"], doc["key_columns"]) == (name, columns,
                                                                         key_columns)
        lines = [json.loads(line) for f in sorted(out.iterdir()) for line in
                 f.read_text().splitlines()]
        expected = offline(fx, fx.last_batch, state_var=name).to_pylist()
        assert Counter(json.dumps(r, sort_keys=True) for r in lines) == Counter(
            json.dumps(r, sort_keys=True) for r in expected) and lines
        assert doc["rows"] == len(lines)
    line = refused(ckpt, "--out", str(tmp_path / "none"))
    assert line.endswith("name a state variable (--state-var): count, "
                         "$eventTimers_keyToTimestamp")
    assert "no state variable 'nope'" in refused(ckpt, "--out", str(tmp_path / "none"),
                                                 "--state-var", "nope")
    window = str(located(extracted, "window", "rocksdb").checkpoint)
    assert "not transformWithState's" in refused(window, "--out", str(tmp_path / "none"),
                                                 "--state-var", "count")
    assert not (tmp_path / "none").exists()
