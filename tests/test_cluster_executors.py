"""The pipeline on a cluster of executors, one of them killed with kill -9 mid-batch.

The running-totals example (a real driver subprocess) runs on ``local-cluster[2,1,1024]``
(two executor JVMs beside the driver) and on a standalone master with two workers started
from PySpark's own ``sbin/spark-daemon.sh`` (tests/cluster.py), with its job directory on
S3 (moto server) and its HA pointers in a real ZooKeeper. In batch 1 one task pauses while
updating state (tests/pause_once.py); the test finds the executor JVM running it
(``CoarseGrainedExecutorBackend``, an ancestor of the paused Python worker) and kills it
with SIGKILL. Spark runs the task again elsewhere; the run must end normally with every
batch's output and the final state equal to a plain-Python computation, every retained
checkpoint intact and no orphan in the job directory.

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
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import StandaloneCluster, alive, executor_of, standalone_cluster
from conftest import S3Server
from pause_once import MARK_ENV, PAUSE_ENV
from test_example import read_output, reference, reference_state

from statehold.backend.rocks import TaskStateBackend, sources_from_metadata
from statehold.examples.running_totals import generate_demo
from statehold.ha.zookeeper import ZooKeeperHAStore
from statehold.history import read_history
from statehold.jobdir import open_job
from statehold.metadata import KeyGroupRange, read_metadata
from statehold.reconcile import plan
from statehold.storage import Storage, open_storage
from statehold.tools import verify
from tests.zk import ZooKeeperServer, zk_server  # noqa: F401

# Three batches with Spark starts take minutes on a loaded 2-core machine (10 at load 30).
pytestmark = [pytest.mark.spark, pytest.mark.zookeeper, pytest.mark.crash,
              pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
MAX_PARALLELISM = 16
FILES = 3
KILL_BATCH = 1
TIMEOUT = 1500.0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster


def driver_env(tmp: Path, s3: S3Server, mark: Path) -> dict[str, str]:
    """The driver's environment; what the executors need goes to them as
    ``spark.executorEnv`` (a standalone worker's executors do not inherit the driver's)."""
    path = os.pathsep.join([str(SRC), str(HERE)])
    executor_env = {"PYTHONPATH": path, PAUSE_ENV: str(KILL_BATCH), MARK_ENV: str(mark),
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


def final_state(job: Storage, metadata_key: str, scratch: Path) -> dict[str, dict[str, object]]:
    meta = read_metadata(job, metadata_key)
    sources = sources_from_metadata(job, metadata_key, meta, "state")
    everything = KeyGroupRange(start=0, end=MAX_PARALLELISM - 1)
    with TaskStateBackend.open(scratch, "state", everything, MAX_PARALLELISM, sources) as b:
        return {str(k): v for k, v in b.items()}


@pytest.mark.parametrize("kind", ["local-cluster", "standalone"])
def test_kill_executor_mid_batch_exact(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    s3_server: S3Server,
    zk_server: ZooKeeperServer,  # noqa: F811
) -> None:
    master = ("local-cluster[2,1,1024]" if kind == "local-cluster"
              else request.getfixturevalue("standalone").url)
    job_id = f"{kind}-{uuid.uuid4().hex[:8]}"
    root = f"s3://{s3_server.bucket}/executors-{os.getpid()}"
    ha_uri = f"zookeeper://{zk_server.hosts}/statehold"
    inp, out, mark, log = (tmp_path / n for n in ("input", "output", "paused", "driver.log"))
    generate_demo(inp, files=FILES, rows=80, keys=30)
    args = ["--input", str(inp), "--output", str(out), "--checkpoints", root,
            "--job-id", job_id, "--ha", ha_uri, "--retain", "2", "--master", master,
            "--max-parallelism", str(MAX_PARALLELISM), "--parallelism", "2"]
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, str(HERE / "pause_once.py"), *args],
                                cwd=tmp_path, env=driver_env(tmp_path, s3_server, mark),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            kill_paused_executor(proc, mark, log)
            assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert f"checkpoint {FILES - 1}," in log.read_text()

    job = open_storage(f"{root}/{job_id}", **s3_server.options)
    ha = ZooKeeperHAStore.from_uri(ha_uri, job_id)
    try:
        state = ha.read()
        assert state.latest is not None and state.latest.checkpoint_id == FILES - 1
        assert read_output(out) == reference(inp)  # every batch once, the retry's only
        assert final_state(job, state.latest.metadata, tmp_path / "reader") == (
            reference_state(inp))
        for pointer in state.retained:
            report = verify(f"{root}/{job_id}/chk-{pointer.checkpoint_id}", ha=ha,
                            **s3_server.options)
            assert report.ok and report.files_checked > 0, report.problems
        leftovers = plan(open_job(job, ha), None)
        assert leftovers.orphans == [], [f.key for f in leftovers.orphans]
        history = sorted(read_history(job), key=lambda r: r.checkpoint_id)
        print(kind, [(r.checkpoint_id, r.outcome, r.bytes_downloaded, r.state_size)
                     for r in history])
    finally:
        ha.close()
