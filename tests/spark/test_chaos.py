"""Chaos runs: the Kafka → statehold → sink pipeline on ``local-cluster[2,1,1024]`` while
S3 and ZooKeeper fail under it and its processes are killed -9.

The running-totals example (a real driver subprocess, two executor JVMs) reads a topic of
a real Kafka broker; its job directory is on S3 (moto) reached through an http-mode
fault proxy, by statehold's object-store client on the driver and the executors and by
Spark's s3a for ``_spark/`` (both take the proxy's endpoint from ``AWS_ENDPOINT_URL``);
its HA store is ZooKeeper through a tcp-mode fault proxy. A scheduler seeded with one
number (tests/support/chaos.py) injects, at random moments of each driver run: bursts of
503 and 500, connection resets, an upload cut (closed, reset or stalled), answers lost
after the request landed, slow links,
ZooKeeper connections reset, short ZooKeeper partitions and, once per seed, a partition
longer than ZooKeeper's session timeout; and kill -9 of an executor JVM and of the
driver (its whole process group). More records are produced before every run.

Each driver run ends in progress (a new checkpoint, or the topic read to its end) or in
an exit with one clear error line, within `HANG` seconds of its last progress, or the
test fails; it never hangs. Then every fault healed, one run to the end without faults,
and the exact checks: every batch's output and the final state equal a plain-Python
computation over the records read back from the broker, cut where Spark's offset log
cuts; every retained checkpoint's files there and whole, and no orphan, by listing.

``STATEHOLD_CHAOS_SEEDS=N`` runs N seeds, from ``STATEHOLD_CHAOS_SEED`` on (default
`CI_SEED`, so a CI run is the same plan each time; the longer runs of docs/benchmarks.md
draw others); ``STATEHOLD_CHAOS_RUNS`` sets the driver runs per seed (default 4).
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from pathlib import Path

import pytest

from statehold.storage import Storage, open_storage
from tests.support.chaos import HANG, Chaos, RunPlan, RunResult
from tests.support.fault_injection_proxy import FaultProxy
from tests.support.infra import jvm
from tests.support.infra.object_store_servers import S3Server
from tests.support.kafka import KafkaBroker
from tests.support.kafka_runs import (
    MAX_PARALLELISM,
    PER_BATCH,
    batch_offsets,
    check_exact,
    jar_args,
    jars_appended,
    latest_id,
    new_topic,
    records,
)
from tests.support.paths import ROOT, SRC

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.zookeeper,
              pytest.mark.timeout(3600)]  # per seed

MASTER = "local-cluster[2,1,1024]"
RUNS = int(os.environ.get("STATEHOLD_CHAOS_RUNS", "4"))
#: The suite's seed (like every seed: an executor kill and a partition past the session
#: timeout in its plan, faults drawn while it runs); it passed in docs/benchmarks.md's runs.
CI_SEED = 203
FIRST_SEED = int(os.environ.get("STATEHOLD_CHAOS_SEED") or CI_SEED)
SEEDS = [FIRST_SEED + i for i in range(int(os.environ.get("STATEHOLD_CHAOS_SEEDS", "1")))]
#: How the driver's one error line on the way out starts.
ONE_ERROR = "error: "




def driver_env(s3: S3Server, proxy: FaultProxy) -> dict[str, str]:
    """The driver's environment, S3 through the proxy for statehold and s3a alike; the
    executors get the same (``spark.executorEnv``)."""
    path = os.pathsep.join([str(SRC), str(ROOT)])
    s3_env = {**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}
    executor_env = {"PYTHONPATH": path, **s3_env}
    conf = " ".join(f"--conf spark.executorEnv.{k}={v}" for k, v in executor_env.items())
    env = {k: v for k, v in os.environ.items() if k != "STATEHOLD_LOCAL_DIR"}
    return {**env, **s3_env, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": f"{conf} --conf spark.task.maxFailures=8 pyspark-shell"}


def plans(rng: random.Random, runs: int) -> list[RunPlan]:
    """Per driver run: whether and when the driver and an executor are killed; the long
    ZooKeeper partition in one run. The driver is killed in about half the runs. (Drawn
    before the runs: the scheduler's thread draws from the same generator during them.)"""
    long_in = rng.randrange(runs)
    executor_in = rng.randrange(runs)
    return [
        RunPlan(
            kill_driver_after=rng.uniform(5, 60) if rng.random() < 0.5 else None,
            kill_executor_after=rng.uniform(2, 40) if i == executor_in else None,
            long_partition=i == long_in,
            victim=rng.randrange(2),
        )
        for i in range(runs)
    ]


def check_run(seed: int, n: int, plan: RunPlan, run: RunResult, produced: int,
              job: Storage) -> str:
    """A run's outcome is one of the allowed ones; its one-line summary."""
    where = f"seed {seed}, run {n} ({plan.describe()}); events: {run.events}"
    tail = run.stdout[-2000:] + "\n--- stderr ---\n" + run.stderr[-4000:]
    assert not run.hung, (f"{where}: no progress (no batch, no file written or removed) and "
                          f"no exit within {HANG:g} s\n{tail}")
    if run.returncode is None:
        outcome = "killed -9"
    elif run.returncode == 0:
        # progress: the topic read to its end (what it held when the run started)
        offsets = batch_offsets(job)
        done = sum(offsets[-1].values()) if offsets else 0
        assert done == produced, f"{where}: exit 0 after {done} of {produced} records\n{tail}"
        assert latest_id(job) == len(offsets) - 1, f"{where}\n{tail}"
        outcome = "to the end"
    else:
        # the last line on stderr is the driver's one error line (Spark's log of a failed
        # query, at ERROR level with its stack traces, may come before it)
        lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert lines, f"{where}: exit {run.returncode} without an error line\n{tail}"
        assert lines[-1].startswith(ONE_ERROR), f"{where}: not one error line\n{tail}"
        mine = [ln for ln in lines if ln.startswith(ONE_ERROR)]
        assert mine == [lines[-1]], f"{where}: more than one error line\n{tail}"
        outcome = f"exit {run.returncode}: {lines[-1][:200]}"
    return (f"run {n}: {outcome}, {run.progressed} batch line(s), {run.seconds:.0f} s; "
            f"{plan.describe()}; {'; '.join(run.events)}")


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_run(
    seed: int,
    tmp_path: Path,
    s3_server: S3Server,
    s3_proxy: FaultProxy,
    zk_proxy: FaultProxy,
    kafka_broker: KafkaBroker,
) -> None:
    from tests.support.infra import provision

    provision.require("java")
    rng = random.Random(seed)
    started = time.monotonic()
    topic = new_topic(kafka_broker, f"chaos-{seed}")
    job_id = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
    root = f"s3://{s3_server.bucket}/chaos-{os.getpid()}"
    output = tmp_path / "output"
    args = ["--kafka", kafka_broker.bootstrap, "--topic", topic,
            "--records-per-batch", str(PER_BATCH), "--output", str(output),
            "--checkpoints", root, "--job-id", job_id,
            "--ha", f"zookeeper://{zk_proxy.hosts}/statehold-chaos",
            "--retain", "2", "--master", MASTER, "--max-parallelism", str(MAX_PARALLELISM),
            "--parallelism", "2", *jar_args(jvm.spark_kafka(), jvm.hadoop_aws())]
    args, env = jars_appended(args, driver_env(s3_server, s3_proxy))
    job = open_storage(f"{root}/{job_id}", **s3_server.options)  # the test's view: direct
    chaos = Chaos(rng, s3_proxy, zk_proxy)

    def watch() -> list[tuple[str, int]]:
        """The job directory's files (the lease, a heartbeat, aside): a change is progress."""
        return sorted((i.key, i.size) for i in job.list() if "/lease-" not in i.key)
    produced = 0
    report = [f"seed {seed}"]
    for n, plan in enumerate(plans(rng, RUNS)):
        more = records(seed * 100 + n, rng.randint(PER_BATCH // 2, 2 * PER_BATCH))
        kafka_broker.produce(topic, more)
        produced += len(more)
        run = chaos.run_driver(tmp_path, args, env, plan, f"run-{n}", watch)
        report.append(check_run(seed, n, plan, run, produced, job))
        print(report[-1], flush=True)
    s3_faults = sum(s3_proxy.counts[k] for k in (
        "status_503", "status_500", "reset", "cut_close", "cut_reset", "cut_stall",
        "lost_response"))
    report.append(f"S3 faults that hit a request: {s3_faults}; proxy counts: "
                  f"S3 {dict(s3_proxy.counts)}, ZooKeeper {dict(zk_proxy.counts)}")

    # Healed: the last records, and a run to the end without faults.
    more = records(seed * 100 + 99, PER_BATCH // 2)
    kafka_broker.produce(topic, more)
    produced += len(more)
    final = chaos.run_driver(tmp_path, args, env, RunPlan(None, None, False), "final", watch,
                             faults=False)
    where = f"seed {seed}: " + " | ".join(report)
    assert not final.hung, f"{where}\nthe run after healing hung: {final.events}"
    assert final.returncode == 0, (f"{where}\nthe run after healing: exit {final.returncode}\n"
                                   f"{final.stdout[-2000:]}\n{final.stderr[-4000:]}")
    try:
        check_exact(kafka_broker, topic, produced, job, output, tmp_path)
    except AssertionError as exc:
        raise AssertionError(f"{where}\nthe exact check: {exc}") from exc
    assert s3_faults > 0, f"{where}: no S3 fault ever hit a request"
    print(f"seed {seed}: passed in {time.monotonic() - started:.0f} s, {produced} records, "
          f"{len(batch_offsets(job))} batches\n  " + "\n  ".join(report), flush=True)
