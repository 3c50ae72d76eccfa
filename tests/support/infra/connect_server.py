"""A Spark Connect server for the tests, from the installed PySpark's own jars.

PySpark 4 ships ``spark-connect_<scala>-<version>.jar`` in its ``jars/`` folder, so
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (what
``sbin/start-connect-server.sh`` runs) starts one with nothing fetched. It runs as a child
process in a process group of its own on 127.0.0.1 and a free port: that group is the
JVM and its Python workers (foreachBatch's among them), so `kill` is a driver's kill -9.
The server's Python workers run this interpreter (``PYSPARK_PYTHON``) and import this
tree's statehold and tests (``PYTHONPATH``: functions of test modules are pickled by
reference).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.infra.server import free_port
from tests.support.paths import ROOT, SRC, module_dirs, python_path

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0


def connect_jar() -> Path | None:
    """The Spark Connect server jar PySpark ships (None: this PySpark has none, e.g. 3.5)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-connect_*.jar"))
    return jars[0] if jars else None


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class ConnectServer:
    """One Spark Connect server at a time (`start`, `kill`, `stop`); `url` is the newest's."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": python_path([SRC, ROOT, *module_dirs()]),
        }

    def start(self) -> None:
        """A new server on a new free port, returning once it accepts connections."""
        import pyspark

        self.starts += 1
        self.port = free_port()
        submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.python.worker.reuse": "true",
        }
        argv = [str(submit), "--class", SERVER_CLASS, "--master", "local[2]",
                "--name", "statehold-tests-connect"]
        for name, value in conf.items():
            argv += ["--conf", f"{name}={value}"]
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.workdir, env=self.env(), start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(self.port):
            if self._process.poll() is not None:
                self._process = None
                pytest.fail(f"the Spark Connect server exited at start-up:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the Spark Connect server did not start:\n{self.tail()}")
            time.sleep(0.2)

    def kill(self) -> None:
        """kill -9 the server's whole process group (the JVM and its Python workers)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM to the group, then kill -9 after 15 s."""
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
        self.kill()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
