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
from dataclasses import dataclass
from pathlib import Path

import lz4.block
import pytest
from typer.testing import CliRunner

from statehold.cli.app import app
from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.api import SparkCheckpointLocation
from statehold.spark_checkpoints.stores import Needs
from tests.support.spark_locations.committed_fixtures import copy_of, fixture, manifests

VERSIONS = sorted(manifests())
runner = CliRunner()


def needs_of(location: SparkCheckpointLocation) -> list[Needs]:
    """Each store's needs for a restart at the newest committed batch."""
    found = location.scan()
    assert found.newest_committed is not None
    needs = location.restart_needs(found, found.newest_committed)
    assert needs.ok, needs.problems
    return needs.stores


def queries(version: str, provider: str) -> list[str]:
    return [q["query"] for q in manifests()[version]["locations"] if q["provider"] == provider]


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


@dataclass
class Damage:
    """A damage planted: the file verify --deep must name, its kind, the Spark bug."""

    path: str
    kind: str
    bug: str | None = None


def _sst_pairs(root: Path, needs: list[Needs], same: bool) -> tuple[str, str] | None:
    """A needed SST and another SST of the location, of the same size (`same`) or not,
    whose bytes differ."""
    every = sorted(p for p in root.glob("state/**/SSTs/*.sst"))
    for store in needs:
        for key in store.files:
            if not key.endswith(".sst"):
                continue
            mine = (root / key).read_bytes()
            for other in every:
                data = other.read_bytes()
                if (len(data) == len(mine)) == same and data != mine:
                    return key, str(other.relative_to(root))
    return None


def sst_of_the_same_size(root: Path, needs: list[Needs]) -> Damage | None:
    """SPARK-43404: another SST's bytes under a needed SST's name, of the same size (so
    only the MANIFEST's unique id can tell)."""
    pair = _sst_pairs(root, needs, same=True)
    if pair is None:
        return None
    key, other = pair
    (root / key).write_bytes((root / other).read_bytes())
    return Damage(key, "sst-unique-id-mismatch", "SPARK-43404")


def sst_of_the_wrong_size(root: Path, needs: list[Needs]) -> Damage | None:
    """SPARK-51717: another SST, of another size, under a needed SST's name."""
    pair = _sst_pairs(root, needs, same=False)
    if pair is None:
        return None
    key, other = pair
    (root / key).write_bytes((root / other).read_bytes())
    return Damage(key, "sst-size-mismatch", "SPARK-51717")


def _own_zip(needs: list[Needs]) -> str | None:
    for store in needs:
        if store.how == "snapshot":
            return next(k for k in store.files if k.endswith(".zip"))
    return None


def zip_cut_short(root: Path, needs: list[Needs]) -> Damage | None:
    key = _own_zip(needs)
    if key is None:
        return None
    data = (root / key).read_bytes()
    (root / key).write_bytes(data[: len(data) // 2])
    return Damage(key, "zip-cut-short")


def zip_deleted(root: Path, needs: list[Needs]) -> Damage | None:
    key = _own_zip(needs)
    if key is None:
        return None
    (root / key).unlink()
    return Damage(key, "zip-missing")


def _chains(needs: list[Needs], ext: str) -> list[tuple[Needs, list[str]]]:
    return [(s, [k for k in s.files if k.endswith(ext)]) for s in needs]


def changelog_deleted_from_the_middle(root: Path, needs: list[Needs]) -> Damage | None:
    """A changelog with changelogs after it and a snapshot or changelogs before it."""
    for store, chain in _chains(needs, ".changelog"):
        if len(chain) >= 2 and (store.base or len(chain) >= 3):
            key = chain[-2]
            (root / key).unlink()
            return Damage(key, "changelog-missing")
    return None


def newest_changelog_cut_short(root: Path, needs: list[Needs]) -> Damage | None:
    for _store, chain in _chains(needs, ".changelog"):
        if chain:
            data = (root / chain[-1]).read_bytes()
            (root / chain[-1]).write_bytes(data[: len(data) // 2])
            return Damage(chain[-1], "changelog-cut-short")
    return None


def delta_deleted(root: Path, needs: list[Needs]) -> Damage | None:
    for _store, chain in _chains(needs, ".delta"):
        if len(chain) >= 2:
            (root / chain[0]).unlink()
            return Damage(chain[0], "delta-missing")
    return None


def hdfs_snapshot_corrupted(root: Path, needs: list[Needs]) -> Damage | None:
    """One byte of the snapshot's first compressed block changed (its length and the
    stream's framing left alone: only decompressing and lz4-java's checksum can tell)."""
    for store in needs:
        for key in store.files:
            if key.endswith(".snapshot"):
                data = bytearray((root / key).read_bytes())
                compressed = int.from_bytes(data[9:13], "little")
                data[21 + compressed // 2] ^= 0x5A
                (root / key).write_bytes(bytes(data))
                return Damage(key, "snapshot-corrupt")
    return None


def hdfs_snapshot_bit_rot(root: Path, needs: list[Needs]) -> Damage | None:
    """One bit of the snapshot's last value changed and the block compressed again under
    its old checksum: the stream is well formed and every record decodes, so only
    lz4-java's checksum (which Spark's load checks) can tell."""
    for store in needs:
        for key in store.files:
            if key.endswith(".snapshot"):
                data = (root / key).read_bytes()
                token, size, raw_size, check = struct.unpack_from("<Biii", data, 8)
                body = data[21 : 21 + size]
                raw = bytearray(body if token & 0xF0 == 0x10 else
                                lz4.block.decompress(body, uncompressed_size=raw_size))
                raw[-5] ^= 0x01  # before the records' end (-1, four bytes)
                again = lz4.block.compress(bytes(raw), store_size=False)
                header = b"LZ4Block" + struct.pack("<Biii", 0x20 | (token & 0x0F), len(again),
                                                   raw_size, check)
                (root / key).write_bytes(header + again + data[21 + size :])
                return Damage(key, "snapshot-corrupt")
    return None


def version_missing(root: Path, needs: list[Needs]) -> Damage | None:
    """Every file of the version the newest batch wrote, of one store, deleted: commits/N
    is there, version N+1 is not."""
    for store in needs:
        own = [k for k in store.files if k.endswith((".delta", ".snapshot", ".changelog", ".zip"))
               and k.rsplit("/", 1)[1].split(".")[0].split("_")[0] == str(store.version)]
        if not own:
            continue
        stem = own[0].rsplit(".", 1)[0]
        hdfs = own[0].endswith((".delta", ".snapshot"))
        for path in root.glob(f"{stem}.*"):
            path.unlink()
        return Damage(f"{stem}.{'delta' if hdfs else 'changelog'}", "version-missing")
    return None


Plant = Callable[[Path, list[Needs]], Damage | None]
#: Each damage, with the layouts it is planted on and the queries tried in turn.
CASES: list[tuple[str, Plant, str, list[str]]] = [
    ("sst-same-size", sst_of_the_same_size, "rocksdb", ["join", "multi", "dedup"]),
    ("sst-same-size", sst_of_the_same_size, "rocksdb_changelog", ["join", "multi"]),
    ("sst-wrong-size", sst_of_the_wrong_size, "rocksdb", ["window"]),
    ("zip-cut-short", zip_cut_short, "rocksdb", ["window"]),
    ("zip-deleted", zip_deleted, "rocksdb", ["window"]),
    ("changelog-deleted", changelog_deleted_from_the_middle, "rocksdb_changelog",
     ["join", "window", "dedup", "multi"]),
    ("changelog-deleted", changelog_deleted_from_the_middle, "rocksdb_v2",
     ["join", "window", "dedup", "multi"]),
    ("changelog-cut-short", newest_changelog_cut_short, "rocksdb_changelog",
     ["window", "join"]),
    ("changelog-cut-short", newest_changelog_cut_short, "rocksdb_v2", ["window", "join"]),
    ("delta-deleted", delta_deleted, "hdfs", ["window", "join", "dedup"]),
    ("hdfs-snapshot-corrupt", hdfs_snapshot_corrupted, "hdfs", ["window", "join", "dedup"]),
    ("hdfs-snapshot-bit-rot", hdfs_snapshot_bit_rot, "hdfs", ["window", "join", "dedup"]),
    ("version-missing", version_missing, "hdfs", ["window"]),
    ("version-missing", version_missing, "rocksdb_changelog", ["window", "join"]),
    ("version-missing", version_missing, "rocksdb_v2", ["window", "join"]),
]
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
