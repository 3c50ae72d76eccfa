"""A real ZooKeeper server for tests, from Apache ZooKeeper's jars on Maven Central
(fetched into a cache by tests/infra/provision.py and jvm.py).

Use it with `from tests.zk import zk_server` in a test module (or `pytest_plugins =
["tests.zk"]`). The fixture is session-scoped: one standalone server on 127.0.0.1 and a
free port, data in a temporary directory. `stop()` and `start()` restart it on the same
port and data directory, so tests can cut the connection and check that state survives.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
INSTALL_HINT = "apt-get install default-jre-headless"
#: Bound on how long a (re)start may take before the fixture gives up.
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ruok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a server answers the `ruok` four-letter word with `imok`."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"ruok")
            return sock.recv(8) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone ZooKeeper process the test session owns."""

    host = "127.0.0.1"

    def __init__(self, java: str, workdir: Path, classpath: str) -> None:
        self.java = java
        self.classpath = classpath
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "zoo.cfg"
        self.log = workdir / "zookeeper.log"
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
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

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start (or restart) on the same port and data directory; return once it answers."""
        if self.running:
            return
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.java,
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Dzookeeper.admin.enableServer=false",
                    "-cp",
                    self.classpath,
                    MAIN_CLASS,
                    str(self.config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not ruok(self.host, self.port):
            if self._process.poll() is not None:
                self._process = None
                pytest.fail(f"ZooKeeper exited at start-up:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(
                    f"ZooKeeper did not answer ruok within {START_TIMEOUT}s:\n{self._log_tail()}"
                )
            time.sleep(0.1)
        self._wait_for_session(deadline)

    def _wait_for_session(self, deadline: float) -> None:
        """`ruok` only says the process is up; a real session proves it serves clients."""
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.hosts)
        try:
            client.start(timeout=max(1.0, deadline - time.monotonic()))
            client.get("/")
        except Exception as exc:
            self.stop()
            pytest.fail(f"ZooKeeper answers ruok but no session started: {exc}\n{self._log_tail()}")
        finally:
            client.stop()
            client.close()

    def stop(self) -> None:
        """Stop the server process (data stays on disk for `start()`)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


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
    from tests.infra import provision

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
