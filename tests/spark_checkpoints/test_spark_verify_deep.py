"""`verify --deep` on the committed fixtures of every PySpark (tests/fixtures/spark/, written
by real Spark 3.5, 4.0 and 4.3; no JVM here): every undamaged location of every state store
layout loads; then each damage a restart would fail on is planted in a copy, one case
each, and `verify --deep` names the file, what is wrong with it and the Spark bug whose
signature it carries, through the Python API and the CLI (exit 1, with and without
``--json``)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_records import records
from tests.support.spark_locations import handmade_files as handmade
from tests.support.spark_locations.committed_fixtures import copy_of, fixture, manifests
from tests.support.spark_locations.planted_damage import (
    CASES,
    Plant,
    needs_of,
    queries,
    sst_of_the_same_size,
)

VERSIONS = sorted(manifests())
runner = CliRunner()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_undamaged_location_loads(
    extracted: Callable[[str], Path], version: str
) -> None:
    providers = {q["provider"] for q in manifests()[version]["locations"]}
    assert {"hdfs", "rocksdb", "rocksdb_changelog"} <= providers
    for provider in sorted(providers):
        for query in queries(version, provider):
            fx = fixture(extracted(version), version, query, provider)
            location = open_spark_checkpoint(str(fx.checkpoint))
            report = location.verify(deep=True)
            assert report.ok, (fx.id, report.problems)
            assert report.deep and report.stores_loaded == len(location.scan().stores), fx.id
            assert report.records_read > 0, fx.id
            # transformWithState's stores have no schema file: read, not decoded
            assert bool(report.not_decoded) == (query == "transform"), fx.id
        # the CLI, once per layout
        result = runner.invoke(app, ["verify", str(fx.checkpoint), "--deep", "--json"])
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["ok"] is True


PARAMS = [(v, name, plant, provider, qs) for v in VERSIONS
          for name, plant, provider, qs in CASES if queries(v, provider)]


@pytest.mark.parametrize(("version", "name", "plant", "provider", "tried"), PARAMS,
                         ids=[f"{v}-{n}-{p}" for v, n, _f, p, _q in PARAMS])
def test_verify_deep_names_each_damage(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, name: str, plant: Plant,
    provider: str, tried: list[str],
) -> None:
    damage = None
    for query in tried:
        fx = copy_of(extracted(version), version, query, provider, tmp_path / query)
        location = open_spark_checkpoint(str(fx.checkpoint))  # whole: the test above
        damage = plant(fx.checkpoint, needs_of(location))
        if damage is not None:
            break
        shutil.rmtree(tmp_path / query)
    assert damage is not None, f"no location of {provider} to plant {name} in: {tried}"

    report = location.verify(deep=True)
    assert not report.ok
    named = [(p.path, p.kind, p.spark_bug) for p in report.problems if p.kind]
    assert (damage.path, damage.kind, damage.bug) in named, report.problems
    assert all("\n" not in p.problem and "statehold-deep-" not in p.problem
               for p in report.problems), report.problems

    plain = runner.invoke(app, ["verify", str(fx.checkpoint), "--deep"])
    assert plain.exit_code == 1, plain.stdout
    [line] = [x for x in plain.stdout.splitlines()
              if x.startswith(f"{damage.path}: {damage.kind}: ")]
    assert damage.bug is None or damage.bug in line, line
    as_json = runner.invoke(app, ["verify", str(fx.checkpoint), "--deep", "--json"])
    assert as_json.exit_code == 1, as_json.stdout
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["deep"] is True
    assert {"path": damage.path, "kind": damage.kind, "spark_bug": damage.bug} in [
        {k: p[k] for k in ("path", "kind", "spark_bug")} for p in doc["problems"]]


class Recorded:
    """A `Progress` that keeps what it is told."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.done = 0

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        self.lines.append(description)

    def advance(self, amount: int) -> None:
        self.done += amount


def test_operator_and_batch_bound_the_load_with_a_progress_line_per_store(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    version = VERSIONS[-1]
    fx = copy_of(extracted(version), version, "multi", "rocksdb_changelog", tmp_path / "m")
    location = open_spark_checkpoint(str(fx.checkpoint))
    found = location.scan()
    of_one = sorted(str(s) for s in found.stores if s.operator == 1)
    assert of_one and len(of_one) < len(found.stores)
    progress = Recorded()
    batch = sorted(found.commits)[-2]
    report = location.verify(batch, deep=True, operator=1, progress=progress)
    assert report.ok and report.batch == batch and report.operator == 1
    assert report.stores_loaded == len(of_one)
    assert progress.lines == [f"verify --deep {s} version {batch + 1}" for s in of_one]
    assert progress.done > 0
    # the CLI's flags
    result = runner.invoke(app, ["verify", str(fx.checkpoint), "--deep", "--operator", "1",
                                 "--batch", str(batch), "--json"])
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert (doc["operator"], doc["batch"], doc["stores_loaded"]) == (1, batch, len(of_one))
    # damage in operator 0 is not loaded with --operator 1, and is with --operator 0
    zips = sorted(fx.checkpoint.glob("state/0/0/*.zip"))
    for z in zips:
        z.write_bytes(z.read_bytes()[:20])
    assert location.verify(batch, deep=True, operator=1).stores_loaded == len(of_one)
    assert not location.verify(batch, deep=True, operator=0).ok
    with pytest.raises(SparkCheckpointError, match="deep verify only"):
        location.verify(operator=0)
    with pytest.raises(SparkCheckpointError, match="no state store of operator 7"):
        location.verify(deep=True, operator=7)
    refused = runner.invoke(app, ["verify", str(fx.checkpoint), "--operator", "0"])
    assert refused.exit_code == 1


def test_the_shallow_verify_loads_nothing(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """Without --deep, an SST swapped for another of its size passes (only RocksDB can
    tell): verify keeps its behaviour, and the deep load is what finds it."""
    version = VERSIONS[-1]
    fx = copy_of(extracted(version), version, "join", "rocksdb", tmp_path / "j")
    location = open_spark_checkpoint(str(fx.checkpoint))
    assert sst_of_the_same_size(fx.checkpoint, needs_of(location)) is not None
    shallow = location.verify()
    assert shallow.ok and not shallow.deep and shallow.stores_loaded == 0
    assert not location.verify(deep=True).ok


def test_records_that_do_not_decode_with_the_schema_are_named(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """Another query's schema file: every record reads to its end, none decodes."""
    version = VERSIONS[-1]
    fx = copy_of(extracted(version), version, "window", "hdfs", tmp_path / "w")
    other = fixture(extracted(version), version, "pandas_state", "hdfs")
    shutil.copy(other.checkpoint / "state/0/0/_metadata/schema",
                fx.checkpoint / "state/0/0/_metadata/schema")
    report = open_spark_checkpoint(str(fx.checkpoint)).verify(deep=True)
    kinds = {(p.path.split("/")[2], p.kind) for p in report.problems}
    assert kinds == {("0", "record-undecodable"), ("1", "record-undecodable")}, report.problems


@pytest.mark.parametrize("then_cut", [False, True], ids=["among-good-ones", "then-cut-short"])
def test_one_record_that_does_not_decode_is_named_in_file_order(
    extracted: Callable[[str], Path], tmp_path: Path, then_cut: bool
) -> None:
    """A delta of a flat schema (dropDuplicates': a string and a timestamp) whose middle
    record's string lies outside its row: records are checked many at once, and the one
    that does not decode is still named; where the file is also cut short after it, the
    record comes first in the file, so it is what is named (as one record at a time
    would)."""
    version = VERSIONS[-1]
    fx = copy_of(extracted(version), version, "dedup", "hdfs", tmp_path / "d")
    location = open_spark_checkpoint(str(fx.checkpoint))
    needed = [k for n in needs_of(location) for k in n.files if k.endswith(".delta")]
    key = max(needed, key=lambda k: len(_delta_records(fx.checkpoint / k)))
    pairs = _delta_records(fx.checkpoint / key)
    middle = len(pairs) // 2
    row, value = pairs[middle]
    # the string's slot (field 0, after the null word): 100 bytes from the end of the slots
    pairs[middle] = (row[:8] + struct.pack("<q", (24 << 32) | 100) + row[16:], value)
    data = handmade.records(pairs)
    if then_cut:  # the records end 3 bytes into the next record's size
        data = handmade.records(pairs[: middle + 1])[:-4] + b"\x00\x00\x00"
    (fx.checkpoint / key).write_bytes(handmade.lz4_stream(data))

    report = location.verify(deep=True)
    named = [(p.path, p.kind) for p in report.problems if p.kind]
    assert named == [(key, "record-undecodable")], report.problems


def _delta_records(path: Path) -> list[tuple[bytes, bytes | None]]:
    return list(records(decompressed(iter([path.read_bytes()]), path.name), path.name,
                        deletes=True))
