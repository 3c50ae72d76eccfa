"""Kafka → Structured Streaming → statehold → sink, for real: the running-totals example
with ``--kafka`` reads a topic of a real broker (tests/kafka.py) through spark-sql-kafka
(jars from tests/infra/jvm.py), with Spark's checkpoint in ``<job>/_spark/``.

The reference is computed from the records read back from the broker (partition, offset)
and from Spark's own offset log (which offsets each batch read): every batch's output and
the final state must equal a plain-Python run over exactly those records, each record
counted once, also after kill -9 of the driver (S3 job directory, ZooKeeper HA).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path

import pytest

from statehold.backend.rocks import TaskStateBackend, sources_from_metadata
from statehold.cleanup.reconcile import plan
from statehold.examples.running_totals import LAST_N
from statehold.format import layout
from statehold.format.metadata import KeyGroupRange, read_metadata
from statehold.job.directory import open_job
from statehold.storage import Storage, open_storage
from statehold.tools import locate, verify
from tests.support.example_runs import example_cmd, example_env, read_output, run_and_kill
from tests.support.infra import jvm
from tests.support.kafka import KafkaBroker, Record, kafka_broker  # noqa: F401
from tests.support.zk import ZooKeeperServer, zk_server  # noqa: F401

pytestmark = [pytest.mark.spark]

JOB = "running-totals"
MAX_PARALLELISM = 16
PER_BATCH = 40
Totals = dict[str, tuple[int, int]]


def records(seed: int, n: int, keys: int = 12) -> list[tuple[str, str]]:
    """(Kafka key, JSON value) pairs; the Kafka key is the totals key (one partition each)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key = f"user-{rng.randrange(keys):02d}"
        out.append((key, json.dumps({"key": key, "value": rng.randrange(-20, 100)})))
    return out


def new_topic(broker: KafkaBroker, name: str, partitions: int = 2) -> str:
    topic = f"{name}-{os.getpid()}-{random.getrandbits(24)}"
    broker.create_topic(topic, partitions)
    return topic


def jar_args(*sets: jvm.ArtifactSet) -> list[str]:
    jars = [str(j) for s in sets for j in jvm.fetch(s)]
    return ["--jars", ",".join(jars)]


def example_args(
    broker: KafkaBroker, topic: str, output: Path, checkpoints: str, *extra: str
) -> list[str]:
    """The example on `topic`; hadoop-aws on the class path only for ``s3://``."""
    jars = [jvm.spark_kafka()]
    if checkpoints.startswith(("s3://", "s3a://")):
        jars.append(jvm.hadoop_aws())
    return [
        "--kafka", broker.bootstrap, "--topic", topic, "--output", str(output),
        "--checkpoints", checkpoints, "--records-per-batch", str(PER_BATCH),
        "--max-parallelism", str(MAX_PARALLELISM), "--parallelism", "2", "--retain", "2",
        *jar_args(*jars), *extra,
    ]


def run_example_to_end(
    cwd: Path, args: list[str], env: Mapping[str, str] | None = None
) -> str:
    import subprocess

    done = subprocess.run(
        example_cmd(*args), cwd=cwd, env=example_env(cwd, env), capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def batch_offsets(job: Storage) -> list[dict[int, int]]:
    """Spark's offset log (``_spark/offsets/N``): the end offset per partition of every
    batch, in batch order."""
    ends: dict[int, dict[int, int]] = {}
    for info in job.list(f"{layout.SPARK_DIR}/offsets/"):
        name = info.key.rsplit("/", 1)[-1]
        if not name.isdigit():
            continue
        lines = job.read(info.key).decode().splitlines()
        (topic_offsets,) = json.loads(lines[2]).values()
        ends[int(name)] = {int(p): int(o) for p, o in topic_offsets.items()}
    assert sorted(ends) == list(range(len(ends))), sorted(ends)
    return [ends[n] for n in range(len(ends))]


def reference(
    got: list[Record], offsets: list[dict[int, int]]
) -> tuple[list[Totals], dict[str, dict[str, object]]]:
    """Per batch, the (count, sum) of the keys it touched, and the final state (count,
    sum, last values), from the broker's records cut where Spark's offset log cuts."""
    state: dict[str, dict[str, object]] = {}
    batches: list[Totals] = []
    start: dict[int, int] = {}
    for ends in offsets:
        touched: Totals = {}
        chosen = [r for r in got if start.get(r.partition, 0) <= r.offset < ends.get(
            r.partition, 0)]
        for r in sorted(chosen, key=lambda r: (r.partition, r.offset)):
            row = json.loads(r.value)
            s = state.setdefault(row["key"], {"count": 0, "sum": 0, "last": []})
            s["count"] = int(str(s["count"])) + 1
            s["sum"] = int(str(s["sum"])) + row["value"]
            s["last"] = [*list(s["last"]), row["value"]][-LAST_N:]  # type: ignore[call-overload]
            touched[row["key"]] = (int(str(s["count"])), int(str(s["sum"])))
        batches.append(touched)
        start = ends
    return batches, state


def latest_id(job: Storage) -> int | None:
    """The newest retained checkpoint, from whichever HA store the job records."""
    with open_job(job) as opened:
        latest = opened.ha.read().latest
    return None if latest is None else latest.checkpoint_id


def check_retained_intact(job: Storage, *, orphans_allowed: bool = False) -> None:
    """Every file a retained checkpoint references is there, with its size and checksum;
    and (unless right after a kill, before the next attempt reconciled) no orphan."""
    with open_job(job) as opened:
        retained = opened.ha.read().retained
        assert retained
        for ptr in retained:
            report = verify(locate(job, ptr.metadata))
            assert report.ok, (ptr.metadata, report.problems)
            assert report.files_checked > 0
        leftovers = plan(opened, None)
    if not orphans_allowed:
        assert leftovers.orphans == [], [f.key for f in leftovers.orphans]


def final_state(job: Storage, scratch: Path) -> dict[str, dict[str, object]]:
    """The keyed state of the newest retained checkpoint, read with the state backend."""
    with open_job(job) as opened:
        latest = opened.ha.read().latest
    assert latest is not None
    meta = read_metadata(job, latest.metadata)
    sources = sources_from_metadata(job, latest.metadata, meta, "state")
    everything = KeyGroupRange(start=0, end=MAX_PARALLELISM - 1)
    with TaskStateBackend.open(scratch, "state", everything, MAX_PARALLELISM, sources) as b:
        return {str(k): v for k, v in b.items()}


def check_exact(
    broker: KafkaBroker, topic: str, produced: int, job: Storage, output: Path, tmp: Path
) -> None:
    """Output and state equal the reference over every produced record, each once."""
    got = broker.consume(topic, produced)
    offsets = batch_offsets(job)
    assert sum(offsets[-1].values()) == produced  # Spark read every record
    assert latest_id(job) == len(offsets) - 1  # checkpoint N = Spark batch N
    expected_batches, expected_state = reference(got, offsets)
    assert read_output(output) == expected_batches
    assert final_state(job, tmp / "reader") == expected_state
    check_retained_intact(job)


@pytest.mark.crash
@pytest.mark.timeout(1800)  # three Spark drivers; minutes on a busy shared machine
def test_kill_driver_kafka_s3_zookeeper(
    kafka_broker: KafkaBroker,  # noqa: F811
    zk_server: ZooKeeperServer,  # noqa: F811
    s3_server: object,
    tmp_path: Path,
) -> None:
    """The job directory (Spark's offsets included, through s3a) on S3 (moto), its HA
    store in ZooKeeper; kill -9 of the driver after a batch's output was written but not
    checkpointed (Spark replays it: restored from the previous checkpoint, output
    replaced; here the first batch, restored from nothing), and after a checkpoint
    completed but before Spark committed the batch (Spark replays it: skipped). Then more
    records and a run to the end."""
    from tests.support.s3 import S3Server

    assert isinstance(s3_server, S3Server)
    topic = new_topic(kafka_broker, "crash")
    uri = f"s3://{s3_server.bucket}/kafka-crash-{os.getpid()}-{random.getrandbits(24)}"
    ha = f"zookeeper://{zk_server.hosts}/statehold-kafka-{random.getrandbits(24)}"
    output = tmp_path / "output"
    args = example_args(kafka_broker, topic, output, uri, "--ha", ha)
    job = open_storage(f"{uri}/{JOB}", **s3_server.options)
    kafka_broker.produce(topic, records(3, 2 * PER_BATCH))
    for pause_at, expected_latest in (("after-sink:0", None), ("after-complete:1", 1)):
        run_and_kill(tmp_path, args, pause_at, s3_server.env)
        assert latest_id(job) == expected_latest, pause_at
        if expected_latest is not None:
            check_retained_intact(job, orphans_allowed=True)
    assert job.exists(f"{layout.SPARK_DIR}/offsets/1")  # Spark's offsets went to S3
    assert not job.exists(f"{layout.SPARK_DIR}/commits/1")  # ... and 1 is not committed
    kafka_broker.produce(topic, records(4, 30))
    stdout = run_example_to_end(tmp_path, args, s3_server.env)
    assert "batch 1: already checkpointed" in stdout  # the replay after the second kill
    assert "checkpoint 2," in stdout
    check_exact(kafka_broker, topic, 2 * PER_BATCH + 30, job, output, tmp_path)


def _newest_pyspark() -> bool:
    import pyspark

    return int(pyspark.__version__.split(".")[0]) >= 4


@pytest.mark.skipif(_newest_pyspark(), reason="PySpark 3.5 only (.ci/spark-oldest): on 4.x "
                    "the Kafka tests above and test_s3a_relocate run the same path")
@pytest.mark.timeout(900)
def test_kafka_to_end_exact_local(
    kafka_broker: KafkaBroker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The Kafka pipeline on the oldest PySpark (.ci/spark-oldest), as cheaply as it goes:
    one driver reads the topic to its end in two batches, job directory on local disk
    (embedded HA, spark-sql-kafka of the 3.5 line the only jars, Scala 2.12); output and
    state exact against the records read back from the broker, storage listed after."""
    topic = new_topic(kafka_broker, "plain")
    produced = PER_BATCH + PER_BATCH // 2
    kafka_broker.produce(topic, records(7, produced))
    output = tmp_path / "output"
    checkpoints = tmp_path / "checkpoints"
    stdout = run_example_to_end(
        tmp_path, example_args(kafka_broker, topic, output, str(checkpoints))
    )
    assert "checkpoint 1," in stdout
    job = open_storage(str(checkpoints / JOB))
    assert job.exists(f"{layout.SPARK_DIR}/commits/1")  # Spark committed both batches
    check_exact(kafka_broker, topic, produced, job, output, tmp_path)
