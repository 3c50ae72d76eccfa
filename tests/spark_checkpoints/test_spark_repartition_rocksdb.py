"""Repartition of RocksDB-backed state on the committed fixtures, without Spark: every
RocksDB location (changelog checkpointing off and on) of every supported PySpark, from its
2 partitions to 5, then that copy from 5 to 1. Each DEST read offline holds the source's
rows, each key in the partition Spark's hash rule gives it; DEST verifies; the snapshot
``N+1.zip`` of each new partition names SSTs that are there with their sizes, counts its
keys, and carries the fields the location's Spark writes in a zip's metadata; the SSTs use
the table format version Spark's do; the source's listing (sizes and mtimes) does not
change; checkpoint format v2's new snapshots are named by new ids that ``commits/N`` records.
transformWithState's column families (every transform location, 2 -> 5 -> 1): every state
variable's rows equal the source's, each row in the partition Spark's hash of its
grouping key gives it, the zips carry the column family mapping and count the internal
families' keys apart. Refusals (prefix-scan keys, avro encoding, a table format RocksDB 8
cannot read) write nothing; a repartition cut short leaves no commit.
Spark loading these files: test_spark_repartition_live.py."""

from __future__ import annotations

import collections
import json
import os
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.spark_hash import partition_of
from statehold.spark_checkpoints.spark_types import Atomic
from statehold.spark_checkpoints.state_reader import store_records, store_schema
from statehold.spark_checkpoints.unsafe_row import decode_row
from tests.spark_checkpoints.test_spark_repartition import PARTITIONING
from tests.support.spark_locations.committed_fixtures import (
    TWS,
    TWS_GROUPING,
    copy_of,
    fixture,
    manifests,
)
from tests.support.spark_locations.disk_trees import listing

ROCKSDB = [(v, loc["query"], loc["provider"]) for v, m in sorted(manifests().items())
           for loc in m["locations"]
           if loc["provider"] in ("rocksdb", "rocksdb_changelog", "rocksdb_v2")
           and loc["query"] in PARTITIONING]


def _rows(location: Any, operator: int, store: str) -> collections.Counter[str]:
    return collections.Counter(
        json.dumps(row, sort_keys=True, default=str)
        for batch in location.read_state(operator=operator, store=store)
        for row in batch.to_pylist())


def _footer_version(sst: bytes) -> int:
    """A block-based table's format version: the four bytes before its magic number."""
    version: int = struct.unpack("<I", sst[-12:-8])[0]
    return version


def _zip_metadata(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as archive:
        text = archive.read("metadata").decode()
        names = set(archive.namelist())
    head, _, body = text.partition("\n")
    assert head == "v1"
    assert {"CURRENT", "metadata"} <= names and any(n.startswith("MANIFEST-") for n in names)
    assert any(n.startswith("OPTIONS-") for n in names)
    assert not names & {"LOCK", "LOG", "IDENTITY"}
    doc: dict[str, Any] = json.loads(body)
    return doc


def _check(root: Path, dest: Path, report: Any, query: str, partitions: int) -> None:
    """DEST holds the rows of the source at `root`, each in its partition, in zips Spark
    loads."""
    source = open_spark_checkpoint(str(root))
    out = open_spark_checkpoint(str(dest))
    assert out.verify().ok and out.listing().newest_committed == report.batch
    found = out.scan()
    meta = (dest / "offsets" / str(report.batch)).read_text().split("\n")[1]
    assert json.loads(meta)["conf"]["spark.sql.shuffle.partitions"] == str(partitions)
    n = report.batch + 1
    # checkpoint format v2: commits/N names each new snapshot by a new id, one per store
    ids = out.commit(report.batch).stateUniqueIds
    source_ids = source.commit(report.batch).stateUniqueIds
    if source_ids:
        assert ids and set(ids) == set(source_ids)
        fresh = [i for op_ids in ids.values() for part in op_ids for i in part]
        old = {i for op_ids in source_ids.values() for part in op_ids for i in part}
        assert len(set(fresh)) == len(fresh) and not set(fresh) & old
        assert {len(part) for op_ids in ids.values() for part in op_ids} == {
            len(source_ids[op][0]) for op in source_ids}
    else:
        assert not ids
    source_zips = sorted(root.glob("state/*/*/**/*.zip"))
    spark_extra = {k for k in _zip_metadata(source_zips[0]) if k not in ("sstFiles", "numKeys")}
    spark_version = _footer_version(next(iter(
        root.glob("state/*/*/**/SSTs/*.sst"))).read_bytes())
    for plan in report.operators:
        op = plan.operator
        held = {int(p.name) for p in (dest / "state" / str(op)).iterdir() if p.name.isdigit()}
        assert held == set(range(partitions))
        for store_plan in plan.stores:
            store = store_plan.store
            columns = PARTITIONING[query][op][store]
            assert store_plan.partitioning == columns
            rows = _rows(out, op, store)
            assert rows == _rows(source, op, store) and rows, (op, store)
            schema = store_schema(out, found, StoreId(op, 0, store))
            at = [i for i, f in enumerate(schema.key.fields) if f.name in columns]
            types = [schema.key.fields[i].type for i in at]
            for p in range(partitions):
                sid = StoreId(op, p, store)
                directory = dest / sid.prefix
                # one snapshot, no changelog: the restart loads the zip alone
                stem = str(n)
                if ids:
                    order = out.store_order(found, op)
                    stem = f"{n}_{ids[str(op)][p][order.index(store)]}"
                assert sorted(f.name for f in directory.iterdir() if f.is_file()
                              and not f.name.startswith(".")) == [f"{stem}.zip"]
                doc = _zip_metadata(directory / f"{stem}.zip")
                assert doc["numKeys"] == store_plan.per_partition[p]
                assert set(doc) - {"sstFiles", "numKeys"} == spark_extra
                listed = {f["dfsSstFileName"]: f["sizeBytes"] for f in doc["sstFiles"]}
                ssts = {f.name: f.stat().st_size for f in (directory / "SSTs").glob("*.sst")} \
                    if (directory / "SSTs").exists() else {}
                assert listed == ssts and bool(ssts) == bool(doc["numKeys"])
                for f in doc["sstFiles"]:
                    assert f["dfsSstFileName"].startswith(f["localFileName"][:-4] + "-")
                    data = (directory / "SSTs" / f["dfsSstFileName"]).read_bytes()
                    assert _footer_version(data) == spark_version == 5
                count = 0
                for key, _value in store_records(out, found, sid, report.batch):
                    assert key[:1] == b"\x00"
                    values = decode_row(key[1:], schema.key, "k")
                    assert partition_of([values[i] for i in at], types, partitions) == p
                    count += 1
                assert count == store_plan.per_partition[p]


@pytest.mark.parametrize(("version", "query", "provider"), ROCKSDB)
def test_rocksdb_repartitioned_to_5_then_to_1_keeps_every_row_where_sparks_hash_puts_it(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str,
) -> None:
    fx = fixture(extracted(version), version, query, provider)
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)

    five = source.repartition(str(tmp_path / "five"), partitions=5)

    assert listing(fx.checkpoint) == before
    assert (five.partitions_before, five.partitions, five.batch) == (2, 5, fx.last_batch)
    _check(fx.checkpoint, tmp_path / "five", five, query, 5)
    if fx.spark_4:
        for op in PARTITIONING[query]:
            meta = tmp_path / "five" / "state" / str(op) / "_metadata" / "metadata"
            doc = json.loads(meta.read_text().split("\n", 1)[1])
            assert {s["numPartitions"] for s in doc["stateStoreInfo"]} == {5}

    between = listing(tmp_path / "five")
    one = open_spark_checkpoint(str(tmp_path / "five")).repartition(
        str(tmp_path / "one"), partitions=1)

    assert listing(tmp_path / "five") == between
    assert (one.partitions_before, one.partitions) == (5, 1)
    _check(fx.checkpoint, tmp_path / "one", one, query, 1)


def _tws_rows(location: Any, state_var: str, partition: int | None = None
              ) -> collections.Counter[str]:
    return collections.Counter(
        json.dumps(row, sort_keys=True)
        for batch in location.read_state(state_var=state_var, partition=partition)
        for row in batch.to_pylist())


def _check_tws(root: Path, dest: Path, report: Any, partitions: int) -> None:
    source = open_spark_checkpoint(str(root))
    out = open_spark_checkpoint(str(dest))
    assert out.verify().ok and out.listing().newest_committed == report.batch
    [plan] = report.operators
    assert [s.partitioning for s in plan.stores] == [["key"]]
    meta = sorted((dest / "state/0/_metadata/v2").glob("[0-9]*"))[-1]
    doc = json.loads(meta.read_text().split("\n", 1)[1])
    assert {s["numPartitions"] for s in doc["stateStoreInfo"]} == {partitions}
    source_zip = _zip_metadata(sorted(root.glob("state/0/0/*.zip"))[-1])
    internal = {i for n, i in source_zip["columnFamilyMapping"].items()
                if source_zip["columnFamilyTypeMap"][n]}
    internal_rows = [0] * partitions
    for state_var, grouping in TWS_GROUPING.items():
        rows = _tws_rows(out, state_var)
        assert rows == _tws_rows(source, state_var) and rows, state_var
        for p in range(partitions):
            for row in _tws_rows(out, state_var, p):
                key = json.loads(row)
                assert partition_of([grouping(key)], [Atomic("string")], partitions) == p
                if state_var != "count":
                    internal_rows[p] += 1
    for p in range(partitions):
        zips = list((dest / "state/0" / str(p)).glob("*.zip"))
        assert len(zips) == 1
        zdoc = _zip_metadata(zips[0])
        assert {k: zdoc[k] for k in ("columnFamilyMapping", "columnFamilyTypeMap",
                                     "maxColumnFamilyId")} == {
            k: source_zip[k] for k in ("columnFamilyMapping", "columnFamilyTypeMap",
                                       "maxColumnFamilyId")}
        assert zdoc["numInternalKeys"] == internal_rows[p]
        assert zdoc["numKeys"] + zdoc["numInternalKeys"] == plan.stores[0].per_partition[p]
    assert internal and sum(internal_rows)


@pytest.mark.parametrize(("version", "provider"), TWS)
def test_transform_with_state_repartitioned_to_5_then_to_1_by_grouping_key(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, provider: str,
) -> None:
    fx = fixture(extracted(version), version, "transform", provider)
    before = listing(fx.checkpoint)

    five = open_spark_checkpoint(str(fx.checkpoint)).repartition(
        str(tmp_path / "five"), partitions=5)

    assert listing(fx.checkpoint) == before
    assert (five.partitions_before, five.partitions, five.batch) == (2, 5, fx.last_batch)
    _check_tws(fx.checkpoint, tmp_path / "five", five, 5)
    between = listing(tmp_path / "five")
    one = open_spark_checkpoint(str(tmp_path / "five")).repartition(
        str(tmp_path / "one"), partitions=1)
    assert listing(tmp_path / "five") == between
    assert (one.partitions_before, one.partitions) == (5, 1)
    _check_tws(fx.checkpoint, tmp_path / "one", one, 1)
    # each copy's operator metadata names its own state schema files, not its source's:
    # Spark opens them by that path when it restarts
    for copy in (tmp_path / "five", tmp_path / "one"):
        named = [p for meta in (copy / "state" / "0" / "_metadata" / "v2").glob("[0-9]*")
                 for info in json.loads(meta.read_text().split("\n", 1)[1])["stateStoreInfo"]
                 for p in info["stateSchemaFilePaths"]]
        assert named and all(p.startswith(f"file:{copy}/state/0/_stateSchema/") for p in named)
        assert all(Path(p.removeprefix("file:")).is_file() for p in named), named


def test_worker_processes_write_what_one_process_writes(
    extracted: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A location large enough for worker processes (the bar lowered to 0 here) is routed
    and built in them, one pool for its four stores (a join, changelog checkpointing on):
    the rows, their partitions and each new store's records equal one process's."""
    from statehold.spark_checkpoints import repartition as module

    fx = fixture(extracted("4.3.0"), "4.3.0", "join", "rocksdb_changelog")
    source = open_spark_checkpoint(str(fx.checkpoint))
    monkeypatch.setattr(module, "PARALLEL_BYTES", 1 << 62)
    alone = source.repartition(str(tmp_path / "alone"), partitions=3)
    monkeypatch.setattr(module, "PARALLEL_BYTES", 0)
    pools: list[int] = []
    real_pool = module._pool

    def counted(workers: int) -> Any:
        pools.append(workers)
        return real_pool(workers)

    monkeypatch.setattr(module, "_pool", counted)
    spread = source.repartition(str(tmp_path / "workers"), partitions=3)

    assert pools == [min(2, os.cpu_count() or 1)]
    assert spread.operators == alone.operators
    _check(fx.checkpoint, tmp_path / "workers", spread, "join", 3)
    out = open_spark_checkpoint(str(tmp_path / "workers"))
    one = open_spark_checkpoint(str(tmp_path / "alone"))
    stores = sorted(one.scan().stores)
    assert len(stores) == 12  # four stores, three partitions
    for sid in stores:
        assert (sorted(store_records(out, out.scan(), sid, fx.last_batch))
                == sorted(store_records(one, one.scan(), sid, fx.last_batch))), sid


def test_rocksdb_refusals_write_nothing(extracted: Callable[[str], Path], tmp_path: Path
                                        ) -> None:
    version = "4.3.0"
    root = extracted(version)
    refusals: list[tuple[Path, str]] = []
    # a window's store whose metadata says its keys are laid out for prefix scans by one
    # column, not the two its shuffle hashes (only a session window's prefix is routed by)
    prefixed = copy_of(root, version, "window", "rocksdb", tmp_path / "prefixed").checkpoint
    meta = prefixed / "state" / "0" / "_metadata" / "metadata"
    meta.write_text(meta.read_text().replace('"numColsPrefixKey":0', '"numColsPrefixKey":1'))
    (meta.parent / ".metadata.crc").unlink()
    refusals.append((prefixed, "prefix scans"))
    for name, old, new, message in [
        ("avro", '"spark.sql.streaming.stateStore.encodingFormat":"unsaferow"',
         '"spark.sql.streaming.stateStore.encodingFormat":"avro"', "encoded as avro"),
        ("format6", '"spark.sql.streaming.stateStore.rocksdb.formatVersion":"5"',
         '"spark.sql.streaming.stateStore.rocksdb.formatVersion":"6"', "formatVersion=6"),
    ]:
        changed = copy_of(root, version, "dedup", "rocksdb_changelog", tmp_path / name).checkpoint
        for path in (changed / "offsets").iterdir():
            if path.name.isdigit():
                assert old in path.read_text()
                path.write_text(path.read_text().replace(old, new))
                (changed / "offsets" / f".{path.name}.crc").unlink()
        refusals.append((changed, message))

    for i, (location, message) in enumerate(refusals):
        dest = tmp_path / f"dest{i}"
        with pytest.raises(SparkCheckpointError, match=message) as refused:
            open_spark_checkpoint(str(location)).repartition(str(dest), partitions=5)
        assert "\n" not in str(refused.value)
        assert not dest.exists(), message


def test_a_rocksdb_repartition_cut_short_leaves_no_commit(
    extracted: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statehold.spark_checkpoints.repartition as module

    fx = fixture(extracted("3.5.9"), "3.5.9", "window", "rocksdb_changelog")
    uploaded: list[str] = []
    real = module._hand_over

    def failing(*args: Any, **kwargs: Any) -> None:
        uploaded.append(args[2])
        if args[2].endswith("3/6.zip"):  # partition 3's snapshot, after its SSTs
            raise SparkCheckpointError("the disk is full")
        real(*args, **kwargs)

    monkeypatch.setattr(module, "_hand_over", failing)
    with pytest.raises(SparkCheckpointError, match="disk is full"):
        open_spark_checkpoint(str(fx.checkpoint)).repartition(str(tmp_path / "d"), partitions=5)
    assert (tmp_path / "d" / "state" / "0" / "2" / "6.zip").exists()
    assert any("/3/SSTs/" in k for k in uploaded)
    assert not (tmp_path / "d" / "commits").exists()
    assert open_spark_checkpoint(str(tmp_path / "d")).listing().newest_committed is None
