"""A run of the example that fails ends with one ``error: ...`` line, the last on stderr,
not a traceback: here the Kafka pipeline whose ZooKeeper HA store cannot be reached. The
error is raised inside Structured Streaming's foreachBatch, where Spark wraps it in a
StreamingQueryException whose message carries a Python traceback, the query's plan and
JVM stack traces; the example reports the statehold error itself. (Spark's own log of
the failed query, at ERROR level, comes before it.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.example_runs import example_cmd, example_env
from tests.support.infra.server import free_port
from tests.support.kafka import KafkaBroker, kafka_broker  # noqa: F401
from tests.support.kafka_runs import PER_BATCH, example_args, new_topic, records

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_an_unreachable_ha_store_fails_the_kafka_run_in_one_line(
    kafka_broker: KafkaBroker,  # noqa: F811
    tmp_path: Path,
) -> None:
    topic = new_topic(kafka_broker, "errors")
    kafka_broker.produce(topic, records(3, PER_BATCH // 2))
    nobody = f"zookeeper://127.0.0.1:{free_port()}/statehold"  # nothing listens there
    args = example_args(kafka_broker, topic, tmp_path / "output",
                        str(tmp_path / "checkpoints"), "--ha", nobody)
    done = subprocess.run(example_cmd(*args), cwd=tmp_path, env=example_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: cannot connect to ZooKeeper at 127.0.0.1:"), lines[-3:]
    assert [ln for ln in lines if ln.startswith("error:")] == [lines[-1]], lines
