"""Hand-made locations laid out as Spark leaves them after a crash, one per case found by
reading Spark's writer against statehold: a file source's log one entry ahead of the
offsets (a driver died between the two writes), a rollback stopped halfway, a source
log's chain broken, a stream read twice in one query. Each of these said OK, copied too
little or deleted the wrong entry before the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from statehold.spark_checkpoints import SparkCheckpointError, open_spark_checkpoint
from statehold.spark_checkpoints.gc import gc
from statehold.spark_checkpoints.layout import ROLLBACK_MARKER
from statehold.spark_checkpoints.relocate import relocate
from statehold.spark_checkpoints.reports import listing, verify
from statehold.spark_checkpoints.rollback import rollback
from statehold.spark_checkpoints.savepoint import savepoint
from statehold.storage import StorageError
from statehold.storage.local import LocalStorage
from tests.support.spark_locations.disk_trees import backdate, copy_tree
from tests.support.spark_locations.disk_trees import listing as tree
from tests.support.spark_locations.handmade_files import hdfs_store, rocksdb_changelog_store, write

STORE = "state/0/0"


def _offsets(root: Path, batch: int, *lines: object) -> None:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": {}}
    body = "\n".join(["v1", json.dumps(meta), *(json.dumps(x) for x in lines)])
    write(root, f"offsets/{batch}", body)
    write(root, f"commits/{batch}", 'v1\n{"nextBatchWatermarkMs":0}')


def _entry(root: Path, source: int, k: int, compact_from: int | None = None) -> None:
    """Source `source`'s log entry K (a compaction of entries `compact_from`..K)."""
    first = k if compact_from is None else compact_from
    lines = [
        json.dumps({"path": f"file:///in/{source}/{i}.json", "timestamp": 1, "batchId": i})
        for i in range(first, k + 1)
    ]
    name = f"{k}.compact" if compact_from is not None else str(k)
    write(root, f"sources/{source}/{name}", "\n".join(["v1", *lines]))


def _ahead(root: Path) -> Path:
    """Batches 0-5 of a file source whose driver died at batch 2 between writing entry 2
    and ``offsets/2``: the restart wrote entry 3 for batch 2, so ``offsets/N`` records
    logOffset N+1 from then on. An HDFS-backed store, versions 1-6."""
    write(root, "metadata", '{"id":"q"}')
    for k in range(7):
        _entry(root, 0, k)
    for batch in range(6):
        _offsets(root, batch, {"logOffset": batch if batch < 2 else batch + 1})
    hdfs_store(root, STORE, range(1, 7), {4})
    backdate(root, 7200)
    return root


def test_a_savepoint_holds_the_source_entries_past_the_batch_number(tmp_path: Path) -> None:
    ckpt = open_spark_checkpoint(str(_ahead(tmp_path / "ckpt")))
    needs = ckpt.restart_needs(ckpt.scan(), 5)
    assert needs.ok, needs.problems
    assert "sources/0/6" in needs.files  # offsets/5 reads up to logOffset 6

    report = savepoint(ckpt, str(tmp_path / "sp"))

    assert report.batch == 5
    assert sorted(p.name for p in (tmp_path / "sp" / "sources" / "0").iterdir()) == [
        str(k) for k in range(7)
    ]
    assert verify(open_spark_checkpoint(str(tmp_path / "sp"))).ok
    # an older batch's savepoint reads to that batch's logOffset: entries 0-4 for batch 3
    savepoint(ckpt, str(tmp_path / "sp3"), batch=3)
    assert sorted(int(p.name) for p in (tmp_path / "sp3" / "sources" / "0").iterdir()) == list(
        range(5)
    )


def test_a_rollbacks_undo_copy_keeps_the_entries_it_removes(tmp_path: Path) -> None:
    root = _ahead(tmp_path / "ckpt")
    before = {k: v for k, v in tree(root).items() if k.startswith("sources/")}

    report = rollback(open_spark_checkpoint(str(root)), 3, keep=str(tmp_path / "kept"))

    assert [k for k in report.deleted if k.startswith("sources/")] == ["sources/0/6", "sources/0/5"]
    kept = tmp_path / "kept"
    assert {k for k in tree(kept) if k.startswith("sources/")} == set(before)
    assert verify(open_spark_checkpoint(str(kept))).ok
    assert verify(open_spark_checkpoint(str(root))).ok


@pytest.mark.parametrize("gone", ["sources/0/9.compact", "sources/0/12", "sources/0/15"])
def test_verify_and_list_check_a_source_logs_chain(tmp_path: Path, gone: str) -> None:
    root = tmp_path / "ckpt"
    write(root, "metadata", '{"id":"q"}')
    _entry(root, 0, 9, compact_from=0)
    for k in range(10, 16):
        _entry(root, 0, k)
    for batch in range(12, 16):
        _offsets(root, batch, {"logOffset": batch})
    hdfs_store(root, STORE, range(1, 17), {12})
    assert verify(open_spark_checkpoint(str(root))).ok

    (root / gone).unlink()

    report = verify(open_spark_checkpoint(str(root)))
    assert not report.ok
    assert any(p.path.startswith("sources/0/") and "reads source 0's log" in p.problem
               for p in report.problems), report.problems
    newest = listing(open_spark_checkpoint(str(root))).batches[0]
    assert newest.batch == 15 and not newest.restartable
    assert newest.why_not and "sources/0/" in newest.why_not


def test_a_plain_entry_gone_after_its_compaction_is_not_missing(tmp_path: Path) -> None:
    """Spark deletes the plain files a compaction holds; a restart finds them in it."""
    root = tmp_path / "ckpt"
    write(root, "metadata", '{"id":"q"}')
    _entry(root, 0, 9, compact_from=0)
    _entry(root, 0, 10)
    _offsets(root, 8, {"logOffset": 8})
    _offsets(root, 9, {"logOffset": 9})
    _offsets(root, 10, {"logOffset": 10})
    hdfs_store(root, STORE, range(1, 12), {9})
    ckpt = open_spark_checkpoint(str(root))
    assert verify(ckpt).ok
    assert verify(ckpt, 9).ok


def _rocksdb_location(root: Path, batches: int = 8) -> Path:
    """A RocksDB (changelog) location: logs of `batches` batches, store versions 1-8 with
    snapshots at 2 and 6. With fewer than 8 batches it is one rolled back the way statehold
    did before the fix and stopped after its logs: versions of the abandoned batches are
    still there."""
    write(root, "metadata", '{"id":"q"}')
    for k in range(batches):
        _entry(root, 0, k)
        _offsets(root, k, {"logOffset": k})
    rocksdb_changelog_store(root, STORE, range(1, 9), {2, 6})
    backdate(root, 7200)
    return root


def test_state_left_above_the_logs_is_found_and_removed_by_a_rollback(tmp_path: Path) -> None:
    root = _rocksdb_location(tmp_path / "ckpt", batches=4)  # commits/3 the newest
    ckpt = open_spark_checkpoint(str(root))

    report = verify(ckpt)

    assert not report.ok
    assert [p.path for p in report.problems] == [f"{STORE}/5.changelog"]
    assert "above what any batch in the logs wrote" in report.problems[0].problem
    assert "6.zip" in str(listing(ckpt).stale_state)

    rollback(ckpt, 3, keep=str(tmp_path / "kept"))

    assert verify(open_spark_checkpoint(str(root))).ok
    assert not any(n.startswith(("5.", "6.", "7.", "8.")) for n in tree(root / STORE))


class _Breaking(LocalStorage):
    """A local disk whose deletes fail from the `after`-th on (a 503, a killed process)."""

    def __init__(self, root: str, after: int) -> None:
        super().__init__(root)
        self.left = after

    def delete_many(self, keys):  # type: ignore[no-untyped-def]
        if self.left <= 0:
            raise StorageError("503 Slow Down")
        self.left -= 1
        super().delete_many(keys)


def test_a_rollback_stopped_at_any_delete_is_seen_refused_around_and_finished(
    tmp_path: Path,
) -> None:
    template = _rocksdb_location(tmp_path / "template")
    whole = copy_tree(template, tmp_path / "whole")
    finished = rollback(open_spark_checkpoint(str(whole)), 3, keep=str(tmp_path / "whole-kept"))
    target = tree(whole)
    steps = len(finished.deleted) + 1  # and the mark
    assert steps > 10
    for step in range(steps):
        root = copy_tree(template, tmp_path / f"at-{step}")
        broken = open_spark_checkpoint(str(root))
        broken.storage = _Breaking(str(root), step)

        with pytest.raises(SparkCheckpointError, match="stopped at"):
            rollback(broken, 3, keep=str(tmp_path / f"kept-{step}"))

        ckpt = open_spark_checkpoint(str(root))
        found = ckpt.scan()
        # never a location Spark would restart from with state of the abandoned batches
        newest = found.newest_committed
        assert newest is not None
        assert not ckpt.stale_state(found) or not ckpt.restart_needs(found, newest).ok, step
        report = verify(ckpt)
        assert not report.ok and report.problems[-1].path == ROLLBACK_MARKER or (
            ROLLBACK_MARKER not in tree(root)
        ), (step, report.problems)
        if ROLLBACK_MARKER in tree(root):
            assert listing(ckpt).interrupted_rollback == 3
            interrupted = "rollback to batch 3 was interrupted"
            with pytest.raises(SparkCheckpointError, match=interrupted):
                savepoint(ckpt, str(tmp_path / f"sp-{step}"))
            with pytest.raises(SparkCheckpointError, match=interrupted):
                gc(ckpt, grace_seconds=0)
            with pytest.raises(SparkCheckpointError, match=interrupted):
                relocate(ckpt, "file:///in", "file:///moved")
            with pytest.raises(SparkCheckpointError, match="finish it first"):
                rollback(ckpt, 5)

        again = rollback(open_spark_checkpoint(str(root)), 3)

        assert tree(root).keys() == target.keys(), step
        assert verify(open_spark_checkpoint(str(root))).ok
        assert again.kept == f"file://{tmp_path}/kept-{step}" or again.kept is None
        kept = tmp_path / f"kept-{step}"
        assert verify(open_spark_checkpoint(str(kept))).batch == 7


class _UnreadableOnce(LocalStorage):
    """A local disk whose reads of `key` fail (a 503 from the store, right then)."""

    def __init__(self, root: str, key: str) -> None:
        super().__init__(root)
        self.key = key

    def read(self, key: str) -> bytes:
        if key == self.key:
            raise StorageError("503 Service Unavailable")
        return super().read(key)


@pytest.mark.parametrize("unreadable", ["offsets/3", f"{STORE}/2.zip"])
def test_a_rerun_refused_on_a_failed_read_deletes_nothing_and_is_finished_later(
    tmp_path: Path, unreadable: str
) -> None:
    """The simulation's `rollback-stuck` seeds 400108-400223: the rerun of a rollback cut
    short is refused when a file it must read to plan cannot be read at that moment. That
    is the rollback being careful, not stuck: it deletes nothing, the mark stays and names
    the rollback, and the next run, once the storage answers, finishes it."""
    template = _rocksdb_location(tmp_path / "template")
    whole = copy_tree(template, tmp_path / "whole")
    rollback(open_spark_checkpoint(str(whole)), 3, keep=str(tmp_path / "whole-kept"))
    root = copy_tree(template, tmp_path / "ckpt")
    cut = open_spark_checkpoint(str(root))
    cut.storage = _Breaking(str(root), 2)
    with pytest.raises(SparkCheckpointError, match="stopped at"):
        rollback(cut, 3, keep=str(tmp_path / "kept"))
    before = tree(root)
    assert ROLLBACK_MARKER in before

    failing = open_spark_checkpoint(str(root))
    failing.storage = _UnreadableOnce(str(root), unreadable)
    with pytest.raises(SparkCheckpointError, match=f"cannot roll back to batch 3: {unreadable}: "
                       "cannot be read .*503"):
        rollback(failing, 3)

    assert tree(root) == before  # nothing deleted, the mark still there
    assert listing(open_spark_checkpoint(str(root))).interrupted_rollback == 3
    again = rollback(open_spark_checkpoint(str(root)), 3)
    assert again.finished_interrupted and again.kept == f"file://{tmp_path}/kept"
    assert tree(root).keys() == tree(whole).keys()
    assert verify(open_spark_checkpoint(str(root))).ok


def test_a_newer_or_broken_mark_is_refused_not_guessed(tmp_path: Path) -> None:
    root = _rocksdb_location(tmp_path / "ckpt")
    before = tree(root)
    for body, match in [
        ('{"version": 9, "to_batch": 3}', "version 9, statehold reads up to 1"),
        ("{not json", "not valid JSON"),
        ('{"version": 1}', "not a rollback mark"),
    ]:
        write(root, ROLLBACK_MARKER, body)
        with pytest.raises(SparkCheckpointError, match=match):
            rollback(open_spark_checkpoint(str(root)), 3, force=True)
        with pytest.raises(SparkCheckpointError, match=match):
            savepoint(open_spark_checkpoint(str(root)), str(tmp_path / "sp"))
        assert not verify(open_spark_checkpoint(str(root))).ok
    assert {k: v for k, v in tree(root).items() if k != ROLLBACK_MARKER} == before


def _read_twice(root: Path) -> Path:
    """``a.union(a).union(b)`` as Spark 4 wrote it: offsets/N has one line per reference
    (a, a, b) while the logs are sources/0 (a) and sources/1 (b). a found a file in
    batches 0 and 1, b in batches 0 and 2."""
    write(root, "metadata", '{"id":"q"}')
    a = [0, 1, 1]
    b = [0, 0, 1]
    for batch in range(3):
        _offsets(root, batch, {"logOffset": a[batch]}, {"logOffset": a[batch]},
                 {"logOffset": b[batch]})
    for k in range(2):
        _entry(root, 0, k)
        _entry(root, 1, k)
    hdfs_store(root, STORE, range(1, 4), set())
    backdate(root, 7200)
    return root


def test_a_stream_read_twice_maps_its_lines_to_its_sources(tmp_path: Path) -> None:
    root = _read_twice(tmp_path / "ckpt")

    report = rollback(open_spark_checkpoint(str(root)), 1, keep=str(tmp_path / "kept"))

    # batch 2 found b's second file: b's entry 1 goes, a's entry 1 (batch 1) stays
    assert [k for k in report.deleted if k.startswith("sources/")] == ["sources/1/1"]
    assert verify(open_spark_checkpoint(str(root))).ok


def test_lines_that_cannot_be_told_apart_are_refused(tmp_path: Path) -> None:
    """Four lines, the first two equal at every batch, and logs for two sources: either a
    repeated reference (sources x, y, z) or two sources that happen to agree (w, x): the
    second source's offset is line 1 or line 2, and they differ."""
    root = tmp_path / "ckpt"
    write(root, "metadata", '{"id":"q"}')
    for batch in range(3):
        _offsets(root, batch, {"logOffset": batch}, {"logOffset": batch}, {"logOffset": 0},
                 {"n": batch})
    for k in range(3):
        _entry(root, 0, k)
    _entry(root, 1, 0)
    hdfs_store(root, STORE, range(1, 4), set())
    backdate(root, 7200)
    before = tree(root)

    with pytest.raises(SparkCheckpointError, match="cannot tell which of its 4 lines"):
        rollback(open_spark_checkpoint(str(root)), 1)

    assert tree(root) == before
    assert not verify(open_spark_checkpoint(str(root))).ok


def test_a_file_source_log_gone_whole_is_missing(tmp_path: Path) -> None:
    """Found by the simulation: the offsets still record a logOffset, the log is gone
    (Spark's restart would take every input file for new)."""
    root = _ahead(tmp_path / "ckpt")
    for entry in (root / "sources" / "0").iterdir():
        entry.unlink()

    report = verify(open_spark_checkpoint(str(root)))

    assert not report.ok
    assert report.problems[0].path == "sources/0/0", report.problems
    with pytest.raises(SparkCheckpointError, match="sources/0/0: missing"):
        savepoint(open_spark_checkpoint(str(root)), str(tmp_path / "sp"))


def test_a_mark_the_query_ran_on_from_is_left_behind_and_cleared(tmp_path: Path) -> None:
    """Found by the simulation: a rollback cut short, the query started anyway (Spark does
    not read the mark) and ran on past the mark's batch, which Spark then purged. The
    mark no longer blocks anything; verify says so; a rollback to the newest batch
    removes it and nothing else."""
    root = _rocksdb_location(tmp_path / "ckpt")
    broken = open_spark_checkpoint(str(root))
    broken.storage = _Breaking(str(root), 0)
    with pytest.raises(SparkCheckpointError, match="stopped at"):
        rollback(broken, 3, keep=str(tmp_path / "kept"))
    mark = root / ROLLBACK_MARKER
    later = mark.stat().st_mtime + 1
    for b in range(4):  # Spark's retention, once the query ran on
        (root / "offsets" / str(b)).unlink()
        (root / "commits" / str(b)).unlink()
    _entry(root, 0, 8)
    _offsets(root, 8, {"logOffset": 8})
    rocksdb_changelog_store(root, STORE, range(9, 10), set())
    for key in ("sources/0/8", "offsets/8", "commits/8", f"{STORE}/9.changelog"):
        os.utime(root / key, (later, later))
    ckpt = open_spark_checkpoint(str(root))

    report = verify(ckpt)

    assert [p.path for p in report.problems] == [ROLLBACK_MARKER]
    assert "left behind" in report.problems[0].problem
    assert listing(ckpt).interrupted_rollback is None
    assert savepoint(ckpt, str(tmp_path / "sp")).batch == 8
    before = {k: v for k, v in tree(root).items() if k != ROLLBACK_MARKER}
    cleared = rollback(ckpt, 8, force=True)
    assert cleared.deleted == [] and tree(root) == before
    assert verify(open_spark_checkpoint(str(root))).ok


def test_a_log_offset_far_past_the_log_is_reported_from_what_is_there(tmp_path: Path) -> None:
    """An offsets file's logOffset is any number a corrupt or hand-edited file says; the
    chain check walks the entries there are, never the numbers up to it (the fuzz test
    once grew the suite past its memory on such a file)."""
    root = _ahead(tmp_path / "ckpt")
    _offsets(root, 5, {"logOffset": 10**15})

    report = verify(open_spark_checkpoint(str(root)))

    assert [p.problem for p in report.problems if p.path == "sources/0/7"] == [
        "sources/0/7: missing (a restart after batch 5 reads source 0's log from 0 to "
        f"{10**15}; entries 7-{10**15} are gone)"]


def test_an_unreadable_operator_metadata_is_a_problem_not_a_layout_from_the_listing(
    tmp_path: Path,
) -> None:
    """The simulation's seed 2000556: a savepoint lost partition 1's only file, and one
    read of the operator metadata failed right then. statehold took the listing's
    partitions (0 only) and verify said ok, while Spark's restart loads both. A metadata
    file that cannot be read now stops verify, savepoint and gc, naming it."""
    meta = "state/0/_metadata/metadata"
    root = _rocksdb_location(tmp_path / "ckpt")
    write(root, meta, 'v1\n{"operatorInfo": {"operatorId": 0, "operatorName": "x"}, '
          '"stateStoreInfo": [{"storeName": "default", "numPartitions": 2}]}')
    assert [p.problem for p in verify(open_spark_checkpoint(str(root))).problems] == [
        "operator 0 partition 1 store default: no files at all"]
    before = tree(root)

    failing = open_spark_checkpoint(str(root))
    failing.storage = _UnreadableOnce(str(root), meta)
    report = verify(failing)
    assert not report.ok
    assert any(f"{meta}: cannot be read" in p.problem for p in report.problems), report
    with pytest.raises(SparkCheckpointError, match=f"{meta}: cannot be read"):
        savepoint(failing, str(tmp_path / "sp"))
    with pytest.raises(SparkCheckpointError, match=f"{meta}: cannot be read"):
        gc(failing, grace_seconds=0)
    assert tree(root) == before
