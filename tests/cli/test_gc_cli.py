"""`statehold gc`: dry run, real run, a running job's in-flight files, bad input."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from statehold.cli import app
from statehold.storage import LocalStorage
from tests.support.in_flight import leave_in_flight_mess, ours, start
from tests.support.simulated_tasks import (
    RANGES,
    SimulatedTask,
    listing,
    referenced_by_retained,
    run_checkpoint,
)

runner = CliRunner()


def test_gc_dry_run_then_gc_of_a_crashed_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = LocalStorage(tmp_path / "job")
    coord = start(storage, lease_ttl=60.0)
    tasks = [SimulatedTask(storage, r, random.Random(9)) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    leave_in_flight_mess(storage, coord, tasks, 4)
    coord.cleaner.close()
    assert coord.lease is not None
    coord.lease.stop(release=True)  # a driver that stopped (no fresh lease)
    before = listing(storage)

    dry = runner.invoke(app, ["gc", str(storage.root), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and report["live_epoch"] is None
    assert listing(storage) == before  # a dry run deletes nothing
    # chk-4/ (after the newest retained) is spared: the next attempt writes that very
    # key, and an outside delete landing after it would take a published document.
    next_chk = {k for k in ours(before) if k.startswith("chk-4/")}
    assert next_chk
    expected = ours(before) - referenced_by_retained(storage, coord) - next_chk
    assert set(report["orphans"]) == expected
    sizes = {info.key: info.size for info in storage.list()}
    assert report["orphan_bytes"] == sum(sizes[k] for k in expected) > 0
    assert next_chk <= set(report["protected"])

    real = runner.invoke(app, ["gc", str(storage.root)])
    assert real.exit_code == 0, real.output
    assert f"deleted {len(expected)} orphan(s)" in real.stdout
    assert ours(listing(storage)) == referenced_by_retained(storage, coord) | next_chk


def test_gc_while_the_job_runs_spares_its_in_flight_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = LocalStorage(tmp_path / "job")
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(10)) for r in RANGES]
    for n in range(1, 3):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    in_flight = leave_in_flight_mess(storage, coord, tasks, 3)
    result = runner.invoke(app, ["gc", str(storage.root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["live_epoch"] == coord.epoch
    assert in_flight <= set(report["protected"])
    assert in_flight <= listing(storage)
    coord.close()


def test_gc_refuses_what_is_not_a_job_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    result = runner.invoke(app, ["gc", str(tmp_path / "data"), "--json"])
    assert result.exit_code == 1
    assert "not a statehold job directory" in result.stderr
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"


def test_status_shows_the_running_attempt_and_its_cleanup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = LocalStorage(tmp_path / "job")
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(11)) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    assert coord.lease is not None
    coord.lease.renew()  # publish the current status now rather than at the next beat
    result = runner.invoke(app, ["status", str(storage.root), "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["running"] is True and status["epoch"] == coord.epoch
    assert status["retained"] == [2, 3]
    assert status["attempt"]["latest_checkpoint"] == 3
    assert "pending_keys" in status["attempt"]["cleaner"]
    coord.close()
    after = json.loads(runner.invoke(app, ["status", str(storage.root), "--json"]).stdout)
    assert after["running"] is False


def test_gc_refuses_an_unknown_ha_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = LocalStorage(tmp_path / "job")
    coord = start(storage)
    coord.close()
    before = listing(storage)
    result = runner.invoke(app, ["gc", str(storage.root), "--ha", "etcd://x"])
    assert result.exit_code == 1
    assert "zookeeper://" in result.stderr
    assert listing(storage) == before


def _broken_job(tmp_path, damage: str) -> tuple[LocalStorage, set[str], set[str]]:  # type: ignore[no-untyped-def]
    """A stopped job with orphans, then one kind of damage. Returns the storage, its
    listing and what the retained checkpoints referenced before the damage."""
    from statehold.format import layout, metadata
    from statehold.format.metadata import read_metadata

    storage = LocalStorage(tmp_path / "job")
    coord = start(storage)
    tasks = [SimulatedTask(storage, r, random.Random(12)) for r in RANGES]
    for n in range(1, 4):
        run_checkpoint(coord, tasks, n)
    coord.wait_reconciled(60)
    leave_in_flight_mess(storage, coord, tasks, 4)  # orphans gc would otherwise delete
    coord.cleaner.close()
    assert coord.lease is not None
    coord.lease.stop(release=True)
    needed = referenced_by_retained(storage, coord)
    key = layout.checkpoint_metadata_key(3)
    if damage == "corrupt":
        storage.write(key, storage.read(key)[:-40])
    elif damage == "escaping-path":
        meta = read_metadata(storage, key)
        op = meta.operators[0]
        kg = op.ranges[0]
        bad = kg.files[0].model_copy(update={"path": "../../elsewhere/x"})
        meta = meta.model_copy(update={"operators": [op.model_copy(update={"ranges": [
            kg.model_copy(update={"files": [bad, *kg.files[1:]]}), *op.ranges[1:]]})]})
        doc = meta.model_dump(mode="json")
        doc["checksum"] = metadata.signed.digest(doc)  # valid checksum: the path is the problem
        storage.write(key, json.dumps(doc).encode())
    elif damage == "missing-file":
        victim = sorted(k for k in referenced_by_retained(storage, coord) if "shared/" in k)[0]
        storage.delete_many([victim])
    return storage, listing(storage), needed


def test_gc_of_a_job_missing_a_file_deletes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage, before, _ = _broken_job(tmp_path, "missing-file")
    result = runner.invoke(app, ["gc", str(storage.root), "--json"])
    assert result.exit_code == 1, result.output
    assert "missing" in result.stderr
    assert json.loads(result.stdout)["ok"] is False
    assert listing(storage) == before


@pytest.mark.parametrize("damage", ["corrupt", "escaping-path"])
def test_gc_quarantines_a_damaged_document_and_spares_its_files(tmp_path, damage: str) -> None:  # type: ignore[no-untyped-def]
    # changed on purpose (one deletion policy, statehold.cleanup.policy): a retained document that
    # does not verify is quarantined, no longer fatal to gc; its directory and every data
    # file its text still names are spared, and only the orphans are deleted
    storage, before, needed = _broken_job(tmp_path, damage)
    expected = {"corrupt": "not valid JSON", "escaping-path": "leaves the job directory"}[damage]
    # the in-flight mess of checkpoint 4, but chk-4/ itself (after the newest retained,
    # rewritten by the next attempt) is spared by an outside gc
    orphans = {k for k in ours(before) - needed if not k.startswith("chk-4/")}
    assert orphans

    dry = runner.invoke(app, ["gc", str(storage.root), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "quarantined (its files are spared): chk-3/_metadata" in dry.stdout
    assert expected in dry.stdout  # one line, never wrapped
    assert listing(storage) == before

    result = runner.invoke(app, ["gc", str(storage.root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["quarantined"]) == ["chk-3/_metadata"]
    assert expected in report["quarantined"]["chk-3/_metadata"]
    assert set(report["orphans"]) == orphans and report["deleted"] == len(orphans)
    assert listing(storage) == before - orphans
    assert needed <= listing(storage)


def test_status_refuses_what_is_not_a_job_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "data").mkdir()
    result = runner.invoke(app, ["status", str(tmp_path / "data"), "--json"])
    assert result.exit_code == 1
    assert "not a statehold job directory" in result.stderr
