"""`statehold savepoint JOB NAME` and `statehold stop JOB` as processes, against a real
attempt (a coordinator with its lease, no Spark): the two forms of `savepoint`, the
one-line failures, and `statehold status` showing what is asked."""

from __future__ import annotations

from pathlib import Path

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import requests as fmt
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import open_storage
from tests.support.cli_process import statehold_cli


def attempt(job_dir: Path) -> CheckpointCoordinator:
    storage = open_storage(str(job_dir))
    return CheckpointCoordinator.start(storage, EmbeddedHAStore(storage), job_id=job_dir.name,
                                       max_parallelism=8)


def requests_in(job_dir: Path) -> list[str]:
    folder = job_dir / fmt.REQUESTS_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_job_without_a_running_driver_is_one_line(tmp_path: Path) -> None:
    job_dir = tmp_path / "ended"
    attempt(job_dir).close()
    for args in (("savepoint", str(job_dir), "sp"), ("stop", str(job_dir), "--wait")):
        run = statehold_cli(*args)
        assert run.code == 1 and len(run.err) == 1, run.err
        assert "no running driver" in run.err[0] and "no lease" in run.err[0]
    assert requests_in(job_dir) == []


def test_savepoint_tells_its_two_forms_apart(tmp_path: Path) -> None:
    job_dir = tmp_path / "running"
    coord = attempt(job_dir)
    batch = statehold_cli("savepoint", str(job_dir), "sp", "--batch", "3")
    assert batch.code == 1 and "--batch is for a Spark checkpoint location" in batch.err[0]
    neither = statehold_cli("savepoint", str(tmp_path / "nothing"), "sp", "--wait")
    assert neither.code == 1 and len(neither.err) == 1
    assert "nothing: no such directory" in neither.err[0]
    assert "or a running statehold job's directory" in neither.err[0], neither.err
    bad = statehold_cli("savepoint", str(job_dir), "../escape")
    assert bad.code == 1 and "bad savepoint name" in bad.err[0], bad.err
    help_text = "\n".join(statehold_cli("savepoint", "--help").out)
    assert "savepoint CKPT DEST [--batch N]" in help_text
    assert "savepoint JOB NAME [--wait] [--timeout S]" in help_text
    assert requests_in(job_dir) == []
    coord.close()


def test_a_timeout_withdraws_and_status_shows_what_is_asked(tmp_path: Path) -> None:
    job_dir = tmp_path / "running"
    coord = attempt(job_dir)  # running, but nobody serves its requests here
    run = statehold_cli("stop", str(job_dir), "--wait", "--timeout", "0.5")
    assert run.code == 1 and len(run.err) == 1, run.err
    assert "timed out after 0.5s" in run.err[0] and "withdrawn" in run.err[0]
    assert requests_in(job_dir) == []
    asked = statehold_cli("stop", str(job_dir), "--savepoint", "last")
    assert asked.code == 0 and "for a stop with savepoint last" in asked.out[0], asked.err
    status = statehold_cli("status", str(job_dir)).out
    assert any(line.startswith(f"asked: stop with savepoint last of attempt {coord.epoch}")
               for line in status), status
    coord.close()
