"""ZooKeeper goes away in the middle of a run (the server is stopped, then restarted).

While ZooKeeper is unreachable the driver can neither complete a checkpoint (the fenced
publish cannot reach it) nor delete anything (the cleaner's guard, `check_epoch`, cannot
confirm the epoch, so the batch waits). What happens when the server is back: the epoch
is persistent data in the job's znode, not tied to the client's session, so the same
attempt continues with the SAME epoch as soon as a synced read confirms it is still
current — whether kazoo resumed its old session or had to open a new one (the test
records which). It would have to re-claim (a new attempt, restoring from the HA store)
only if another attempt had claimed the job meanwhile; then it gets FencedError.
Nothing is lost: every file a retained checkpoint references is still there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.backend import TaskStateBackend
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.ha import HAStoreError, ZooKeeperHAStore
from statehold.storage import LocalStorage, Storage
from tests.support import zombie_driver as zd
from tests.support.job_dir_contents import data_files, listing, referenced
from tests.support.zk import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

WAIT = 60.0


def checkpoint(
    storage: Storage, coord: CheckpointCoordinator, tasks: list[TaskStateBackend], n: int
) -> None:
    zd.snapshot_all(storage, coord, tasks, n)
    coord.complete(n, {"batch_id": n})
    for task in tasks:
        task.commit_local(n)


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.05)


def test_session_loss_stops_writing_until_the_epoch_is_re_established(
    tmp_path: Path,
    zk_server: ZooKeeperServer,
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    storage = LocalStorage(tmp_path / "checkpoints").child(job_id)
    ha = ZooKeeperHAStore.from_uri(
        f"zookeeper://{zk_server.hosts}/statehold-session-loss", job_id, timeout=1.5
    )
    coord = CheckpointCoordinator.start(
        storage, ha, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
    )
    tasks = zd.open_tasks(storage, coord, tmp_path / "local")
    try:
        for n in (1, 2, 3):
            zd.apply(tasks, n)
            checkpoint(storage, coord, tasks, n)
        assert coord.wait_reconciled(WAIT)
        epoch = coord.epoch
        session_before = ha._client.client_id
        ha_before = ha.read()
        before = listing(storage)
        kept = referenced(storage, coord)

        zk_server.stop()
        try:
            zd.apply(tasks, 4)
            zd.snapshot_all(storage, coord, tasks, 4)  # uploads still work: storage is up
            with pytest.raises(HAStoreError, match="not connected"):
                coord.complete(4, {"batch_id": 4})
            assert coord.latest() is not None and coord.latest()[1].checkpoint_id == 3
            assert coord.pending_ids() == [4]  # not completed (and not forgotten)
            with pytest.raises(HAStoreError):
                coord.check_epoch()
            # Whether 4 was published cannot be told while ZooKeeper is away, so the
            # abort deletes nothing of it (not even through the cleaner): the reconcile
            # decides later, from the HA store.
            coord.abort(4, "HA store unreachable")
            assert coord.cleaner.wait_idle(WAIT)
            assert before <= listing(storage), "nothing deleted while ZooKeeper is away"
            assert layout.checkpoint_metadata_key(4) in listing(storage)
        finally:
            zk_server.start()

        # The same client reconnects by itself; the epoch is still ours.
        def reconnected() -> bool:
            try:
                coord.check_epoch()
                return True
            except HAStoreError:
                return False

        until(reconnected, "the driver to re-establish its epoch")
        session_after = ha._client.client_id
        print(f"session survived the restart: {session_before == session_after}")
        state = ha.read()
        assert (state.epoch, state.retained) == (epoch, ha_before.retained)
        assert kept <= listing(storage)

        # Processing goes on with the same epoch; checkpoint 5 holds batches 4 and 5.
        for n in (5, 6):
            zd.apply(tasks, n)
            checkpoint(storage, coord, tasks, n)
        assert coord.epoch == epoch
        state = ha.read()
        assert state.epoch == epoch
        assert [p.checkpoint_id for p in state.retained] == [3, 5, 6]
        assert [p.metadata for p in state.retained] == [k for k, _ in coord.retained()]
        coord.start_reconcile()  # what 4 left is found by the reconcile (4 < the latest, 6)
        assert coord.wait_reconciled(WAIT)
        assert layout.checkpoint_metadata_key(4) not in listing(storage)
        assert data_files(storage) == referenced(storage, coord)  # nothing lost or leaked
        assert zd.restored_totals(storage, ha, tmp_path / "verify") == zd.reference(6)
    finally:
        for task in tasks:
            task.close()
        coord.close()
        ha.close()
