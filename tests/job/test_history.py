"""Checkpoint history: one record per completed or aborted checkpoint in the job
directory, bounded, kept by the deletion policy, read within bounds, shown by the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statehold.cleanup import policy
from statehold.cleanup.gc import gc
from statehold.cli import app
from statehold.job import history
from statehold.job.directory import open_job
from statehold.storage import Storage, UnsafePathError, open_storage
from tests.support.fault_injection_storage import FaultyStorage
from tests.support.minipipeline import MiniPipeline, make_batch


def _run(storage: Storage, local: Path, batches: int, keep: int) -> MiniPipeline:
    pipeline = MiniPipeline(storage, local)
    pipeline.coord.history.keep = keep
    for i in range(batches):
        pipeline.run_batch(make_batch(i))
    return pipeline


def test_records_match_the_checkpoints_and_stay_bounded(storage: Storage, tmp_path: Path) -> None:
    pipeline = _run(storage, tmp_path / "local", 7, keep=3)
    try:
        records = history.read_history(storage, limit=None)
        assert len(history.record_keys(storage)) <= 4  # keep + keep // 10 (at least 1)
        assert [r.checkpoint_id for r in records][-3:] == [4, 5, 6]
        recent = history.read_history(storage, limit=3)
        assert [r.checkpoint_id for r in recent] == [4, 5, 6]
        by_id = {r.checkpoint_id: r for r in records}
        for _key, meta in pipeline.coord.retained():
            record = by_id[meta.checkpoint_id]
            infos = [kg.info for op in meta.operators for kg in op.ranges]
            assert record.outcome == "completed" and record.epoch == meta.epoch
            assert record.bytes_uploaded == sum(i["bytes_uploaded"] for i in infos)
            assert record.files_uploaded == sum(i["files_uploaded"] for i in infos)
            assert record.files_reused == sum(i["files_reused"] for i in infos)
            assert record.state_size == sum(i["state_size"] for i in infos)
            assert record.state_size == record.bytes_uploaded + record.bytes_reused
            assert record.ended_at >= record.started_at and record.reason is None
        assert records[-1].files_reused > 0  # incremental: later checkpoints reuse files
    finally:
        pipeline.close()


def test_an_aborted_checkpoint_leaves_its_reason(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    pipeline = _run(storage, tmp_path / "local", 1, keep=10)
    try:
        pipeline.coord.begin(1)
        pipeline.coord.abort(1, "ValueError: the sink refused the batch")
        last = history.read_history(storage)[-1]
        assert (last.checkpoint_id, last.outcome) == (1, "aborted")
        assert last.reason == "ValueError: the sink refused the batch"
    finally:
        pipeline.close()


def test_the_policy_keeps_history_and_prunes_only_the_oldest(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    _run(storage, tmp_path / "local", 3, keep=10).close()
    keys = history.record_keys(storage)
    assert len(keys) == 3
    with open_job(str(tmp_path / "job")) as job:
        report = gc(job)
    assert not set(keys) & set(report.orphans)
    assert history.record_keys(storage) == keys
    assert policy.history_to_prune([*keys, "_job/owner.json"], 1) == keys[:2]
    assert policy.check_discardable(keys[0]) == keys[0]
    with pytest.raises(UnsafePathError):
        policy.check_discardable("_job/owner.json")


def test_damaged_or_huge_records_are_skipped_not_trusted(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    _run(storage, tmp_path / "local", 2, keep=10).close()
    first, second = history.record_keys(storage)
    doc = json.loads(storage.read(first))
    doc["bytes_uploaded"] = 1  # the checksum no longer matches
    storage.write(first, json.dumps(doc).encode())
    storage.write(second, b"[" * 100 + b"]" * 100)
    assert history.read_history(storage) == []
    with pytest.raises(history.HistoryError, match="more than"):
        history.decode(b" " * (history.MAX_RECORD_BYTES + 1), first)


def test_cli_history(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    _run(storage, tmp_path / "local", 3, keep=10).close()
    result = CliRunner().invoke(app, ["history", str(tmp_path / "job"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["checkpoint_id"] for r in doc["records"]] == [0, 1, 2]
    plain = CliRunner().invoke(app, ["history", str(tmp_path / "job"), "--limit", "2"])
    lines = plain.stdout.splitlines()
    assert lines[0].startswith("checkpoint\tepoch\toutcome") and len(lines) == 3
    assert lines[1].split("\t")[:3] == ["1", "1", "completed"]


def test_history_moves_with_the_job_directory(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "job"))
    _run(storage, tmp_path / "local", 2, keep=10).close()
    shutil.copytree(tmp_path / "job", tmp_path / "elsewhere" / "job")
    moved = history.read_history(open_storage(str(tmp_path / "elsewhere" / "job")))
    assert [(r.checkpoint_id, r.bytes_uploaded) for r in moved] == [
        (r.checkpoint_id, r.bytes_uploaded) for r in history.read_history(storage)]
    assert len(moved) == 2


def test_a_failing_history_write_never_fails_the_checkpoint(tmp_path: Path) -> None:
    storage = FaultyStorage(open_storage(str(tmp_path / "job")))
    storage.fail_permanently(history.HISTORY_DIR, kinds=("write", "list"))
    pipeline = _run(storage, tmp_path / "local", 2, keep=10)
    try:
        assert [m.checkpoint_id for _, m in pipeline.coord.retained()] == [0, 1]
        assert pipeline.coord.history.last is not None  # built, just not stored
    finally:
        pipeline.close()
    storage.heal_all()
    assert history.read_history(storage) == []
