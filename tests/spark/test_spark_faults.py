"""A StatefulJob run_batch loop on an s3:// job directory with the ZooKeeper HA store, the
driver and the executors reaching moto and ZooKeeper through fault-injecting proxies.

Under each transient fault (bursts of 503 and 500, connection resets, an upload cut or
stalled part-way, slow links, ZooKeeper connections reset) the batch completes with exact
output. Under an S3 outage longer than the client's retries the batch fails within a bound
and nothing completes; once S3 is back the same batch runs again from the previous
checkpoint, exactly. After the job's end the storage is listed: the retained checkpoint
verifies whole and no orphan is left."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from statehold.cleanup.reconcile import plan
from statehold.ha import HAStoreError
from statehold.job.directory import open_job
from statehold.spark import BatchResult, StatefulJob
from statehold.storage import open_storage
from statehold.tools import locate, verify
from tests.support.fault_injection_proxy import FaultProxy
from tests.support.hang_detector import bounded
from tests.support.infra.object_store_servers import S3Server
from tests.support.keyed_totals import (
    MAXP,
    OUT,
    Reference,
    make_batches,
    outputs,
    stored_state,
    to_df,
    totals,
)

pytestmark = [pytest.mark.spark, pytest.mark.zookeeper]

#: Hang detector for one batch (far above the clients' retry schedules).
BOUND = 300.0




def test_a_stateful_job_on_s3_and_zookeeper_under_faults(
    spark: SparkSession,
    s3_server: S3Server, s3_proxy: FaultProxy, zk_proxy: FaultProxy, tmp_path: Path,
) -> None:
    root = f"s3://{s3_server.bucket}/spark-faults-{random.getrandbits(32)}"
    # A stalled request fails after 3 s and is retried (statehold's default: 15 min).
    options = {**s3_server.options, "endpoint": s3_proxy.endpoint, "timeout": "3s"}
    job = StatefulJob(
        spark, root, "faultjob", max_parallelism=MAXP, parallelism=2,
        storage_options=options, local_dir=str(tmp_path / "local"),
        ha=f"zookeeper://{zk_proxy.hosts}/statehold-spark-faults",
    )

    def slow() -> None:
        for proxy in (s3_proxy, zk_proxy):
            proxy.set_latency(0.01)
            proxy.set_bandwidth(4_000_000)

    faults: list[tuple[str, Callable[[], None], FaultProxy, str]] = [
        ("503 burst", lambda: s3_proxy.fail_requests(5, 503), s3_proxy, "status_503"),
        ("500 burst", lambda: s3_proxy.fail_requests(3, 500), s3_proxy, "status_500"),
        ("resets", lambda: s3_proxy.reset_requests(3), s3_proxy, "reset"),
        ("upload closed", lambda: s3_proxy.cut_upload(20, "close", 100), s3_proxy, "cut_close"),
        ("upload stalled", lambda: s3_proxy.cut_upload(20, "stall", 100), s3_proxy, "cut_stall"),
        ("slow links", slow, s3_proxy, "requests"),
        ("zookeeper reset", zk_proxy.reset_all, zk_proxy, "reset_all"),
    ]
    batches = list(make_batches(len(faults) + 2, seed=11))
    ref = Reference()
    try:
        for rows, (name, inject, proxy, seen) in zip(batches, faults, strict=False):
            inject()

            def batch(rows: list[tuple[str, int, int]] = rows) -> BatchResult:
                return job.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"])

            try:
                result = bounded(batch, BOUND, f"a batch under: {name}")
            except HAStoreError as exc:
                # A ZooKeeper connection reset while the publish is in flight: its
                # outcome is unknown, so the batch fails (one line) and runs again.
                assert name == "zookeeper reset" and "\n" not in str(exc), exc
                result = bounded(batch, BOUND, f"the batch again after: {name}")
            s3_proxy.heal()
            zk_proxy.heal()
            assert proxy.counts[seen] >= 1, f"{name}: the fault never happened"
            assert outputs(result) == ref.apply(rows), name
        done = job.latest_checkpoint_id()

        # An outage longer than the retries: the batch fails, nothing completes.
        outage = batches[len(faults)]
        s3_proxy.fail_requests(1_000_000, 503)
        with pytest.raises(Exception) as caught:  # noqa: PT011 (Spark wraps the cause)
            bounded(lambda: job.run_batch(to_df(spark, outage), totals, OUT, order_by=["seq"]),
                    BOUND, "a batch during an S3 outage")
        assert "503" in str(caught.value) or "SlowDown" in str(caught.value), caught.value
        s3_proxy.heal()
        assert job.latest_checkpoint_id() == done
        # S3 is back: the same batch again, from the previous checkpoint; then one more.
        for rows in batches[len(faults):]:
            result = job.run_batch(to_df(spark, rows), totals, OUT, order_by=["seq"])
            assert outputs(result) == ref.apply(rows)
        assert job.end() is True
    finally:
        job.close()

    storage = open_storage(root, **options).child("faultjob")
    assert stored_state(storage) == ref.state
    with open_job(storage) as opened:
        retained = opened.ha.read().retained
        assert len(retained) == 1  # the end keeps the newest
        for pointer in retained:
            report = verify(locate(storage, pointer.metadata))
            assert report.ok, (pointer.metadata, report.problems)
        leftovers = plan(opened, None)
    assert leftovers.orphan_count == 0, [f.key for f in leftovers.orphans]
