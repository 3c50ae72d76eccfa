"""Kafka → Structured Streaming → statehold → sink, for real: the running-totals example
with ``--kafka`` reads a topic of a real broker (tests/support/kafka.py) through spark-sql-kafka
(jars from tests/support/infra/jvm.py), with Spark's checkpoint in ``<job>/_spark/``.

The reference is computed from the records read back from the broker (partition, offset)
and from Spark's own offset log (which offsets each batch read): every batch's output and
the final state must equal a plain-Python run over exactly those records, each record
counted once, also after kill -9 of the driver (S3 job directory, ZooKeeper HA).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from statehold.format import layout
from statehold.format import requests as fmt
from statehold.storage import open_storage
from statehold.tools import verify
from tests.support.cli_process import statehold_cli
from tests.support.driver_process import Driver
from tests.support.example_runs import example_cmd, run_and_kill
from tests.support.kafka import KafkaBroker
from tests.support.kafka_runs import (
    JOB,
    PER_BATCH,
    check_exact,
    check_retained_intact,
    example_args,
    jars_appended,
    latest_id,
    new_topic,
    records,
    run_example_to_end,
)
from tests.support.zk import ZooKeeperServer

pytestmark = [pytest.mark.spark]


@pytest.mark.crash
@pytest.mark.timeout(1800)  # three Spark drivers; minutes on a busy shared machine
def test_kill_driver_kafka_s3_zookeeper(
    kafka_broker: KafkaBroker,
    zk_server: ZooKeeperServer,
    s3_server: object,
    tmp_path: Path,
) -> None:
    """The job directory (Spark's offsets included, through s3a) on S3 (moto), its HA
    store in ZooKeeper; kill -9 of the driver after a batch's output was written but not
    checkpointed (Spark replays it: restored from the previous checkpoint, output
    replaced; here the first batch, restored from nothing), and after a checkpoint
    completed but before Spark committed the batch (Spark replays it: skipped). Then more
    records and a run to the end."""
    from tests.support.infra.object_store_servers import S3Server

    assert isinstance(s3_server, S3Server)
    topic = new_topic(kafka_broker, "crash")
    uri = f"s3://{s3_server.bucket}/kafka-crash-{os.getpid()}-{random.getrandbits(24)}"
    ha = f"zookeeper://{zk_server.hosts}/statehold-kafka-{random.getrandbits(24)}"
    output = tmp_path / "output"
    args, env = jars_appended(example_args(kafka_broker, topic, output, uri, "--ha", ha),
                              s3_server.env)
    job = open_storage(f"{uri}/{JOB}", **s3_server.options)
    kafka_broker.produce(topic, records(3, 2 * PER_BATCH))
    for pause_at, expected_latest in (("after-sink:0", None), ("after-complete:1", 1)):
        run_and_kill(tmp_path, args, pause_at, env)
        assert latest_id(job) == expected_latest, pause_at
        if expected_latest is not None:
            check_retained_intact(job, orphans_allowed=True)
    assert job.exists(f"{layout.SPARK_DIR}/offsets/1")  # Spark's offsets went to S3
    assert not job.exists(f"{layout.SPARK_DIR}/commits/1")  # ... and 1 is not committed
    kafka_broker.produce(topic, records(4, 30))
    stdout = run_example_to_end(tmp_path, args, env)
    assert "batch 1: already checkpointed" in stdout  # the replay after the second kill
    assert "checkpoint 2," in stdout
    check_exact(kafka_broker, topic, 2 * PER_BATCH + 30, job, output, tmp_path)


@pytest.mark.matrix  # each Spark's own spark-sql-kafka
@pytest.mark.timeout(900)
def test_kafka_exact_local_then_stopped_while_idle(
    kafka_broker: KafkaBroker,
    tmp_path: Path,
) -> None:
    """The Kafka pipeline without kills, as cheaply as it goes (the one Kafka test of the
    older PySparks, .ci/spark-matrix, where the kill tests above do not run): one driver
    (``--keep-running``) reads the topic in two batches, then, with nothing new to read,
    is asked for a savepoint and stopped from outside with another: it answers both
    within the wait and exits 0 with one line. Job directory on local disk (embedded HA,
    spark-sql-kafka of the running Spark the only jars); output and state exact against
    the records read back from the broker, storage listed after."""
    topic = new_topic(kafka_broker, "plain")
    produced = PER_BATCH + PER_BATCH // 2
    kafka_broker.produce(topic, records(7, produced))
    output = tmp_path / "output"
    checkpoints = tmp_path / "checkpoints"
    args = example_args(kafka_broker, topic, output, str(checkpoints), "--keep-running",
                        "--poll-seconds", "0.5")
    driver = Driver(tmp_path, "kafka", example_cmd(*args))
    driver.wait_batches(2)  # then an idle query
    saved = statehold_cli("savepoint", str(checkpoints / JOB), "idle", "--wait", "--timeout",
                          "10")
    assert saved.code == 0 and "savepoints/idle of checkpoint 1" in saved.out[0], saved.err
    stopped = statehold_cli("stop", str(checkpoints / JOB), "--savepoint", "final", "--wait",
                            "--timeout", "10")
    assert stopped.code == 0, stopped.err
    assert driver.exited() == 0, driver.log.read_text()[-3000:]
    assert driver.lines[-1] == (
        "stopped from outside after checkpoint 1; savepoint savepoints/final"
    ), driver.lines[-3:]
    job = open_storage(str(checkpoints / JOB))
    assert job.exists(f"{layout.SPARK_DIR}/commits/1")  # Spark committed both batches
    assert not job.exists(f"{layout.SPARK_DIR}/offsets/2")  # and began no third
    check_exact(kafka_broker, topic, produced, job, output, tmp_path)
    for name in ("idle", "final"):
        assert verify(str(checkpoints / JOB / "savepoints" / name)).ok
    assert list(job.list(f"{fmt.REQUESTS_DIR}/")) == []  # collected by --wait
