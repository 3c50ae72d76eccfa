"""Repartition on the committed fixtures, without Spark: every HDFS-backed location of
every supported PySpark, from its 2 partitions to 5 and to 1. DEST read offline holds the
source's rows (the same multiset per operator and store), each in the partition Spark's
hash rule gives its partitioning columns (the operator's own: named here per query; the
same rule puts every source key where Spark put it),
DEST's offsets and operator metadata say M and DEST verifies; the source's listing (sizes
and mtimes) does not change. Refusals (a full DEST, an unknown operator, a location whose
shuffle may hash fewer columns) write nothing, and a repartition cut short
leaves no commit. The snapshot's lz4 blocks carry the headers and checksums Spark's own
do. RocksDB-backed state: test_spark_repartition_rocksdb.py. The murmur3 against Spark's
and a restart by Spark: test_spark_repartition_live.py."""

from __future__ import annotations

import collections
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.spark.routing import spark_hash_int
from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.spark_hash import partition_of, spark_hash
from statehold.spark_checkpoints.spark_types import Atomic
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_reader import store_records, store_schema
from statehold.spark_checkpoints.state_records import records
from statehold.spark_checkpoints.state_writer import SnapshotWriter
from statehold.spark_checkpoints.unsafe_row import decode_row
from tests.support.spark_locations.committed_fixtures import copy_of, fixture, manifests
from tests.support.spark_locations.disk_trees import listing

#: The partitioning columns each query's operators hash (operator -> store -> columns).
PARTITIONING = {
    "window": {0: {"default": ["window", "key"]}},
    "dedup": {0: {"default": ["key", "event_time"]}},
    "join": {0: {f"{side}-{kind}": ["field0"] for side in ("left", "right")
                 for kind in ("keyToNumValues", "keyWithIndexToValue")}},
    "pandas_state": {0: {"default": ["key"]}},
    "multi": {0: {"default": ["window", "key"]}, 1: {"default": ["key", "event_time"]}},
}
HDFS = [(v, loc["query"]) for v, m in sorted(manifests().items()) for loc in m["locations"]
        if loc["provider"] == "hdfs"]


def _rows(location: Any, operator: int, store: str) -> collections.Counter[str]:
    return collections.Counter(
        json.dumps(row, sort_keys=True, default=str)
        for batch in location.read_state(operator=operator, store=store)
        for row in batch.to_pylist())


def _conf(root: Path, batch: int) -> dict[str, str]:
    meta = (root / "offsets" / str(batch)).read_text().split("\n")[1]
    conf: dict[str, str] = json.loads(meta)["conf"]
    return conf


@pytest.mark.parametrize("partitions", [5, 1])
@pytest.mark.parametrize(("version", "query"), HDFS)
def test_repartition_keeps_every_row_in_the_partition_sparks_hash_gives_it(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str,
    partitions: int,
) -> None:
    fx = fixture(extracted(version), version, query, "hdfs")
    source = open_spark_checkpoint(str(fx.checkpoint))
    before = listing(fx.checkpoint)
    dest = tmp_path / "dest"

    report = source.repartition(str(dest), partitions=partitions)

    assert listing(fx.checkpoint) == before
    assert report.verified and report.partitions_before == 2
    assert report.partitions == partitions and report.batch == fx.last_batch
    assert {o.operator: {s.store: s.partitioning for s in o.stores}
            for o in report.operators} == PARTITIONING[query]
    out = open_spark_checkpoint(str(dest))
    assert out.verify().ok and out.listing().newest_committed == report.batch
    found = out.scan()
    assert _conf(dest, report.batch)["spark.sql.shuffle.partitions"] == str(partitions)
    assert _conf(fx.checkpoint, report.batch)["spark.sql.shuffle.partitions"] == "2"
    for op, stores in PARTITIONING[query].items():
        meta = dest / "state" / str(op) / "_metadata" / "metadata"
        if fx.spark_4:
            doc = json.loads(meta.read_text().split("\n", 1)[1])
            assert {s["numPartitions"] for s in doc["stateStoreInfo"]} == {partitions}
        else:
            assert not meta.exists()  # 3.5 writes none
        held = {int(p.name) for p in (dest / "state" / str(op)).iterdir() if p.name.isdigit()}
        assert held == set(range(partitions))
        for store, columns in stores.items():
            rows = _rows(out, op, store)
            assert rows == _rows(source, op, store) and rows, (op, store)
            schema = store_schema(out, found, StoreId(op, 0, store))
            at = [i for i, f in enumerate(schema.key.fields) if f.name in columns]
            types = [schema.key.fields[i].type for i in at]
            for p in range(partitions):
                for key, _value in store_records(out, found, StoreId(op, p, store),
                                                 report.batch):
                    values = decode_row(key, schema.key, "k")
                    assert partition_of([values[i] for i in at], types, partitions) == p
            # Spark's own placement of the source's keys is the oracle of the rule (the
            # hash and the columns): each sits where the rule with 2 partitions puts it
            for p in range(2):
                for key, _value in store_records(source, source.scan(),
                                                 StoreId(op, p, store), report.batch):
                    values = decode_row(key, schema.key, "k")
                    assert partition_of([values[i] for i in at], types, 2) == p


def test_refusals_write_nothing(extracted: Callable[[str], Path], tmp_path: Path) -> None:
    version = "4.3.0"
    root = extracted(version)
    hdfs = open_spark_checkpoint(str(fixture(root, version, "join", "hdfs").checkpoint))
    refusals: list[tuple[Any, str, dict[str, Any]]] = []
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    refusals.append((hdfs, "not empty", {"dest": full}))
    refusals.append((hdfs, "partitions must be", {"partitions": 0}))
    # an operator whose partitioning statehold does not know
    unknown = copy_of(root, version, "window", "hdfs", tmp_path / "unknown").checkpoint
    meta = unknown / "state" / "0" / "_metadata" / "metadata"
    meta.write_text(meta.read_text().replace("stateStoreSave", "somethingNew"))
    (unknown / "state" / "0" / "_metadata" / ".metadata.crc").unlink()
    refusals.append((open_spark_checkpoint(str(unknown)), "somethingNew", {}))
    # a location whose shuffle may hash a subset of the key (Spark before 3.2's plans)
    loose = copy_of(root, version, "dedup", "hdfs", tmp_path / "loose").checkpoint
    for path in (loose / "offsets").iterdir():
        if path.name.isdigit():
            path.write_text(path.read_text().replace(
                '"spark.sql.streaming.statefulOperator.useStrictDistribution":"true"',
                '"spark.sql.streaming.statefulOperator.useStrictDistribution":"false"'))
            (loose / "offsets" / f".{path.name}.crc").unlink()
    refusals.append((open_spark_checkpoint(str(loose)), "useStrictDistribution", {}))

    for i, (location, message, args) in enumerate(refusals):
        dest = args.pop("dest", tmp_path / f"dest{i}")
        with pytest.raises(SparkCheckpointError, match=message) as refused:
            location.repartition(str(dest), **{"partitions": 5, **args})
        assert "\n" not in str(refused.value)
        if dest == full:
            assert [p.name for p in full.iterdir()] == ["x"]
        else:
            assert not dest.exists(), message


def test_one_cut_short_leaves_no_commit(
    extracted: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statehold.spark_checkpoints.repartition as module

    fx = fixture(extracted("4.0.5"), "4.0.5", "multi", "hdfs")
    calls = []
    real = module._upload

    def failing(*args: Any, **kwargs: Any) -> None:
        calls.append(args[2])
        if len(calls) == 7:  # operator 1's second snapshot
            raise SparkCheckpointError("the disk is full")
        real(*args, **kwargs)

    monkeypatch.setattr(module, "_upload", failing)
    with pytest.raises(SparkCheckpointError, match="disk is full"):
        open_spark_checkpoint(str(fx.checkpoint)).repartition(str(tmp_path / "d"), partitions=5)
    assert (tmp_path / "d" / "state" / "0" / "4").exists()
    assert not (tmp_path / "d" / "commits").exists()
    assert open_spark_checkpoint(str(tmp_path / "d")).listing().newest_committed is None


def test_the_cli_command(extracted: Callable[[str], Path], tmp_path: Path) -> None:
    ckpt = str(fixture(extracted("3.5.9"), "3.5.9", "dedup", "hdfs").checkpoint)
    runner = CliRunner()
    done = runner.invoke(app, ["repartition", ckpt, str(tmp_path / "a"), "--partitions", "3",
                               "--batch", "4", "--json"])
    assert done.exit_code == 0, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert (doc["batch"], doc["partitions"], doc["verified"]) == (4, 3, True)
    [op] = doc["operators"]
    assert op["known_from"] == "stores" and op["stores"][0]["rows"] == sum(
        op["stores"][0]["per_partition"])
    text = runner.invoke(app, ["repartition", ckpt, str(tmp_path / "b"), "--partitions", "4"])
    assert text.exit_code == 0 and "from 2 to 4 partitions" in text.stdout
    again = runner.invoke(app, ["repartition", ckpt, str(tmp_path / "b"), "--partitions", "4"])
    assert again.exit_code == 1 and "not empty" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_snapshot_blocks_carry_the_headers_and_checksums_sparks_do(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """A Spark-written snapshot's records written again: each lz4 block's token,
    decompressed length and xxHash32 checksum (which Spark's reader checks) equal the
    original's, and the stream decodes to the same records."""
    for version in sorted(manifests()):
        ckpt = fixture(extracted(version), version, "window", "hdfs").checkpoint
        for original in sorted(ckpt.glob("state/0/*/*.snapshot")):
            data = original.read_bytes()
            recs = list(records(decompressed(iter([data]), "o"), "o", deletes=False))
            with (tmp_path / "s").open("wb") as f:
                writer = SnapshotWriter(f)
                for k, v in recs:
                    assert v is not None
                    writer.add(k, v)
                writer.close()
            ours = (tmp_path / "s").read_bytes()
            assert _headers(ours) == _headers(data), original
            assert list(records(decompressed(iter([ours]), "n"), "n", deletes=False)) == recs


def _headers(stream: bytes) -> list[tuple[int, int, int]]:
    """(token, decompressed length, checksum) of each block."""
    out, at = [], 0
    while at < len(stream):
        token, packed, raw, check = struct.unpack_from("<Biii", stream, at + 8)
        out.append((token, raw, check))
        at += 21 + packed
    return out


@pytest.mark.parametrize("value", [0, 1, -1, 42, 2**31 - 1, -(2**31), 123456789])
def test_murmur3_of_an_int_equals_the_routing_hash(value: int) -> None:
    """statehold.spark.routing's hashInt (checked against Spark in tests/test_routing.py)
    and this one agree; strings and the rest are checked against Spark live."""
    assert spark_hash([value], [Atomic("integer")]) == spark_hash_int(value)
    assert spark_hash([None], [Atomic("integer")]) == 42
