"""A real Kafka broker for tests: one KRaft node (broker and controller) on 127.0.0.1.

A test asks for the `kafka_broker` fixture by name (registered once in tests/conftest.py).
It is session-scoped, one broker for the whole run: Apache Kafka's own jars from Maven Central
(`tests.support.infra.jvm`, cached), ``kafka.tools.StorageTool format`` on a fresh log
directory, then ``kafka.Kafka`` with a generated ``server.properties`` on two free ports
(clients, controller). It is ready when the broker logs that it started and answers a topic listing.

Topics are created, and records produced and read back, with Kafka's own command-line
tools (``TopicCommand``, ``ConsoleProducer``, ``ConsoleConsumer``) from the same jars: no
Python Kafka client is needed, and a producer that is a separate process is what a real
pipeline sees. Each tool call costs one JVM start (about a second or two).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.infra import jvm
from tests.support.infra.server import ServerProcess, free_port

#: Bound on a start (format + boot) and on each tool call.
START_TIMEOUT = 120.0
TOOL_TIMEOUT = 120.0
KEY_SEPARATOR = "\t"
JVM_OPTS = ["-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


@dataclass(frozen=True)
class Record:
    """One record as read back from the broker."""

    partition: int
    offset: int
    key: str
    value: str


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding.

    Never one that starts with "-": Kafka's tools would read it as an option (one in 64
    random ids does; Kafka's own ``Uuid.randomUuid`` skips those for the same reason).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker(ServerProcess):
    """One single-node KRaft Kafka process the test session owns."""

    host = "127.0.0.1"

    def __init__(self, java: str, jars: Sequence[Path], workdir: Path) -> None:
        # The broker's own log (log4j) is kafka.log; what the JVM prints, kafka.out.
        super().__init__("Kafka", workdir, workdir / "kafka.out")
        self.java = java
        self.classpath = jvm.classpath(jars)
        self.log_dir = workdir / "kraft-logs"
        self.config = workdir / "server.properties"
        self.broker_log = workdir / "kafka.log"
        self.port, self.controller_port = free_port(), free_port()
        self._write_config()

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    def _write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
                    f"listeners=PLAINTEXT://{self.host}:{self.port},"
                    f"CONTROLLER://{self.host}:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.log_dir}",
                    "auto.create.topics.enable=false",
                    # One node: every internal topic with one replica, no rebalance delay.
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    # Test data: no fsync pressure, small segments.
                    "log.segment.bytes=16777216",
                    "",
                ]
            )
        )
        for name, level, target in (("broker", "INFO", self.broker_log), ("tools", "WARN", None)):
            appender = (
                f"appender.out.type=File\nappender.out.fileName={target}\n"
                if target is not None
                else "appender.out.type=Console\nappender.out.target=SYSTEM_ERR\n"
            )
            (self.workdir / f"log4j2-{name}.properties").write_text(
                f"{appender}appender.out.name=out\nappender.out.layout.type=PatternLayout\n"
                "appender.out.layout.pattern=[%d] %p %m (%c)%n\n"
                f"rootLogger.level={level}\nrootLogger.appenderRef.out.ref=out\n"
            )

    def _java(self, log_config: str, main_class: str, *args: str) -> list[str]:
        config = self.workdir / f"log4j2-{log_config}.properties"
        return [self.java, *JVM_OPTS, f"-Dlog4j2.configurationFile={config}",
                "-cp", self.classpath, main_class, *args]

    # -- the broker process ---------------------------------------------------------------
    def start(self) -> None:
        """Format the log directory (first start only), start the broker, wait until ready."""
        if self.running:
            return
        if not (self.log_dir / "meta.properties").exists():
            self.tool("kafka.tools.StorageTool", "format", "--cluster-id", _cluster_id(),
                      "--config", str(self.config), "--ignore-formatted")
        self.launch(
            self._java("broker", "kafka.Kafka", str(self.config)),
            lambda: "Kafka Server started" in self._broker_log_text(),
            timeout=START_TIMEOUT,
        )
        self.topics()  # the broker serves clients, not just its log

    def _broker_log_text(self) -> str:
        try:
            return self.broker_log.read_text(errors="replace")
        except OSError:
            return ""

    def log_text(self) -> str:
        return self._broker_log_text() + super().log_text()

    # -- Kafka's command-line tools ----------------------------------------------------------
    def tool(self, main_class: str, *args: str, stdin: str | None = None) -> str:
        """Run one of Kafka's tools from the cached jars; its stdout (fails on an error)."""
        done = subprocess.run(
            self._java("tools", main_class, *args), input=stdin, capture_output=True,
            text=True, timeout=TOOL_TIMEOUT, cwd=self.workdir,
        )
        if done.returncode != 0:
            pytest.fail(f"{main_class} {' '.join(args)} failed ({done.returncode}):\n"
                        f"{done.stderr[-3000:]}")
        return done.stdout

    def topics(self) -> list[str]:
        out = self.tool("org.apache.kafka.tools.TopicCommand",
                        "--bootstrap-server", self.bootstrap, "--list")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap,
                  "--create", "--topic", name, "--partitions", str(partitions),
                  "--replication-factor", "1")

    def produce(self, topic: str, records: Sequence[tuple[str, str]]) -> None:
        """Send (key, value) records in this order, acknowledged by the broker (acks=all,
        idempotent: the order per partition is the order here). Records of one key go to
        one partition (Kafka's default partitioner hashes the key)."""
        for key, value in records:
            if KEY_SEPARATOR in key or "\n" in key + value:
                raise ValueError(f"key/value with a tab or newline: {key!r} {value!r}")
        lines = "".join(f"{k}{KEY_SEPARATOR}{v}\n" for k, v in records)
        self.tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server",
                  self.bootstrap, "--topic", topic, "--property", "parse.key=true",
                  "--property", f"key.separator={KEY_SEPARATOR}",
                  "--producer-property", "acks=all", stdin=lines)

    def consume(self, topic: str, count: int) -> list[Record]:
        """The first `count` records of the topic with their partition and offset, read by
        Kafka's console consumer (fails if fewer arrive)."""
        out = self.tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
            self.bootstrap, "--topic", topic, "--from-beginning", "--max-messages",
            str(count), "--timeout-ms", "30000",
            "--property", "print.partition=true",
            "--property", "print.offset=true",
            "--property", "print.key=true",
            "--property", "print.value=true",
        )
        records = []
        for line in out.splitlines():
            partition, offset, key, value = line.split("\t", 3)
            records.append(Record(int(partition.removeprefix("Partition:")),
                                  int(offset.removeprefix("Offset:")), key, value))
        assert len(records) == count, f"{len(records)} of {count} records in {topic}"
        return records


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        pytest.fail("no `java` found to run Kafka (apt-get install default-jre-headless)")
    return java


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real single-node Kafka on 127.0.0.1; `.bootstrap` is its ``host:port``."""
    try:
        jars = jvm.fetch(jvm.kafka_broker())
    except jvm.ArtifactError as e:
        pytest.fail(f"Kafka's jars could not be fetched: {e}")
    broker = KafkaBroker(find_java(), jars, tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
