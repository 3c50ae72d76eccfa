"""Every query of tests.support.spark_checkpoint_queries on every state store layout it runs
on (`unsupported`), read by statehold as Spark left it: what `listing` and `verify` say of
it, how each store's version is held, the formats Spark wrote (commit log, operator
metadata, state schema, snapshot zips, changelog versions), and for a subset of pairs what
a savepoint, a rollback and a gc do to a query that restarts.

Each pair's query runs once (`runs`: FILES input files, to its end, the reference output);
the tests that change its checkpoint work on a copy of hard links (`copy_tree`).

Restarts (one Spark run each) only for the pairs below, so that the module takes about
three minutes of Spark on two cores (PySpark 4.3; one on 3.5, where .ci/spark-matrix runs
it whole with the 12 pairs 3.5 has) and every query and every layout restarts at least
once:
- a savepoint and a rollback: pandas_state x hdfs, transform x rocksdb_v2,
  multi x rocksdb_changelog;
- a gc, then a rollback and a rerun: pandas_state x rocksdb_changelog, transform x
  rocksdb, multi x hdfs, window x rocksdb_v2, dedup x hdfs, join x rocksdb_v2.
The savepoints and rollbacks of the window, dedup and join queries are in
test_spark_savepoint and test_spark_rollback; the window's gc on every layout, with bad
input, is in test_spark_gc.
"""

from __future__ import annotations

import functools
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from statehold.format.spark_layout import Kind, StoreId
from statehold.spark_checkpoints import open_spark_checkpoint
from statehold.spark_checkpoints.gc import gc
from statehold.spark_checkpoints.rollback import rollback
from statehold.spark_checkpoints.savepoint import savepoint
from statehold.spark_checkpoints.state_files import check_stream, read_zip_metadata
from tests.support.spark_checkpoint_queries import (
    PROVIDERS,
    QUERIES,
    SPARK_4,
    Row,
    all_rows,
    read_output,
    run_query,
    unsupported,
    write_inputs,
)
from tests.support.spark_checkpoint_trees import (
    copy_tree,
    listing,
    needs_of_restartable,
    newest_log,
    plant,
    restartable_batches,
)

pytestmark = [pytest.mark.spark]

#: Input files: batch i reads file i; with 3 batches to keep (COMMON_CONF), Spark has
#: purged batch 0's logs by the end, so planted files of version 1 are beyond retention.
FILES = 5
PAIRS = [(q, p) for q in QUERIES for p in PROVIDERS if unsupported(q, p) is None]
SAVEPOINT_ROLLBACK = [("pandas_state", "hdfs"), ("transform", "rocksdb_v2"),
                      ("multi", "rocksdb_changelog")]
#: Pairs whose stores keep a version free below what their retained batches read (for a
#: stale file there), whatever the timing of Spark's maintenance.
GC = [("pandas_state", "rocksdb_changelog"), ("transform", "rocksdb"), ("multi", "hdfs"),
      ("window", "rocksdb_v2"), ("dedup", "hdfs"), ("join", "rocksdb_v2")]
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


def available(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [pair for pair in pairs if pair in PAIRS]


@dataclass(frozen=True)
class Run:
    """A query run to its end on a fresh checkpoint: the untouched checkpoint, its input
    and output, and the rows it wrote."""

    query: str
    provider: str
    checkpoint: Path
    inputs: Path
    output: Path
    last_batch: int
    rows: list[Row]


@pytest.fixture(scope="module")
def runs(
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str, str], Run]:
    """Each pair's run, made the first time a test asks for it."""
    root = tmp_path_factory.mktemp("real-queries")

    @functools.cache
    def run(query: str, provider: str) -> Run:
        base = root / f"{query}-{provider}"
        inputs, output, checkpoint = base / "input", base / "output", base / "ckpt"
        write_inputs(inputs, 0, FILES)
        last = run_query(spark, query, provider, str(checkpoint), inputs, output, FILES - 1)
        rows = all_rows(output)
        assert rows, f"{query} on {provider} wrote nothing"
        return Run(query, provider, checkpoint, inputs, output, last, rows)

    return run


def restart(spark: Any, run: Run, checkpoint: Path, k: int, output: Path) -> list[Row]:
    """Start `run`'s query on `checkpoint` (restartable after batch k) with `run`'s input,
    its output of batches 0..k kept: every row the two runs wrote."""
    output.mkdir()
    for batch in read_output(run.output):
        if batch <= k:
            shutil.copy(run.output / f"batch-{batch}.json", output)
    run_query(spark, run.query, run.provider, str(checkpoint), run.inputs, output, FILES - 1)
    return all_rows(output)


def earliest(run: Run, checkpoint: Path | None = None) -> int:
    """The oldest batch a restart can start after, with input left to read after it."""
    k = restartable_batches(checkpoint or run.checkpoint)[0]
    assert k < FILES - 1, f"batch {k}: no input left after the oldest restartable batch"
    return k


# -- what statehold reads of each pair ------------------------------------------------------
@pytest.mark.parametrize(("query", "provider"), PAIRS)
def test_verify_and_restart_needs_of_every_restartable_batch(
    runs: Callable[[str, str], Run], query: str, provider: str
) -> None:
    run = runs(query, provider)
    location = open_spark_checkpoint(str(run.checkpoint))
    listed = location.listing()
    restartable = [b.batch for b in listed.batches if b.restartable]

    assert listed.newest_committed == run.last_batch == listed.restart_batch
    assert len(restartable) >= 2, listed.batches
    assert all(b.why_not for b in listed.batches if not b.restartable)
    report = location.verify()
    assert report.ok, report.problems
    assert report.batch == run.last_batch and report.files_checked > 0
    assert str(run.inputs) in "".join(report.bound_to)
    found = location.scan()
    for batch in restartable:
        needs = location.restart_needs(found, batch)
        assert needs.ok, (batch, needs.problems)
        assert all(key in found.files for key in needs.files)


@pytest.mark.parametrize(("query", "provider"), PAIRS)
def test_each_store_is_held_as_its_provider_writes_it(
    runs: Callable[[str, str], Run], query: str, provider: str
) -> None:
    run = runs(query, provider)
    listed = open_spark_checkpoint(str(run.checkpoint)).listing()
    operators = [0, 1] if query == "multi" else [0]
    names = JOIN_STORES if query == "join" else ["default"]

    assert sorted({(s.operator, s.partition, s.store) for s in listed.stores}) == sorted(
        (op, part, name) for op in operators for part in (0, 1) for name in names)
    version = run.last_batch + 1
    for store in listed.stores:
        where = f"{store.operator}/{store.partition}/{store.store}"
        assert store.provider == ("hdfs" if provider == "hdfs" else "rocksdb"), where
        assert store.how in HOW[provider], (where, store.how)
        assert version in store.versions, (where, store.versions)
        assert 0 < store.needed_bytes <= store.bytes, where
    files = set(listing(run.checkpoint))
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


@pytest.mark.parametrize(("query", "provider"), PAIRS)
def test_the_formats_spark_wrote_are_read(
    runs: Callable[[str, str], Run], query: str, provider: str
) -> None:
    run = runs(query, provider)
    location = open_spark_checkpoint(str(run.checkpoint))
    found = location.scan()
    newest = run.last_batch
    stores_per_operator = 4 if query == "join" else 1

    # the commit log: v2 with a unique id per partition and store at format v2
    commit = location.commit(newest)
    first_line = (run.checkpoint / "commits" / str(newest)).read_text().split("\n", 1)[0]
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
    if not SPARK_4:
        assert not {k for k in operator_files if "/_metadata/" in k}, operator_files
    elif query == "transform":
        assert any(k.startswith("state/0/_metadata/v2/") for k in operator_files)
        schemas = [k for k in operator_files if k.startswith("state/0/_stateSchema/default/")]
        assert schemas and all(
            (run.checkpoint / k).read_bytes()[2:4] == b"v3" for k in schemas)
    else:
        for op in found.operators:
            key = f"state/{op}/_metadata/metadata"
            assert key in operator_files
            assert (run.checkpoint / key).read_text().startswith("v1\n")

    # the zips the newest restart reads (their file lists), every changelog by version
    needs = location.restart_needs(found, newest)
    zips = [k for k in needs.files if k.endswith(".zip")]
    changelogs = found.keys_of(Kind.CHANGELOG)
    if provider in ("hdfs", "rocksdb"):
        assert bool(zips) == (provider == "rocksdb"), zips
    for key in zips:
        meta = read_zip_metadata((run.checkpoint / key).read_bytes(), key)
        extra = meta.model_extra or {}
        assert ("numInternalKeys" in extra) == SPARK_4, (key, sorted(extra))
        assert bool(extra.get("columnFamilyMapping")) == (query == "transform"), key
    versions = set()
    for key in changelogs:
        checked = check_stream(iter([(run.checkpoint / key).read_bytes()]), key)
        assert checked is not None
        versions.add(_changelog_version(checked.head))
    expected = {
        "rocksdb_changelog": "v2" if query == "transform" else "v1",
        "rocksdb_v2": "v4" if query == "transform" else "v3",
    }.get(provider)
    assert versions == ({expected} if expected and changelogs else set()), versions
    assert bool(changelogs) == provider.startswith("rocksdb_")


# -- savepoint, rollback, gc and a restart -------------------------------------------------
@pytest.mark.parametrize(("query", "provider"), available(SAVEPOINT_ROLLBACK))
def test_savepoint_of_an_earlier_batch_restarts_elsewhere_with_the_same_rows(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    k = earliest(run)
    before = listing(run.checkpoint)

    report = savepoint(open_spark_checkpoint(str(run.checkpoint)), str(tmp_path / "sp"), batch=k)

    assert report.batch == k and report.verified
    assert listing(run.checkpoint) == before
    assert newest_log(tmp_path / "sp", "commits") == k
    assert restart(spark, run, tmp_path / "sp", k, tmp_path / "out") == run.rows


@pytest.mark.parametrize(("query", "provider"), available(SAVEPOINT_ROLLBACK))
def test_rollback_to_an_earlier_batch_then_a_rerun_writes_the_same_rows(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    ckpt = copy_tree(run.checkpoint, tmp_path / "ckpt")
    k = earliest(run)

    report = rollback(open_spark_checkpoint(str(ckpt)), k, keep=str(tmp_path / "kept"),
                      grace_seconds=0)

    assert report.from_batch == run.last_batch and report.deleted
    assert newest_log(ckpt, "commits") == newest_log(ckpt, "offsets") == k
    assert newest_log(tmp_path / "kept", "commits") == run.last_batch
    assert restart(spark, run, ckpt, k, tmp_path / "out") == run.rows


def versions_held(ckpt: Path) -> dict[tuple[StoreId, int], int]:
    """The versions of the stores that retained batches (those with a commit) start from
    and that are held whole, with the version each starts from (its snapshot; 0: an empty
    store): what gc keeps, whether or not the batch's logs are still there."""
    location = open_spark_checkpoint(str(ckpt))
    found = location.scan()
    return {
        (needs.store, needs.version): needs.base
        for batch in found.commits
        for needs in location.restart_needs(found, batch).stores
        if needs.ok
    }


def plant_orphans(ckpt: Path, provider: str) -> tuple[set[str], set[str]]:
    """In every store, what gc must delete: a random SST name (RocksDB), a checksum whose
    subject is gone, and a stale zip, delta or HDFS snapshot (a copy of one Spark wrote)
    of a version below those the retained versions start from, where one is free and the
    file makes no retained version whole; all two hours old. Returns them all, and the
    stale ones."""
    found = open_spark_checkpoint(str(ckpt)).scan()
    held = versions_held(ckpt)
    doomed, stale_files = set(), set()
    for store, files in found.stores.items():
        directory = ckpt / store.prefix
        if provider == "hdfs":
            doomed.add(plant(directory / ".97.delta.crc"))
        else:
            sst = f"{uuid.uuid4().int % 10**6:06d}-{uuid.uuid4()}.sst"
            doomed.add(plant(directory / "SSTs" / sst))
            doomed.add(plant(directory / ".97.changelog.crc"))
        lowest = min(base or 1 for (s, _v), base in held.items() if s == store)
        unique_id = str(uuid.uuid4()) if provider == "rocksdb_v2" else None
        kinds = [Kind.DELTA, Kind.HDFS_SNAPSHOT] if provider == "hdfs" else [Kind.ZIP]
        candidates = [
            (kind, version, like)
            for kind in kinds
            for like in sorted(i.key for (k, _v, _u), i in files.versions.items() if k is kind)[:1]
            for version in range(1, lowest)
            if not files.has(kind, version, unique_id)
        ]
        for kind, version, like in candidates:
            stale = plant(ckpt / files.key(kind, version, unique_id), (ckpt / like).read_bytes())
            if versions_held(ckpt) == held:
                stale_files.add(stale)
                break
            stale.unlink()  # it would make a retained version whole: gc must keep it
    rel = {str(p.relative_to(ckpt)) for p in doomed | stale_files}
    return rel, {str(p.relative_to(ckpt)) for p in stale_files}


@pytest.mark.parametrize(("query", "provider"), available(GC))
def test_gc_removes_planted_orphans_and_the_query_restarts_from_what_it_kept(
    spark: Any,
    runs: Callable[[str, str], Run], tmp_path: Path, query: str, provider: str,
) -> None:
    run = runs(query, provider)
    ckpt = copy_tree(run.checkpoint, tmp_path / "ckpt")
    assert not (ckpt / "commits" / "0").exists(), "batch 0 is still retained"
    needs = needs_of_restartable(ckpt)
    doomed, stale = plant_orphans(ckpt, provider)
    # A stale version file needs a free version below every retained one's snapshot; a
    # store whose retained versions all replay from an empty store (no snapshot made
    # yet: it depends on when Spark's maintenance ran) has none.
    room = all(base > 1 for base in versions_held(ckpt).values())
    assert stale or not room, f"no stale file planted: {sorted(versions_held(ckpt).items())}"
    assert needs_of_restartable(ckpt) == needs, "a planted file made a batch restartable"
    before = listing(ckpt)

    report = gc(open_spark_checkpoint(str(ckpt)), grace_seconds=0)

    gone = set(before) - set(listing(ckpt))
    assert report.ok, report.problems
    assert doomed <= gone, sorted(doomed - gone)
    needed = set().union(*needs.values())
    assert not needed & gone, sorted(needed & gone)[:5]
    assert needs_of_restartable(ckpt) == needs
    assert open_spark_checkpoint(str(ckpt)).verify().ok
    k = earliest(run, ckpt)
    rollback(open_spark_checkpoint(str(ckpt)), k, keep=str(tmp_path / "kept"), grace_seconds=0)
    assert restart(spark, run, ckpt, k, tmp_path / "out") == run.rows
