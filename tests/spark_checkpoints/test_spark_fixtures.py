"""Every query of tests.support.spark_locations.queries on every state store layout, as each
supported PySpark (3.5, 4.0, the newest) wrote it: the committed fixtures
(tests/fixtures/spark/, tests.support.spark_locations.committed_fixtures), read without
starting Spark. What `listing` and `verify` say of each location, how each store's version
is held, the formats that Spark wrote (commit log, operator metadata, state schema, snapshot
zips, changelog versions), and what gc, a savepoint, a rollback and a relocation do to it.

That a query restarts from what these wrote is tested live on each PySpark
(test_spark_real_queries, test_spark_gc, test_spark_savepoint, test_spark_rollback: the
`matrix` mark), from these same fixtures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.layout import Kind
from statehold.spark_checkpoints.relocate import absolute_paths, relocate
from statehold.spark_checkpoints.rollback import rollback
from statehold.spark_checkpoints.savepoint import savepoint
from statehold.spark_checkpoints.state_files import check_stream, read_zip_metadata
from tests.support.spark_locations.committed_fixtures import (
    FILES,
    Fixture,
    copy_of,
    fixture,
    manifests,
    pairs,
)
from tests.support.spark_locations.disk_trees import (
    gc_removes_only_orphans,
    listing,
    needs_of_restartable,
    newest_log,
    restartable_batches,
)

PAIRS = pairs()
IDS = [f"{v}-{q}-{p}" for v, q, p in PAIRS]
JOIN_STORES = ["left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
               "right-keyWithIndexToValue"]
#: How a store's version can be held, per layout (with changelogs, a snapshot alone where
#: maintenance made one of the newest version).
HOW = {
    "hdfs": {"snapshot", "snapshot+deltas", "deltas"},
    "rocksdb": {"snapshot"},
    "rocksdb_changelog": {"changelogs", "snapshot+changelogs", "snapshot"},
    "rocksdb_v2": {"changelogs", "snapshot+changelogs", "snapshot"},
}


def committed(extracted: Callable[[str], Path], version: str, query: str,
              provider: str) -> Fixture:
    """The extracted location itself: for the tests that only read it."""
    return fixture(extracted(version), version, query, provider)


def test_every_supported_pyspark_wrote_every_pair() -> None:
    """3.5 (no format v2, no transformWithState, no applyInPandasWithState with this
    pyarrow), 4.0 (no format v2), the newest (everything)."""
    versions = sorted(manifests(), key=lambda v: tuple(int(p) for p in v.split(".")))
    assert [v.rsplit(".", 1)[0] for v in versions] == ["3.5", "4.0", "4.3"], versions
    queries = {"window", "dedup", "join", "multi"}
    expected = {
        "3.5": {(q, p) for q in queries for p in ("hdfs", "rocksdb", "rocksdb_changelog")},
        "4.0": {(q, p) for q in queries | {"pandas_state"}
                for p in ("hdfs", "rocksdb", "rocksdb_changelog")}
        | {("transform", p) for p in ("rocksdb", "rocksdb_changelog")},
        "4.3": {(q, p) for q in queries | {"pandas_state"}
                for p in ("hdfs", "rocksdb", "rocksdb_changelog", "rocksdb_v2")}
        | {("transform", p) for p in ("rocksdb", "rocksdb_changelog", "rocksdb_v2")},
    }
    for version in versions:
        manifest = manifests()[version]
        written = {(q["query"], q["provider"]) for q in manifest["locations"]}
        assert written == expected[version.rsplit(".", 1)[0]], version
        for entry in manifest["locations"]:
            assert entry["files"] == FILES
            assert entry["settings"]["spark.sql.streaming.minBatchesToRetain"] == "3"


# -- what statehold reads of each location ---------------------------------------------------
@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_verify_and_restart_needs_of_every_restartable_batch(
    extracted: Callable[[str], Path], version: str, query: str, provider: str
) -> None:
    fx = committed(extracted, version, query, provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    listed = location.listing()
    restartable = [b.batch for b in listed.batches if b.restartable]

    assert listed.newest_committed == fx.last_batch == listed.restart_batch
    assert len(restartable) >= 2, listed.batches
    assert all(b.why_not for b in listed.batches if not b.restartable)
    report = location.verify()
    assert report.ok, report.problems
    assert report.batch == fx.last_batch and report.files_checked > 0
    assert fx.input in "".join(report.bound_to)
    found = location.scan()
    for batch in restartable:
        needs = location.restart_needs(found, batch)
        assert needs.ok, (batch, needs.problems)
        assert all(key in found.files for key in needs.files)


@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_each_store_is_held_as_its_provider_writes_it(
    extracted: Callable[[str], Path], version: str, query: str, provider: str
) -> None:
    fx = committed(extracted, version, query, provider)
    listed = open_spark_checkpoint(str(fx.checkpoint)).listing()
    operators = [0, 1] if query == "multi" else [0]
    names = JOIN_STORES if query == "join" else ["default"]

    assert sorted({(s.operator, s.partition, s.store) for s in listed.stores}) == sorted(
        (op, part, name) for op in operators for part in (0, 1) for name in names)
    version_held = fx.last_batch + 1
    for store in listed.stores:
        where = f"{store.operator}/{store.partition}/{store.store}"
        assert store.provider == ("hdfs" if provider == "hdfs" else "rocksdb"), where
        assert store.how in HOW[provider], (where, store.how)
        assert version_held in store.versions, (where, store.versions)
        assert 0 < store.needed_bytes <= store.bytes, where
    files = set(listing(fx.checkpoint))
    state = {f.rsplit("/", 1)[1] for f in files if f.startswith("state/")}
    exts = {name.rsplit(".", 1)[1] for name in state if "." in name and name[0] != "."}
    assert ("zip" in exts) == (provider != "hdfs"), exts
    assert ("changelog" in exts) == provider.startswith("rocksdb_"), exts
    assert ("delta" in exts) == (provider == "hdfs"), exts
    unique_ids = {n for n in state if n.endswith((".zip", ".changelog")) and "_" in n}
    assert bool(unique_ids) == (provider == "rocksdb_v2"), sorted(unique_ids)[:3]
    # Spark's own checksums beside them (not Hadoop's hidden ``.x.crc``): format v2 only
    checksums = {n for n in state if n.endswith((".zip.crc", ".changelog.crc")) and n[0] != "."}
    assert bool(checksums) == (provider == "rocksdb_v2"), sorted(checksums)[:3]


def _changelog_version(head: bytes) -> str:
    """A changelog's version: v2-v4 say so in a header (Java's writeUTF); v1 has none."""
    length = int.from_bytes(head[:2], "big")
    text = head[2 : 2 + length]
    return text.decode() if text in (b"v2", b"v3", b"v4") else "v1"


@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_the_formats_spark_wrote_are_read(
    extracted: Callable[[str], Path], version: str, query: str, provider: str
) -> None:
    fx = committed(extracted, version, query, provider)
    location = open_spark_checkpoint(str(fx.checkpoint))
    found = location.scan()
    newest = fx.last_batch
    stores_per_operator = 4 if query == "join" else 1

    # the commit log: v2 with a unique id per partition and store at format v2
    commit = location.commit(newest)
    first_line = (fx.checkpoint / "commits" / str(newest)).read_text().split("\n", 1)[0]
    assert first_line == ("v2" if provider == "rocksdb_v2" else "v1")
    if provider == "rocksdb_v2":
        ids = commit.stateUniqueIds or {}
        assert sorted(ids) == [str(op) for op in found.operators]
        assert all(len(parts) == 2 and all(len(p) == stores_per_operator for p in parts)
                   for parts in ids.values()), ids
    else:
        assert not commit.stateUniqueIds

    # operator metadata: none from Spark 3.5; v1 from Spark 4, v2 and schema v3 for
    # transformWithState
    operator_files = set(found.operator_files)
    if not fx.spark_4:
        assert not {k for k in operator_files if "/_metadata/" in k}, operator_files
    elif query == "transform":
        assert any(k.startswith("state/0/_metadata/v2/") for k in operator_files)
        schemas = [k for k in operator_files if k.startswith("state/0/_stateSchema/default/")]
        assert schemas and all(
            (fx.checkpoint / k).read_bytes()[2:4] == b"v3" for k in schemas)
    else:
        for op in found.operators:
            key = f"state/{op}/_metadata/metadata"
            assert key in operator_files
            assert (fx.checkpoint / key).read_text().startswith("v1\n")

    # the zips the newest restart reads (their file lists), every changelog by version
    needs = location.restart_needs(found, newest)
    zips = [k for k in needs.files if k.endswith(".zip")]
    changelogs = found.keys_of(Kind.CHANGELOG)
    if provider in ("hdfs", "rocksdb"):
        assert bool(zips) == (provider == "rocksdb"), zips
    for key in zips:
        meta = read_zip_metadata((fx.checkpoint / key).read_bytes(), key)
        extra = meta.model_extra or {}
        assert ("numInternalKeys" in extra) == fx.spark_4, (key, sorted(extra))
        assert bool(extra.get("columnFamilyMapping")) == (query == "transform"), key
    versions = set()
    for key in changelogs:
        checked = check_stream(iter([(fx.checkpoint / key).read_bytes()]), key)
        assert checked is not None
        versions.add(_changelog_version(checked.head))
    expected = {
        "rocksdb_changelog": "v2" if query == "transform" else "v1",
        "rocksdb_v2": "v4" if query == "transform" else "v3",
    }.get(provider)
    assert versions == ({expected} if expected and changelogs else set()), versions
    assert bool(changelogs) == provider.startswith("rocksdb_")


# -- gc, savepoint, rollback and relocate on each location -------------------------------------
@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_gc_removes_planted_orphans_and_keeps_what_retained_batches_need(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str
) -> None:
    fx = copy_of(extracted(version), version, query, provider, tmp_path)
    ckpt = fx.checkpoint
    gc_removes_only_orphans(ckpt, provider)


@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_savepoint_of_the_oldest_restartable_batch_links_what_it_needs(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str
) -> None:
    fx = copy_of(extracted(version), version, query, provider, tmp_path)
    k = restartable_batches(fx.checkpoint)[0]
    assert k < fx.last_batch
    before = listing(fx.checkpoint)

    report = savepoint(open_spark_checkpoint(str(fx.checkpoint)), str(tmp_path / "sp"), batch=k)

    assert report.batch == k and report.verified
    assert report.linked == report.files and report.bytes_written == 0
    assert report.bytes < report.source_bytes
    assert listing(fx.checkpoint) == before
    assert newest_log(tmp_path / "sp", "commits") == newest_log(tmp_path / "sp", "offsets") == k
    saved = open_spark_checkpoint(str(tmp_path / "sp"))
    assert saved.verify().ok
    assert saved.listing().newest_committed == k
    assert saved.restart_needs(saved.scan(), k).ok


@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_rollback_to_the_oldest_restartable_batch_keeps_the_rest_aside(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str
) -> None:
    fx = copy_of(extracted(version), version, query, provider, tmp_path)
    ckpt = fx.checkpoint
    k = restartable_batches(ckpt)[0]
    needs_k = needs_of_restartable(ckpt)[k]
    before = listing(ckpt)

    report = rollback(open_spark_checkpoint(str(ckpt)), k, keep=str(tmp_path / "kept"),
                      grace_seconds=0)

    assert report.from_batch == fx.last_batch == report.kept_batch and report.deleted
    assert newest_log(ckpt, "commits") == newest_log(ckpt, "offsets") == k
    assert newest_log(tmp_path / "kept", "commits") == fx.last_batch
    assert set(listing(ckpt)) < set(before)
    assert any("foreachBatch" in s for s in report.sinks)
    assert needs_of_restartable(ckpt)[k] == needs_k
    assert open_spark_checkpoint(str(ckpt)).verify().ok


@pytest.mark.parametrize(("version", "query", "provider"), PAIRS, ids=IDS)
def test_relocate_rewrites_every_input_path(
    extracted: Callable[[str], Path], tmp_path: Path, version: str, query: str, provider: str
) -> None:
    """The input the source log names, moved; and where transformWithState's operator
    metadata names its schema files (the location's own path: make.py's folder)."""
    fx = copy_of(extracted(version), version, query, provider, tmp_path)
    old_root = str(Path(fx.input).parent)
    new_in = tmp_path / "new" / "in"
    moved = open_spark_checkpoint(str(fx.checkpoint))
    bound = absolute_paths(moved)
    inputs = [b for b in bound if fx.input in b.path]
    own = [b for b in bound if fx.written_at in b.path]
    assert inputs and len(inputs) + len(own) == len(bound), bound
    assert bool(own) == (query == "transform"), own
    before = listing(fx.checkpoint)

    # force: the fixture was just extracted, so its files look like a live query's
    dry = relocate(moved, fx.input, str(new_in), dry_run=True, force=True)
    assert absolute_paths(moved) == bound and dry.paths == len(inputs)
    assert listing(fx.checkpoint) == before
    report = relocate(moved, fx.input, str(new_in), force=True)
    assert report.paths == len(inputs) and len(report.others) == len(own)
    if own:
        here = relocate(moved, fx.written_at, str(fx.checkpoint), force=True)
        assert here.paths == len(own) and len(here.others) == len(inputs)

    after = absolute_paths(moved)
    assert len(after) == len(bound) and all(old_root not in b.path for b in after)
    assert sum(str(new_in) in b.path for b in after) == len(inputs)
    assert open_spark_checkpoint(str(fx.checkpoint)).verify().ok


def test_fixture_times_are_set_for_each_test(
    extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    """copy_of makes the newest file two hours old and keeps the order of the others."""
    version = sorted(manifests())[0]
    src = fixture(extracted(version), version, "window", "hdfs").checkpoint
    fx = copy_of(extracted(version), version, "window", "hdfs", tmp_path)
    newest = max(p.stat().st_mtime for p in fx.checkpoint.rglob("*") if p.is_file())
    assert 7100 < time.time() - newest < 7300
    order = sorted(listing(src), key=lambda k: (os.stat(src / k).st_mtime, k))
    assert sorted(listing(fx.checkpoint), key=lambda k: (
        os.stat(fx.checkpoint / k).st_mtime, k)) == order
