"""Reading and verifying a Spark checkpoint location made by hand (byte for byte as Spark
writes it): what a restart at a batch needs, how each store's version is held, and every
bad input refused with one line. Real queries' checkpoints: test_spark_real_queries."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.errors import NotASparkCheckpointError
from statehold.spark_checkpoints.layout import Kind, StoreId, parse
from statehold.spark_checkpoints.reports import listing, verify
from statehold.spark_checkpoints.state_files import check_stream
from tests.support.spark_locations.handmade_files import (
    hdfs_store,
    lineage_header,
    logs,
    lz4_stream,
    records,
    rocksdb_changelog_store,
    snapshot_zip,
    write,
)

STORE = "state/0/0"


def changelog_checkpoint(root: Path) -> dict[int, list[str]]:
    """Batches 3-6 retained, store versions 1-7 with snapshots at 2 and 5."""
    logs(root, range(3, 7))
    return rocksdb_changelog_store(root, STORE, range(1, 8), {2, 5})


def test_names_of_every_kind() -> None:
    assert parse("offsets/12").kind is Kind.OFFSETS and parse("offsets/12").batch == 12
    assert parse("sources/0/9.compact").compact
    name = parse("state/1/3/left-keyToNumValues/7_ab-12.changelog")
    assert (name.kind, name.version, name.unique_id) == (Kind.CHANGELOG, 7, "ab-12")
    assert name.store == StoreId(1, 3, "left-keyToNumValues")
    assert parse("state/0/0/SSTs/000008-x.sst").store == StoreId(0, 0)
    assert parse("state/0/0/.4.zip.crc").of == "state/0/0/4.zip"
    assert parse("state/0/0/4_a-1.zip.crc").of == "state/0/0/4_a-1.zip"
    assert parse("offsets/.3.7f1e.tmp").kind is Kind.TEMP
    assert parse("state/0/0/notes.txt").kind is Kind.UNKNOWN


def test_a_restart_needs_the_newest_snapshot_and_the_changelogs_after_it(tmp_path: Path) -> None:
    ssts = changelog_checkpoint(tmp_path)
    checkpoint = open_spark_checkpoint(str(tmp_path))
    needs = checkpoint.restart_needs(checkpoint.scan(), 6)
    assert needs.ok, needs.problems
    [store] = needs.stores
    assert (store.version, store.base, store.how) == (7, 5, "snapshot+changelogs")
    expected = {f"{STORE}/5.zip", f"{STORE}/6.changelog", f"{STORE}/7.changelog"}
    expected |= {f"{STORE}/SSTs/{n}" for n in ssts[5]}
    assert set(store.files) == expected
    assert {"offsets/6", "offsets/5", "commits/6", "metadata", "sources/0/6"} <= set(needs.files)
    assert "sources/0/6" in needs.files and "offsets/4" not in needs.files


def test_hdfs_versions_are_a_snapshot_and_deltas(tmp_path: Path) -> None:
    logs(tmp_path, range(3, 7))
    hdfs_store(tmp_path, STORE, range(1, 8), {4})
    checkpoint = open_spark_checkpoint(str(tmp_path))
    [store] = checkpoint.restart_needs(checkpoint.scan(), 6).stores
    assert (store.base, store.how) == (4, "snapshot+deltas")
    files = ("4.snapshot", "5.delta", "6.delta", "7.delta")
    assert set(store.files) == {f"{STORE}/{n}" for n in files}


def test_format_v2_follows_the_commit_log_ids_and_the_lineage(tmp_path: Path) -> None:
    logs(tmp_path, range(3, 7))
    ids = {v: f"id{v}" for v in range(1, 8)}
    for v in range(1, 8):
        chain = [(u, ids[u]) for u in range(4, v)] if v > 4 else []
        body = lz4_stream(records([(b"k", b"v")], lineage_header(chain)))
        write(tmp_path, f"{STORE}/{v}_{ids[v]}.changelog", body)
        write(tmp_path, f"{STORE}/{v}_retry{v}.changelog", body)  # a failed attempt's file
    write(tmp_path, f"{STORE}/4_{ids[4]}.zip", snapshot_zip({}))
    write(tmp_path, f"{STORE}/5_retry5.zip", snapshot_zip({}))  # not in the lineage
    write(tmp_path, "commits/6", 'v2\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{"0":[["id7"]]}}')
    checkpoint = open_spark_checkpoint(str(tmp_path))
    [store] = checkpoint.restart_needs(checkpoint.scan(), 6).stores
    assert store.base == 4
    assert set(store.files) == {
        f"{STORE}/4_id4.zip", f"{STORE}/5_id5.changelog", f"{STORE}/6_id6.changelog",
        f"{STORE}/7_id7.changelog",
    }


def test_format_v2_version_1_is_held_from_an_empty_store(tmp_path: Path) -> None:
    """Spark 4.3 writes version 1's changelog with an empty lineage (so do the committed
    fixtures): it is held, from an empty store. statehold took it for a version whose
    lineage had lost its snapshot, so gc called batch 0's state "no longer held (Spark's
    own maintenance deleted it)" and deleted ``1_<id>.changelog`` while batch 0 was
    retained, once a zip at version 2 left no later version needing it (found by the
    simulation's Spark world, `--gc-race` on format v2)."""
    from statehold.spark_checkpoints.gc import gc
    from tests.support.spark_locations.disk_trees import backdate
    from tests.support.spark_locations.handmade_files import commit_file

    logs(tmp_path, range(3))
    ids = {v: f"id{v}" for v in range(1, 4)}
    for v, chain in ((1, []), (2, [(1, ids[1])]), (3, [(2, ids[2])])):
        body = lz4_stream(records([(b"k%d" % v, b"v")], lineage_header(chain)))
        write(tmp_path, f"{STORE}/{v}_{ids[v]}.changelog", body)
    write(tmp_path, f"{STORE}/2_{ids[2]}.zip", snapshot_zip({}))
    for b in range(3):
        write(tmp_path, f"commits/{b}", commit_file(b, {"0": [[ids[b + 1]]]}))
    backdate(tmp_path, 7200)
    checkpoint = open_spark_checkpoint(str(tmp_path))

    needs = checkpoint.restart_needs(checkpoint.scan(), 0)
    assert needs.ok, needs.problems
    assert set(needs.stores[0].files) == {f"{STORE}/1_id1.changelog"}
    report = gc(checkpoint, grace_seconds=0)
    assert (tmp_path / STORE / "1_id1.changelog").exists(), report.deleted_keys
    assert not report.notes
    assert verify(open_spark_checkpoint(str(tmp_path)), 0).ok


def test_verify_passes_a_whole_checkpoint_and_names_its_input_directories(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    report = verify(open_spark_checkpoint(str(tmp_path)))
    assert report.ok, report.problems
    assert report.batch == 6 and report.bound_to == {"file:///data/in": 7}


def test_the_batches_a_restart_can_start_after(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    result = listing(open_spark_checkpoint(str(tmp_path)))
    restartable = {b.batch: b.restartable for b in result.batches}
    # batch 3 needs offsets/2, purged: Spark cannot start after it
    assert restartable == {6: True, 5: True, 4: True, 3: False}
    assert result.restart_batch == 6 and result.stores[0].versions == list(range(1, 8))


def problems_of(root: Path, batch: int | None = None) -> list[str]:
    report = verify(open_spark_checkpoint(str(root)), batch)
    assert report.ok is (not report.problems)
    return [f"{p.path}: {p.problem}" for p in report.problems]


def test_a_changelog_chain_with_a_gap(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    os.unlink(tmp_path / STORE / "6.changelog")
    [problem] = problems_of(tmp_path)
    assert "version 7 needs changelogs 6 (from snapshot 5), which are missing" in problem


def test_a_truncated_zip(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    zip_path = tmp_path / STORE / "5.zip"
    zip_path.write_bytes(zip_path.read_bytes()[:-30])
    [problem] = problems_of(tmp_path)
    assert "5.zip" in problem and "not a whole snapshot zip" in problem


def test_a_truncated_changelog(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    path = tmp_path / STORE / "7.changelog"
    path.write_bytes(path.read_bytes()[:-21])  # the end block is gone
    [problem] = problems_of(tmp_path)
    assert problem.startswith(f"{STORE}/7.changelog: ") and "cut short" in problem


def test_an_sst_of_the_wrong_size(tmp_path: Path) -> None:
    ssts = changelog_checkpoint(tmp_path)
    sst = tmp_path / STORE / "SSTs" / ssts[5][0]
    sst.write_bytes(sst.read_bytes()[:-1])
    [problem] = problems_of(tmp_path)
    assert ssts[5][0] in problem and "the snapshot lists" in problem


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "SSTs/x.sst"])
def test_an_sst_list_naming_a_path_is_refused(tmp_path: Path, name: str) -> None:
    changelog_checkpoint(tmp_path)
    write(tmp_path, f"{STORE}/5.zip", snapshot_zip({name: 1}))
    [problem] = problems_of(tmp_path)
    assert "unsafe file name" in problem


def test_an_unknown_log_version(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    write(tmp_path, "commits/6", 'v9\n{"nextBatchWatermarkMs":0}')
    [problem] = problems_of(tmp_path)
    assert "commits/6: log version v9, statehold reads up to v2" in problem
    with pytest.raises(SparkCheckpointError, match="v9"):
        open_spark_checkpoint(str(tmp_path)).commit(6)


def test_an_unknown_zip_metadata_version(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    write(tmp_path, f"{STORE}/5.zip", snapshot_zip({}, version="v7"))
    [problem] = problems_of(tmp_path)
    assert "log version v7" in problem


def test_a_symlinked_state_directory_is_not_followed(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    (tmp_path / "state").rename(elsewhere)
    (tmp_path / "state").symlink_to(elsewhere, target_is_directory=True)
    problems = problems_of(tmp_path)
    assert "state: a symbolic link: never followed" in problems


def test_a_zip_member_with_a_bad_crc(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    path = tmp_path / STORE / "5.zip"
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("CURRENT")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    [problem] = problems_of(tmp_path)
    assert "'CURRENT' fails its CRC" in problem


def test_a_stream_that_does_not_decompress() -> None:
    good = lz4_stream(records([(b"key" * 50, b"value" * 50)]))
    bad = good[:21] + bytes(b ^ 0x5A for b in good[21:30]) + good[30:]
    with pytest.raises(SparkCheckpointError):
        check_stream(iter([bad]), "x.delta")
    assert check_stream(iter([good]), "x.delta") is not None
    assert check_stream(iter([good]), "x.delta", codec="zstd") is None  # not checked


def test_a_job_directory_or_an_empty_one_is_no_spark_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(NotASparkCheckpointError):
        open_spark_checkpoint(str(tmp_path))
    write(tmp_path, "_job/job.json", "{}")
    write(tmp_path, "metadata", json.dumps({"id": "x"}))
    with pytest.raises(NotASparkCheckpointError):
        open_spark_checkpoint(str(tmp_path))


def test_a_typed_changelog_ends_with_a_record_type_of_zero() -> None:
    """Changelogs with column families (v2, v4: transformWithState) end with type 0."""
    from tests.support.spark_locations.handmade_files import utf

    typed = utf("v2") + b"\x01" + records([(b"k", b"v")])[:-4] + b"\x00"
    assert check_stream(iter([lz4_stream(typed)]), "1.changelog") is not None
    with pytest.raises(SparkCheckpointError, match="do not end"):
        check_stream(iter([lz4_stream(typed[:-1])]), "1.changelog")


def test_a_zip_rewritten_under_its_name_is_read_again(tmp_path: Path) -> None:
    """A rerun after a rollback rewrites ``N.zip`` under the same name: a location opened
    once reads it afresh at its next listing."""
    ssts = changelog_checkpoint(tmp_path)
    location = open_spark_checkpoint(str(tmp_path))
    assert location.verify().ok
    write(tmp_path, f"{STORE}/5.zip", snapshot_zip({ssts[5][0]: 100, "000777-new.sst": 7}))
    [problem] = [p.path for p in location.verify().problems]
    assert problem == f"{STORE}/SSTs/000777-new.sst"


# -- found by tests/spark_checkpoints/test_fuzz_spark_files.py --------------------------------
@pytest.mark.parametrize("info", [[1], [{"numPartitions": "x"}], [{"numPartitions": 10**9}],
                                  [{"storeName": ["a"]}], "stores"])
def test_operator_metadata_that_is_not_sane_leaves_the_listing_to_decide(
        tmp_path: Path, info: object) -> None:
    """A store list of the wrong shape, or claiming a billion partitions (each an expected
    store: memory without bound), is set aside like unreadable metadata."""
    changelog_checkpoint(tmp_path)
    write(tmp_path, "state/0/_metadata/metadata",
          "v1\n" + json.dumps({"operatorInfo": {"operatorId": 0}, "stateStoreInfo": info}))
    assert problems_of(tmp_path) == []


@pytest.mark.parametrize("key", ["state/\u00b2/0/1.delta", "sources/\u00b2/0",
                                 "state/0/\u00b2/1.delta", "offsets/\u0661\u0662",
                                 "state/0/0/\u0661.delta"])
def test_a_name_with_digits_spark_never_writes_is_unknown(key: str) -> None:
    """``²`` passes `str.isdigit` and int() refuses it; ``١٢`` int() reads as 12, so it
    would alias batch 12. Neither is Spark's."""
    assert parse(key).kind is Kind.UNKNOWN


def test_a_zip_whose_header_points_before_its_start(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    path = tmp_path / STORE / "5.zip"
    path.write_bytes(path.read_bytes()[1:])  # every offset now one byte off
    [problem] = problems_of(tmp_path)
    assert f"{STORE}/5.zip: not a whole snapshot zip" in problem


def test_a_block_longer_than_its_header_allows_is_refused_before_it_is_inflated() -> None:
    import struct

    header = b"LZ4Block" + struct.pack("<Biii", 0x25, 16, 1 << 30, 0)  # 32 KiB blocks
    with pytest.raises(SparkCheckpointError, match="longer than its header allows"):
        check_stream(iter([header + bytes(16)]), "x.delta")


def test_a_query_metadata_nested_too_deeply(tmp_path: Path) -> None:
    changelog_checkpoint(tmp_path)
    write(tmp_path, "metadata", "[" * 100_000)
    with pytest.raises(SparkCheckpointError, match="metadata: nested more than"):
        open_spark_checkpoint(str(tmp_path)).query_id()


def test_gc_leaves_names_with_digits_spark_never_writes(tmp_path: Path) -> None:
    """Such a name is UNKNOWN, which the deletion rule judges foreign: gc with no grace
    keeps it, and still deletes the old versions it would otherwise."""
    changelog_checkpoint(tmp_path)
    crafted = ["offsets/\u0661", "commits/\u0661", f"{STORE}/\u0661.changelog",
               f"{STORE}/\u00b2.zip"]
    for key in crafted:
        write(tmp_path, key, b"crafted")
    report = open_spark_checkpoint(str(tmp_path)).gc(grace_seconds=0)
    assert all((tmp_path / key).read_bytes() == b"crafted" for key in crafted)
    assert report.deleted, report  # the pass did delete: the crafted names were judged

