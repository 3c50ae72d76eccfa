"""A real ZooKeeper server for tests, from Apache ZooKeeper's jars on Maven Central
(fetched into a cache by tests/support/infra/provision.py and jvm.py).

A test asks for the `zk_server` fixture by name (registered once in tests/conftest.py). It
is session-scoped: one standalone server for the whole run, on 127.0.0.1 and a free port,
data in a temporary directory. `stop()` and `start()` restart it on the same port and
data directory, so tests can cut the connection and check that state survives.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.infra.server import ServerProcess, free_port

__all__ = ["ZooKeeperServer", "free_port", "ruok", "zk_server"]

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
INSTALL_HINT = "apt-get install default-jre-headless"
#: Bound on how long a (re)start may take before the fixture gives up.
START_TIMEOUT = 60.0


def ruok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a server answers the `ruok` four-letter word with `imok`."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"ruok")
            return sock.recv(8) == b"imok"
    except OSError:
        return False


class ZooKeeperServer(ServerProcess):
    """One standalone ZooKeeper process the test session owns."""

    host = "127.0.0.1"

    def __init__(self, java: str, workdir: Path, classpath: str) -> None:
        super().__init__("ZooKeeper", workdir, workdir / "zookeeper.log")
        self.java = java
        self.classpath = classpath
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "zoo.cfg"
        self.port = free_port()
        self.config.write_text(
            "\n".join(
                [
                    # Short ticks keep session timeouts (2..20 ticks) test-sized.
                    "tickTime=500",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr",
                    # Test data: skip fsync and the 64 MB log preallocation (slow on busy
                    # disks). A stopped process's writes still survive in the page cache.
                    "forceSync=no",
                    "preAllocSize=1024",
                    "",
                ]
            )
        )

    @property
    def hosts(self) -> str:
        """The `host:port` connect string."""
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        """Start (or restart) on the same port and data directory; return once it answers."""
        if self.running:
            return
        self.launch(
            [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", self.classpath, MAIN_CLASS,
             str(self.config)],
            lambda: ruok(self.host, self.port),
            timeout=START_TIMEOUT,
        )
        self._wait_for_session()

    def _wait_for_session(self) -> None:
        """`ruok` only says the process is up; a real session proves it serves clients."""
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.hosts)
        try:
            client.start(timeout=START_TIMEOUT)
            client.get("/")
        except Exception as exc:
            self.stop()
            pytest.fail(f"ZooKeeper answers ruok but no session started: {exc}\n{self.log_tail()}")
        finally:
            client.stop()
            client.close()


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        pytest.fail(f"no `java` found to run ZooKeeper; install it with `{INSTALL_HINT}`")
    return java


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper on 127.0.0.1; `.hosts` is its `host:port`."""
    from tests.support.infra import provision

    provision.require("zookeeper")
    try:
        classpath = provision.zookeeper_classpath()
    except Exception as e:  # jvm.ArtifactError: no mvn, or the registry did not serve it
        pytest.fail(f"ZooKeeper's jars could not be fetched: {e}")
    server = ZooKeeperServer(_find_java(), tmp_path_factory.mktemp("zookeeper"), classpath)
    server.start()
    try:
        yield server
    finally:
        server.stop()
