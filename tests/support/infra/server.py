"""A server process the test session owns (ZooKeeper, Kafka, Azurite, fake-gcs-server):
started with its output in a log file, waited for until a probe says it serves, stopped
with SIGTERM and then SIGKILL. A start that fails says why with the log's tail."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """One process, its log, its start and its stop."""

    def __init__(self, name: str, workdir: Path, log: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def launch(
        self,
        argv: Sequence[str],
        ready: Callable[[], bool],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start `argv` (output appended to the log) and return once `ready()` is true;
        fail the test with the log's tail if it exits or `timeout` passes first."""
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.workdir, env=env,
            )
        deadline = time.monotonic() + timeout
        while not ready():
            if self._process.poll() is not None:
                self._process = None
                pytest.fail(f"{self.name} exited at start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{self.name} did not start within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 15 s); its files stay."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no log)"
