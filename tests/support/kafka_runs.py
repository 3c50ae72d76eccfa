"""The running-totals example reading a Kafka topic (``--kafka``): topics and records,
its command line with the spark-sql-kafka (and hadoop-aws) jars, and the exact check of
a run: output and state equal a plain-Python run over the records read back from the
broker, cut where Spark's offset log cuts, each record counted once."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from pathlib import Path

from statehold.cleanup.reconcile import plan
from statehold.examples.totals import LAST_N
from statehold.format import layout
from statehold.job.directory import open_job
from statehold.storage import Storage
from statehold.tools import locate, verify
from tests.support.example_runs import example_cmd, example_env, final_state, read_output
from tests.support.infra import jvm
from tests.support.kafka import KafkaBroker, Record

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


def jars_appended(args: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """`args` without their ``--jars``, and `env` with those jars appended to the class
    path (`jvm.appended_classpath`) of the driver and of its executors (through
    ``spark.executorEnv``, which a worker, standalone or a ``local-cluster``'s, builds its
    executors' class path with), so all of them map Spark's archived classes. The flag
    itself stays tested where a test runs the example as a user would
    (tests/examples/test_example_errors.py, the Kafka pipeline's idle run)."""
    at = args.index("--jars")
    appended = jvm.appended_classpath(args[at + 1].split(","))
    executors = " ".join(f"-Dspark.executorEnv.{k}={v}" for k, v in appended.items())
    ours = env.get("SPARK_SUBMIT_OPTS", os.environ.get("SPARK_SUBMIT_OPTS", ""))
    opts = f"{ours} {executors}".strip()
    return args[:at] + args[at + 2:], {**env, **appended, "SPARK_SUBMIT_OPTS": opts}


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
    assert final_state(job, tmp / "reader", MAX_PARALLELISM) == expected_state
    check_retained_intact(job)
