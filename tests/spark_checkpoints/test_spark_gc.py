"""gc of Spark's own checkpoint locations, written by a real Structured Streaming query
(the windowed aggregation of tests.support.spark_locations.queries, as each supported
PySpark wrote it: the committed fixtures, tests/fixtures/spark/; the other queries' gc is
in test_spark_fixtures and test_spark_real_queries) on every state store layout
(HDFS-backed and RocksDB providers, changelog off and on, checkpoint format v2): planted
orphans go, nothing a retained batch needs goes (checked by listing and by
`restart_needs` of every retained batch), young, foreign and linked files stay, a dry run
deletes nothing, and the query restarts from the gc'd checkpoint with the same output as
from an untouched copy (live, on the running PySpark's fixture: `matrix`). Bad input
spares the store (or refuses) and deletes nothing it should not, on every PySpark's
fixture without Spark. One run on S3 (moto).
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.gc import SparkGcReport, gc
from statehold.storage import open_storage
from tests.support.infra.object_store_servers import S3Server
from tests.support.spark_locations.committed_fixtures import (
    FILES,
    copy_of,
    make_old,
    manifests,
    rebind,
)
from tests.support.spark_locations.disk_trees import (
    TWO_HOURS,
    copy_tree,
    listing,
    needs_of_restartable,
    plant,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The windowed aggregation: one operator (``state/0``), two partitions, a store each.
QUERY = "window"
#: Every PySpark whose fixtures are committed.
VERSIONS = sorted(manifests())
PROVIDERS = ["hdfs", "rocksdb", "rocksdb_changelog", "rocksdb_v2"]


@pytest.fixture(scope="module")
def base(spark: SparkSession, extracted: Callable[[str], Path],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The running PySpark's window location per provider (the committed fixture, relocated
    to its input beside it, ``../inputs``), every input file read, every file two hours old."""
    import pyspark

    from tests.support.spark_locations.queries import PROVIDERS as HERE

    version = pyspark.__version__
    assert version in manifests(), (
        f"no committed fixture of PySpark {version}: python -m tests.fixtures.spark.make")
    root = tmp_path_factory.mktemp("spark-gc")
    made = {}
    for provider in HERE:
        fx = copy_of(extracted(version), version, QUERY, provider, root / provider)
        rebind(fx, root / provider / "inputs")
        make_old(fx.checkpoint, TWO_HOURS)
        made[provider] = fx.checkpoint
    return made


def rocks(extracted: Callable[[str], Path], version: str, tmp_path: Path) -> Path:
    """`version`'s window location on RocksDB with changelogs, every file two hours old."""
    return copy_of(extracted(version), version, QUERY, "rocksdb_changelog",
                   tmp_path / "fixture").checkpoint


def copy(src: Path, dst: Path) -> Path:
    """A copy with bytes of its own: some tests damage files in place."""
    return copy_tree(src, dst, link=False)


def store_dir(ckpt: Path, partition: int = 0) -> Path:
    return ckpt / "state" / "0" / str(partition)


def zips(ckpt: Path, partition: int = 0) -> list[Path]:
    found = store_dir(ckpt, partition).glob("*.zip")
    return sorted(found, key=lambda p: int(p.name.split("_")[0].split(".")[0]))


def plant_orphans(ckpt: Path, provider: str) -> tuple[set[str], set[str]]:
    """Old orphans gc must delete, and young, foreign and linked files it must keep."""
    store = store_dir(ckpt)
    doomed = {
        plant(store / "SSTs" / f"{uuid.uuid4()}.sst"),
        plant(store_dir(ckpt, 1) / "SSTs" / f"000123-{uuid.uuid4()}.sst"),
        plant(store / f".5.delta.{uuid.uuid4()}.tmp"),
        plant(store / ".97.changelog.crc"),  # a checksum whose subject is gone
        plant(ckpt / "offsets" / f".9.{uuid.uuid4()}.tmp"),
    }
    if provider.startswith("rocksdb"):  # a stale zip of an old version, a copy of a real one
        stale = f"1_{uuid.uuid4()}.zip" if provider == "rocksdb_v2" else "1.zip"
        if not (store / stale).exists():
            doomed.add(plant(store / stale, zips(ckpt)[0].read_bytes()))
    kept = {
        plant(store / "SSTs" / f"young-{uuid.uuid4()}.sst", age=5.0),
        plant(store / "notes.txt"),
        plant(ckpt / "README"),
    }
    link = store / "SSTs" / "linked.sst"
    link.symlink_to(next(iter(doomed)))
    kept.add(link)
    rel = {str(p.relative_to(ckpt)) for p in doomed}, {str(p.relative_to(ckpt)) for p in kept}
    return rel


@pytest.mark.spark
@pytest.mark.matrix
@pytest.mark.parametrize("provider", PROVIDERS)
def test_gc_removes_orphans_keeps_needs_and_the_query_continues(
    spark: SparkSession,
    base: dict[str, Path],
    tmp_path: Path,
    provider: str,
) -> None:
    from tests.support.spark_locations.queries import all_rows, run_query, write_inputs

    if provider not in base:
        pytest.skip(f"PySpark {spark.version} has no checkpoint format v2")
    ckpt = copy(base[provider], tmp_path / "ckpt")
    untouched = copy(base[provider], tmp_path / "untouched")
    doomed, kept = plant_orphans(ckpt, provider)
    needs_before = needs_of_restartable(ckpt)
    assert needs_before, "no batch to restart from"
    before = listing(ckpt)

    dry = gc(open_spark_checkpoint(str(ckpt)), dry_run=True)
    assert listing(ckpt) == before, "a dry run deleted"
    assert dry.deleted == 0 and dry.deletable >= len(doomed) and dry.ok, dry.problems

    report = gc(open_spark_checkpoint(str(ckpt)))
    after = listing(ckpt)
    gone = set(before) - set(after)
    assert report.ok, report.problems
    assert doomed <= gone, doomed - gone
    assert not kept & gone, kept & gone
    assert report.deleted == len(gone) == dry.deletable
    needed = set().union(*needs_before.values())
    assert not needed & gone, sorted(needed & gone)[:5]
    assert needs_of_restartable(ckpt).keys() == needs_before.keys()
    assert {k for k in after if k.endswith((".zip", ".changelog", ".delta"))}, "gc took all"

    # the gc'd checkpoint restarts like the untouched one
    inputs = base[provider].parent / "inputs"  # the paths the source's log records
    write_inputs(inputs, FILES, 3)
    last = FILES + 3 - 1
    run_query(spark, QUERY, provider, str(ckpt), inputs, tmp_path / "out-gc", last)
    run_query(spark, QUERY, provider, str(untouched), inputs, tmp_path / "out-untouched", last)
    assert all_rows(tmp_path / "out-gc") == all_rows(tmp_path / "out-untouched")
    assert all_rows(tmp_path / "out-gc"), "no output after the restart"


@pytest.mark.parametrize("version", VERSIONS)
def test_young_files_of_spark_are_kept_by_the_grace(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt = rocks(extracted, version, tmp_path)
    make_old(ckpt, 60)  # a minute old
    orphan = plant(store_dir(ckpt) / "SSTs" / "orphan.sst", age=TWO_HOURS)
    before = listing(ckpt)
    report = gc(open_spark_checkpoint(str(ckpt)))
    assert set(before) - set(listing(ckpt)) == {str(orphan.relative_to(ckpt))}
    assert report.protected_count > 0


# -- bad input ----------------------------------------------------------------------------
def assert_store_spared(ckpt: Path, report: SparkGcReport, partition: int = 0) -> None:
    assert len(report.problems) == 1, report.problems
    assert f"partition {partition}" in report.problems[0] and "spared" in report.problems[0]


def rocks_with_orphans(
    extracted: Callable[[str], Path], version: str, tmp_path: Path
) -> tuple[Path, Path, Path]:
    ckpt = rocks(extracted, version, tmp_path)
    zero = plant(store_dir(ckpt) / "SSTs" / "orphan-a.sst")
    one = plant(store_dir(ckpt, 1) / "SSTs" / "orphan-b.sst")
    return ckpt, zero, one


def gc_sparing_partition_0(ckpt: Path, zero: Path, one: Path) -> SparkGcReport:
    before = listing(ckpt)
    report = gc(open_spark_checkpoint(str(ckpt)))
    gone = set(before) - set(listing(ckpt))
    assert zero.exists(), "a file of the spared store was deleted"
    assert not one.exists(), "the other store was not collected"
    assert not [k for k in gone if k.startswith("state/0/0/")], gone
    return report


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_needed_zip_spares_its_store(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt, zero, one = rocks_with_orphans(extracted, version, tmp_path)
    newest = zips(ckpt)[-1]
    st = newest.stat()
    newest.write_bytes(newest.read_bytes()[: st.st_size // 2])
    os.utime(newest, (st.st_atime, st.st_mtime))
    report = gc_sparing_partition_0(ckpt, zero, one)
    assert_store_spared(ckpt, report)
    assert "zip" in report.problems[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_changelog_gap_spares_its_store(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt, zero, one = rocks_with_orphans(extracted, version, tmp_path)
    needed = set().union(*needs_of_restartable(ckpt).values())
    changelogs = sorted(k for k in needed if k.startswith("state/0/0/") and "changelog" in k)
    assert changelogs, "no retained version of partition 0 replays a changelog"
    (ckpt / changelogs[-1]).unlink()  # a retained version's chain now has a gap
    report = gc_sparing_partition_0(ckpt, zero, one)
    assert_store_spared(ckpt, report)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bad", ["../x.sst", "/etc/x.sst"])
def test_an_sst_list_naming_another_place_spares_its_store(
    extracted: Callable[[str], Path], tmp_path: Path, bad: str, version: str
) -> None:
    ckpt, zero, one = rocks_with_orphans(extracted, version, tmp_path)
    victim = plant(ckpt / "state" / "0" / "x.sst")  # what "../x.sst" would name
    for path in zips(ckpt):
        st = path.stat()
        with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as src:
            members = {n: src.read(n) for n in src.namelist()}
        version, _, body = members["metadata"].decode().partition("\n")
        meta = json.loads(body)
        meta.setdefault("sstFiles", []).append(
            {"localFileName": "000999.sst", "dfsSstFileName": bad, "sizeBytes": 100}
        )
        members["metadata"] = f"{version}\n{json.dumps(meta)}".encode()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as dst:
            for name, data in members.items():
                dst.writestr(name, data)
        path.write_bytes(buffer.getvalue())
        os.utime(path, (st.st_atime, st.st_mtime))
    report = gc_sparing_partition_0(ckpt, zero, one)
    assert_store_spared(ckpt, report)
    assert "unsafe" in report.problems[0]
    assert victim.exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_commit_log_version_refuses(
    extracted: Callable[[str], Path], tmp_path: Path, version: str
) -> None:
    ckpt, _zero, _one = rocks_with_orphans(extracted, version, tmp_path)
    commits = sorted((ckpt / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].write_text('v9\n{"nextBatchWatermarkMs":0}')
    before = listing(ckpt)
    with pytest.raises(SparkCheckpointError, match="v9") as e:
        gc(open_spark_checkpoint(str(ckpt)))
    assert "\n" not in str(e.value)
    assert listing(ckpt) == before


# -- S3 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_gc_on_s3(
    extracted: Callable[[str], Path], tmp_path: Path, s3_server: S3Server, version: str
) -> None:
    local = rocks(extracted, version, tmp_path)
    orphan = plant(store_dir(local) / "SSTs" / "orphan.sst")
    stale = plant(store_dir(local) / "1.zip", zips(local)[0].read_bytes())
    needs_before = needs_of_restartable(local)
    uri = f"s3://{s3_server.bucket}/spark-gc-{uuid.uuid4().hex}"
    s3 = open_storage(uri, **s3_server.options)
    for rel in listing(local):
        s3.write(rel, (local / rel).read_bytes())
    time.sleep(1.1)  # LastModified has whole seconds: every upload before the listing
    checkpoint = open_spark_checkpoint(uri, **s3_server.options)
    before = {i.key for i in s3.list()}
    dry = gc(checkpoint, dry_run=True, grace_seconds=0.0)
    assert {i.key for i in s3.list()} == before and dry.deletable > 0
    report = gc(checkpoint, grace_seconds=0.0, batch_size=3)
    gone = before - {i.key for i in s3.list()}
    assert report.ok, report.problems
    assert {str(orphan.relative_to(local)), str(stale.relative_to(local))} <= gone
    needed = set().union(*needs_before.values())
    assert not needed & gone
    found = checkpoint.scan()
    for batch in needs_before:
        assert checkpoint.restart_needs(found, batch).ok, batch
