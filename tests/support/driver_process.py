"""A driver process operated from outside by a test: started in a session of its own,
its stdout lines read as they come (`wait_batches`, `wait_line`), killed with SIGKILL
together with what it started (`kill`)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.example_runs import example_env, group_alive

#: Guards against a hang, never a measure: a driver starts in about 10 s.
START_TIMEOUT = 300.0


class Driver:
    """The driver process `cmd` (run in `tmp`, in an example's environment plus `env`),
    in a session of its own; its stdout lines gathered as they come, its stderr in
    `log`."""

    def __init__(
        self, tmp: Path, name: str, cmd: list[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.log = tmp / f"driver-{name}-{time.monotonic_ns()}.log"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=tmp, env=example_env(tmp, env), stdout=subprocess.PIPE, stderr=err,
                text=True, start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.strip())
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def batches(self) -> int:
        return sum(1 for line in self.lines if line.startswith("batch "))

    def wait_line(self, line: str, times: int = 1) -> None:
        """Until this driver has printed `line` `times` times (fails if it exits first)."""
        deadline = time.monotonic() + START_TIMEOUT
        with self._seen:
            while self.lines.count(line) < times:
                if self.proc.poll() is not None:
                    self._seen.wait(1)
                    if self.lines.count(line) < times:
                        pytest.fail(f"driver exited ({self.proc.returncode}):\n"
                                    f"{self.log.read_text()[-3000:]}")
                assert time.monotonic() < deadline, f"the driver never printed {line!r}"
                self._seen.wait(1)

    def wait_batches(self, n: int) -> None:
        """Until this driver has run `n` batches (fails if it exits first)."""
        deadline = time.monotonic() + START_TIMEOUT
        with self._seen:
            while self.batches() < n:
                if self.proc.poll() is not None and self.proc.stdout is not None:
                    self._seen.wait(1)
                    if self.batches() < n:
                        pytest.fail(f"driver exited ({self.proc.returncode}):\n"
                                    f"{self.log.read_text()[-3000:]}")
                assert time.monotonic() < deadline, "the driver ran no batch"
                self._seen.wait(1)

    def exited(self) -> int:
        code = self.proc.wait(timeout=START_TIMEOUT)
        self._reader.join(timeout=START_TIMEOUT)  # every line read
        return code

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait() == -signal.SIGKILL
        grace = time.monotonic() + 60
        while group_alive(self.proc.pid) and time.monotonic() < grace:
            time.sleep(0.2)
        if group_alive(self.proc.pid):  # our own session only: the driver's JVM
            os.killpg(self.proc.pid, signal.SIGKILL)
