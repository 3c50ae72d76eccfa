"""A full disk under a running job: the local job directory, and separately the tasks'
local state directory (RocksDB), each on a small tmpfs that a ballast file fills.

The checkpoint under way fails with one clear line, nothing is half-published (no
`_metadata` names a missing file, the HA pointer stays at the previous checkpoint, no
temporary file is left), and once the space is back the job resumes — a failed task is
reopened from the latest checkpoint and the batches after it are replayed, as Spark
would — with exact state. The job directory is listed at the end: every referenced file
is there and no orphan is left.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from statehold.backend import TaskStateBackend
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.ha.open import open_ha_store
from statehold.storage import LocalStorage, Storage
from statehold.storage.local import TEMP_MARKER
from tests.support import zombie_driver as zd
from tests.support.hang_detector import bounded
from tests.support.job_dir_contents import assert_reconciled_exact, listing
from tests.support.small_fs import small_fs

BOUND = 120.0


def assert_nothing_half_published(storage: Storage, latest: int) -> None:
    """Every `_metadata` in the directory names only files that are there; no temp file."""
    keys = listing(storage)
    assert not [k for k in keys if TEMP_MARKER in k], "temporary files left"
    for key in keys:
        if key.endswith("/_metadata"):
            missing = set(referenced_keys(read_metadata(storage, key), key)) - keys
            assert not missing, f"{key} names missing files: {sorted(missing)}"
    metadata = sorted(k for k in keys if k.startswith("chk-") and k.endswith("/_metadata"))
    assert layout.checkpoint_metadata_key(latest) in metadata


def checkpoint(
    storage: Storage, coord: CheckpointCoordinator, tasks: list[TaskStateBackend], n: int,
    between: object = None,
) -> None:
    zd.snapshot_all(storage, coord, tasks, n, between)
    coord.complete(n, {"batch_id": n})
    for task in tasks:
        task.commit_local(n)


def one_line(error: BaseException) -> str:
    text = str(error)
    assert text and "\n" not in text, f"not one line: {text!r}"
    return text


def test_a_full_job_directory_fails_the_checkpoint_cleanly_and_the_job_resumes(
    tmp_path: Path,
) -> None:
    with small_fs(tmp_path / "small", "8m") as fs:
        job_id = f"job-{uuid.uuid4().hex[:12]}"
        storage = LocalStorage(fs.path / "checkpoints").child(job_id)
        ha = open_ha_store("embedded", storage, job_id)
        coord = CheckpointCoordinator.start(
            storage, ha, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
        )
        tasks = zd.open_tasks(storage, coord, tmp_path / "local")
        try:
            for n in (1, 2):
                zd.apply(tasks, n)
                checkpoint(storage, coord, tasks, n)
            zd.apply(tasks, 3)
            # The disk fills after the first task uploaded its part of checkpoint 3.
            with pytest.raises(StateholdError) as caught:
                bounded(lambda: checkpoint(storage, coord, tasks, 3, fs.fill), BOUND,
                        "a checkpoint on a full disk")
            assert "full" in one_line(caught.value)
            coord.abort(3, f"storage: {caught.value}")
            assert ha.read().latest is not None and ha.read().latest.checkpoint_id == 2
            assert_nothing_half_published(storage, 2)
            assert layout.checkpoint_metadata_key(3) not in listing(storage)

            fs.free()  # the space comes back; checkpoint 4 holds batches 3 and 4
            for n in (4, 5):
                zd.apply(tasks, n)
                checkpoint(storage, coord, tasks, n)
            assert [p.checkpoint_id for p in ha.read().retained] == [2, 4, 5]
            assert_reconciled_exact(storage, coord, BOUND)
            assert zd.restored_totals(storage, ha, tmp_path / "verify") == zd.reference(5)
        finally:
            for task in tasks:
                task.close()
            coord.close()
            ha.close()


def test_a_full_local_state_directory_fails_the_task_and_the_job_resumes(
    tmp_path: Path,
) -> None:
    with small_fs(tmp_path / "small", "16m") as fs:
        job_id = f"job-{uuid.uuid4().hex[:12]}"
        storage = LocalStorage(tmp_path / "checkpoints").child(job_id)
        ha = open_ha_store("embedded", storage, job_id)
        coord = CheckpointCoordinator.start(
            storage, ha, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
        )
        local = fs.path / "state"
        tasks = zd.open_tasks(storage, coord, local)
        try:
            for n in (1, 2):
                zd.apply(tasks, n)
                checkpoint(storage, coord, tasks, n)
            fs.fill()
            # Batch 3 and its checkpoint need local room (RocksDB's log, flushes, the
            # snapshot's files): the task fails somewhere in them, with one line.
            with pytest.raises(StateholdError) as caught:
                def batch_3() -> None:
                    zd.apply(tasks, 3)
                    checkpoint(storage, coord, tasks, 3)

                bounded(batch_3, BOUND, "a batch on a full local state directory")
            assert "No space left" in one_line(caught.value)
            if 3 in coord.pending_ids():
                coord.abort(3, f"task: {caught.value}")
            assert ha.read().latest is not None and ha.read().latest.checkpoint_id == 2
            assert_nothing_half_published(storage, 2)

            # The failed tasks go; with the space back they are reopened from the
            # latest checkpoint and batch 3 is replayed (as Spark retries a task).
            for task in tasks:
                task.close()  # must not raise: the working copy is discarded anyway
            tasks = []
            fs.free()
            tasks = zd.open_tasks(storage, coord, local)
            for n in (3, 4):
                zd.apply(tasks, n)
                checkpoint(storage, coord, tasks, n)
            assert zd.totals_of(tasks) == zd.reference(4)
            assert_reconciled_exact(storage, coord, BOUND)
            assert zd.restored_totals(storage, ha, tmp_path / "verify") == zd.reference(4)
        finally:
            for task in tasks:
                task.close()
            coord.close()
            ha.close()
