"""The pipeline on a cluster of executors, one of them killed with kill -9 mid-batch.

The running-totals example (a real driver subprocess) reads a topic of a real Kafka broker
(tests/support/kafka.py) with Structured Streaming on a standalone master with two
workers started from PySpark's own ``sbin/spark-daemon.sh`` (tests/support/cluster.py; the session's
`standalone` fixture), whose executors get nothing of the driver's environment but what
``spark.executorEnv`` carries. (The same on ``local-cluster[2,1,1024]`` is part of the
chaos runs, tests/spark/test_chaos.py, and an executor killed inside a stateful task there
is a phase of tests/spark/test_executor_loss.py.) Its job directory is on
S3 (moto server), Spark's checkpoint in ``<job>/_spark/`` through s3a, its HA pointers in
a real ZooKeeper. The spark-sql-kafka and hadoop-aws jars come from the Maven cache
(tests/support/infra/jvm.py) onto the driver's and the executors' class path (``--jars``,
as ``spark.*.extraClassPath``); nothing is downloaded by Spark. In batch 1 one task pauses
while updating state (tests/support/pause_hooks.py); the test finds the executor JVM
running it (``CoarseGrainedExecutorBackend``, an ancestor of the paused Python worker) and
kills it with SIGKILL. Spark runs the task again elsewhere; the run must end normally with
every batch's output and the final state equal to a plain-Python computation over the
records read back from the broker, cut where Spark's offset log cuts (the Kafka pipeline's
checks, tests/support/kafka_runs.py), every retained checkpoint intact and no orphan in
the job directory.

Executors keep their local snapshots in their own scratch directories (no
``STATEHOLD_LOCAL_DIR``), as on separate machines; the per-batch restore downloads are
printed from the checkpoint history.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from statehold.format import layout
from statehold.job.history import read_history
from statehold.storage import open_storage
from tests.support.cluster import StandaloneCluster, alive, executor_of
from tests.support.infra import jvm
from tests.support.infra.object_store_servers import S3Server
from tests.support.kafka import KafkaBroker
from tests.support.kafka_runs import (
    PER_BATCH,
    check_exact,
    jar_args,
    jars_appended,
    new_topic,
    records,
)
from tests.support.paths import ROOT, SRC, SUPPORT
from tests.support.pause_hooks import PAUSE_MARK_ENV, PAUSE_ONCE_ENV
from tests.support.zk import ZooKeeperServer

# Three batches with Spark starts take minutes on a loaded 2-core machine (10 at load 30).
pytestmark = [pytest.mark.spark, pytest.mark.zookeeper, pytest.mark.crash,
              pytest.mark.timeout(1800)]

MAX_PARALLELISM = 16
# Read in batches of at most PER_BATCH (Spark rounds each partition's share down): 0, 1, 2.
RECORDS = 2 * PER_BATCH + PER_BATCH // 2
KILL_BATCH = 1
TIMEOUT = 1500.0


def driver_env(tmp: Path, s3: S3Server, mark: Path) -> dict[str, str]:
    """The driver's environment; what the executors need goes to them as
    ``spark.executorEnv`` (a standalone worker's executors do not inherit the driver's)."""
    path = os.pathsep.join([str(SRC), str(ROOT)])
    executor_env = {"PYTHONPATH": path, PAUSE_ONCE_ENV: str(KILL_BATCH), PAUSE_MARK_ENV: str(mark),
                    **s3.env}
    conf = " ".join(f"--conf spark.executorEnv.{k}={v}" for k, v in executor_env.items())
    env = {k: v for k, v in os.environ.items() if k != "STATEHOLD_LOCAL_DIR"}
    return {**env, **s3.env, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": f"{conf} --conf spark.task.maxFailures=4 pyspark-shell"}


def kill_paused_executor(proc: subprocess.Popen[bytes], mark: Path, log: Path) -> None:
    """Wait until a task paused, kill -9 its executor JVM, and see its worker gone."""
    deadline = time.monotonic() + TIMEOUT
    while not mark.exists():
        if proc.poll() is not None:
            pytest.fail(f"driver exited ({proc.returncode}) before the pause:\n"
                        f"{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail("no task paused")
        time.sleep(0.2)
    worker = int(mark.read_text().split()[0])
    executor = executor_of(worker)
    os.kill(executor, signal.SIGKILL)
    grace = time.monotonic() + 60
    while (alive(executor) or alive(worker)) and time.monotonic() < grace:
        time.sleep(0.2)
    if alive(worker):  # the paused task's own process, orphaned by the kill
        os.kill(worker, signal.SIGKILL)
    assert not alive(executor)


def run_killing_executor(cwd: Path, args: list[str], env: dict[str, str], mark: Path,
                         log: Path) -> str:
    """The example (paused once in batch ``KILL_BATCH``) to its normal end, with the
    paused task's executor killed -9 meanwhile; the driver's output."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, str(SUPPORT / "pause_hooks.py"), *args],
                                cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            kill_paused_executor(proc, mark, log)
            assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log.read_text()


def test_kill_executor_mid_batch_exact_kafka(
    standalone: StandaloneCluster,
    tmp_path: Path,
    s3_server: S3Server,
    zk_server: ZooKeeperServer,
    kafka_broker: KafkaBroker,
) -> None:
    master = standalone.url
    job_id = f"standalone-{uuid.uuid4().hex[:8]}"
    root = f"s3://{s3_server.bucket}/executors-{os.getpid()}"
    topic = new_topic(kafka_broker, "executors")
    produced = records(5, RECORDS)
    kafka_broker.produce(topic, produced)
    out, mark, log = (tmp_path / n for n in ("output", "paused", "driver.log"))
    args = ["--kafka", kafka_broker.bootstrap, "--topic", topic,
            "--records-per-batch", str(PER_BATCH), "--output", str(out),
            "--checkpoints", root, "--job-id", job_id,
            "--ha", f"zookeeper://{zk_server.hosts}/statehold", "--retain", "2",
            "--master", master, "--max-parallelism", str(MAX_PARALLELISM),
            "--parallelism", "2", *jar_args(jvm.spark_kafka(), jvm.hadoop_aws())]
    args, env = jars_appended(args, driver_env(tmp_path, s3_server, mark))
    printed = run_killing_executor(tmp_path, args, env, mark, log)
    job = open_storage(f"{root}/{job_id}", **s3_server.options)
    assert job.exists(f"{layout.SPARK_DIR}/offsets/{KILL_BATCH}")  # Spark's offsets on S3
    # Every produced record counted once, in the batches of Spark's offset log (output and
    # final state against the records read back from the broker); then storage listed:
    # every retained checkpoint's files there and whole, no orphan.
    check_exact(kafka_broker, topic, len(produced), job, out, tmp_path)
    history = sorted(read_history(job), key=lambda r: r.checkpoint_id)
    assert f"checkpoint {history[-1].checkpoint_id}," in printed
    print("standalone", [(r.checkpoint_id, r.outcome, r.bytes_downloaded, r.state_size)
                 for r in history])
