"""A statehold job (the checkpoint coordinator over real keyed state, RocksDB task
backends) on an s3:// job directory with the ZooKeeper HA store, both reached through
fault-injecting proxies, while S3 and ZooKeeper misbehave.

Under transient faults (5xx bursts, resets, an upload cut or stalled part-way, latency
and a bandwidth limit, ZooKeeper connections reset) every checkpoint completes and the
state is exact. Under an S3 outage longer than the client's retries the checkpoint fails
with one StorageError line, nothing is published, and the job resumes once S3 is back.
Under a partition from ZooKeeper longer than the session timeout the driver cannot
publish, a new attempt takes over, and the old one is fenced when the partition heals:
none of its writes lands on the new attempt's files. Each test ends by listing the job
directory: every referenced file is there, and no orphan is left once the job ends
(a ZooKeeper server restarted under a job: tests/ha/test_zk_session_loss.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from statehold.backend import TaskStateBackend
from statehold.checkpoint.coordinator import CheckpointCoordinator, CheckpointError
from statehold.format.metadata import read_metadata
from statehold.ha import HAStoreError, ZooKeeperHAStore
from statehold.ha.base import FencedError
from statehold.job.owner import write_owner
from statehold.storage import Storage, StorageError, open_storage
from tests.support import zombie_driver as zd
from tests.support.fault_injection_proxy import FaultProxy
from tests.support.hang_detector import bounded
from tests.support.infra.object_store_servers import S3Server
from tests.support.job_dir_contents import assert_reconciled_exact, data_files, referenced
from tests.support.zk import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

#: Hang detector for one checkpoint or one wait (far above any retry schedule).
BOUND = 120.0
#: The S3 client's per-request timeout here: a stalled request fails after it and is
#: retried (statehold's default is 15 minutes).
REQUEST_TIMEOUT = timedelta(seconds=3)
#: The driver's bound on each HA call (ZooKeeper's session timeout is then 4 s).
HA_TIMEOUT = 1.5


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.05)


def checkpoint(
    storage: Storage, coord: CheckpointCoordinator, tasks: list[TaskStateBackend], n: int,
    between: Callable[[], None] | None = None,
) -> None:
    zd.snapshot_all(storage, coord, tasks, n, between)
    coord.complete(n, {"batch_id": n})
    for task in tasks:
        task.commit_local(n)




def job_storage(s3_server: S3Server, endpoint: str, job_id: str) -> Storage:
    options = {**s3_server.options, "endpoint": endpoint, "timeout": REQUEST_TIMEOUT}
    return open_storage(f"s3://{s3_server.bucket}/faults", **options).child(job_id)


def test_a_job_rides_through_transient_s3_and_zookeeper_faults(
    tmp_path: Path, s3_server: S3Server, s3_proxy: FaultProxy, zk_proxy: FaultProxy
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    storage = job_storage(s3_server, s3_proxy.endpoint, job_id)
    ha = ZooKeeperHAStore.from_uri(
        f"zookeeper://{zk_proxy.hosts}/statehold-faults", job_id, timeout=HA_TIMEOUT
    )
    coord = CheckpointCoordinator.start(
        storage, ha, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
    )
    tasks = zd.open_tasks(storage, coord, tmp_path / "local")

    def slow() -> None:
        for proxy in (s3_proxy, zk_proxy):
            proxy.set_latency(0.02)
            proxy.set_bandwidth(2_000_000)

    faults: list[tuple[str, Callable[[], None], str]] = [
        ("503 burst", lambda: s3_proxy.fail_requests(5, 503), "status_503"),
        ("500 burst", lambda: s3_proxy.fail_requests(3, 500), "status_500"),
        ("resets", lambda: s3_proxy.reset_requests(3), "reset"),
        ("upload closed", lambda: s3_proxy.cut_upload(20, "close", min_body=100), "cut_close"),
        ("upload reset", lambda: s3_proxy.cut_upload(20, "reset", min_body=100), "cut_reset"),
        ("upload stalled", lambda: s3_proxy.cut_upload(20, "stall", min_body=100), "cut_stall"),
        ("slow links", slow, "requests"),
        ("zookeeper reset", zk_proxy.reset_all, "reset_all"),
    ]
    try:
        for n, (name, inject, seen) in enumerate(faults, start=1):
            zd.apply(tasks, n)
            inject()
            try:
                bounded(lambda n=n: checkpoint(storage, coord, tasks, n), BOUND, name)
            except HAStoreError:
                # A reset ZooKeeper connection may fail the publish once (the outcome
                # is unknown); the next checkpoint subsumes this one.
                assert name == "zookeeper reset"
                coord.abort(n, "HA store unreachable")
            s3_proxy.heal()
            zk_proxy.heal()
            counts = zk_proxy.counts if name == "zookeeper reset" else s3_proxy.counts
            assert counts[seen] >= 1, f"{name}: the fault never happened ({counts})"
        last = len(faults) + 1
        zd.apply(tasks, last)
        checkpoint(storage, coord, tasks, last)
        assert coord.latest() is not None and coord.latest()[1].checkpoint_id == last
        assert zd.totals_of(tasks) == zd.reference(last)
        assert_reconciled_exact(storage, coord, BOUND)
        assert zd.restored_totals(storage, ha, tmp_path / "verify") == zd.reference(last)
    finally:
        for task in tasks:
            task.close()
        coord.close()
        ha.close()


def test_an_s3_outage_fails_the_checkpoint_in_one_line_and_the_job_resumes(
    tmp_path: Path, s3_server: S3Server, s3_proxy: FaultProxy, zk_server: ZooKeeperServer,
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    storage = job_storage(s3_server, s3_proxy.endpoint, job_id)
    ha = ZooKeeperHAStore.from_uri(
        f"zookeeper://{zk_server.hosts}/statehold-faults", job_id, timeout=HA_TIMEOUT
    )
    coord = CheckpointCoordinator.start(
        storage, ha, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
    )
    tasks = zd.open_tasks(storage, coord, tmp_path / "local")
    try:
        for n in (1, 2):
            zd.apply(tasks, n)
            checkpoint(storage, coord, tasks, n)
        before = ha.read()
        zd.apply(tasks, 3)
        # S3 goes away after the first task's upload of checkpoint 3.
        with pytest.raises(StorageError) as caught:
            bounded(
                lambda: checkpoint(storage, coord, tasks, 3,
                                   lambda: s3_proxy.fail_requests(100_000, 503)),
                BOUND, "a checkpoint during an S3 outage",
            )
        assert "\n" not in str(caught.value) and "503" in str(caught.value), caught.value
        coord.abort(3, f"storage: {caught.value}")
        assert ha.read().retained == before.retained  # nothing published
        s3_proxy.heal()
        # The job goes on: checkpoint 4 holds batches 3 and 4.
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


def test_a_partition_from_zookeeper_past_the_session_timeout_fences_the_old_attempt(
    tmp_path: Path, s3_server: S3Server, zk_server: ZooKeeperServer, zk_proxy: FaultProxy,
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    root = "statehold-partition"
    storage = job_storage(s3_server, s3_server.endpoint, job_id)
    # Attempt A reaches ZooKeeper through the proxy; B (and the test's observer) directly.
    # The job's owner record names both addresses of the one server, as a connect string
    # lists an ensemble's members: each attempt names one of them.
    write_owner(storage, job_id, f"zookeeper://{zk_proxy.hosts},{zk_server.hosts}/{root}")
    ha_a = ZooKeeperHAStore.from_uri(
        f"zookeeper://{zk_proxy.hosts}/{root}", job_id, timeout=HA_TIMEOUT
    )
    coord_a = CheckpointCoordinator.start(
        storage, ha_a, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
    )
    tasks_a = zd.open_tasks(storage, coord_a, tmp_path / "local-a")
    observer = ZooKeeperHAStore.from_uri(f"zookeeper://{zk_server.hosts}/{root}", job_id)
    probe = f"/{root}-probe-{job_id}"
    ha_b = coord_b = None
    tasks_b: list[TaskStateBackend] = []
    try:
        for n in (1, 2):
            zd.apply(tasks_a, n)
            checkpoint(storage, coord_a, tasks_a, n)
        # An ephemeral node of A's session tells the test when ZooKeeper expired it.
        ha_a._client.create(probe, b"", ephemeral=True)

        zk_proxy.partition()
        zd.apply(tasks_a, 3)
        with pytest.raises(HAStoreError) as caught:
            bounded(lambda: checkpoint(storage, coord_a, tasks_a, 3), BOUND,
                    "a checkpoint cut off from ZooKeeper")
        assert "\n" not in str(caught.value)
        coord_a.abort(3, "HA store unreachable")  # deletes nothing: the outcome is unknown
        until(lambda: observer._client.exists(probe) is None, "A's session to expire")

        # Attempt B takes over: a new epoch, restored from A's last published checkpoint.
        ha_b = ZooKeeperHAStore.from_uri(f"zookeeper://{zk_server.hosts}/{root}", job_id)
        coord_b = CheckpointCoordinator.start(
            storage, ha_b, job_id=job_id, max_parallelism=zd.MAX_PARALLELISM, retain=zd.RETAIN
        )
        assert coord_b.epoch > coord_a.epoch
        assert coord_b.latest() is not None and coord_b.latest()[1].checkpoint_id == 2
        tasks_b = zd.open_tasks(storage, coord_b, tmp_path / "local-b")
        for n in (3, 4, 5, 6):
            zd.apply(tasks_b, n)
            checkpoint(storage, coord_b, tasks_b, n)
        state_b = observer.read()
        files_b = {k: storage.read(k) for k in referenced(storage, coord_b)}

        # The partition heals: A reconnects (a new session) and finds itself fenced.
        zk_proxy.heal()

        def a_is_fenced() -> bool:
            try:
                coord_a.check_epoch()
            except FencedError:
                return True
            except HAStoreError:
                return False  # still reconnecting
            raise AssertionError("the old attempt still holds the epoch")

        until(a_is_fenced, "A to learn it is fenced")
        # A zombie that carries on is refused at its first fenced step.
        zd.apply(tasks_a, 4)
        with pytest.raises((FencedError, CheckpointError)):
            bounded(lambda: checkpoint(storage, coord_a, tasks_a, 7), BOUND, "a fenced checkpoint")
        coord_a.abort(7, "fenced")
        coord_a.close(drain_timeout=BOUND)
        assert coord_a.cleaner.status().fenced  # its cleaner's guard refused

        # None of A's writes landed on B's: same HA state, same bytes.
        after = observer.read()
        assert (after.epoch, after.retained) == (state_b.epoch, state_b.retained)
        assert {k: storage.read(k) for k in files_b} == files_b
        for pointer in after.retained:
            assert read_metadata(storage, pointer.metadata).epoch == coord_b.epoch

        # B goes on past the checkpoint A tried last (A's chk-7/_metadata is a zombie's,
        # not B's to keep), then its reconcile removes what A left, and only that.
        for n in (7, 8):
            zd.apply(tasks_b, n)
            checkpoint(storage, coord_b, tasks_b, n)
        for pointer in observer.read().retained:
            assert read_metadata(storage, pointer.metadata).epoch == coord_b.epoch
        files_b = {k: storage.read(k) for k in referenced(storage, coord_b)}
        coord_b.start_reconcile()
        assert coord_b.wait_reconciled(BOUND)
        assert data_files(storage) == set(files_b), "orphans left, or a referenced file gone"
        assert zd.restored_totals(storage, ha_b, tmp_path / "verify") == zd.reference(8)
    finally:
        for task in [*tasks_a, *tasks_b]:
            task.close()
        for coord in (coord_a, coord_b):
            if coord is not None:
                coord.close(drain_timeout=5)
        for store in (ha_a, ha_b, observer):
            if store is not None:
                store.close()

