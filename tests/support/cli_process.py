"""The `statehold` command as its own process (``python -m statehold.cli``) with pipes
for stdout and stderr, in an environment that would make a careless CLI wrap, truncate
or colour its output; and `statehold ui` as a server process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import statehold

#: What would make a careless CLI wrap, truncate or colour a pipe.
HOSTILE_ENV = {
    "COLUMNS": "40",
    "LINES": "10",
    "TERMINAL_WIDTH": "40",
    "FORCE_COLOR": "1",
    "TTY_COMPATIBLE": "1",
    "TZ": "Asia/Kathmandu",
}
SRC = str(Path(statehold.__file__).resolve().parents[1])


@dataclass
class Run:
    code: int
    out: list[str]
    err: list[str]


def statehold_cli(*args: str, env: Mapping[str, str] | None = None) -> Run:
    """`args` run as ``python -m statehold.cli`` with pipes for stdout and stderr (and
    `env` added to the environment, say an S3 server's ``AWS_*``)."""
    env = {**os.environ, **dict(env or {}), **HOSTILE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "statehold.cli", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120,
    )
    for stream in (proc.stdout, proc.stderr):
        assert "\x1b" not in stream, stream  # no colour, no cursor movement
        assert "Traceback" not in stream, stream
    return Run(proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines())


@contextmanager
def statehold_ui(job_dir: str) -> Iterator[int]:
    """`statehold ui JOB --port 0` as its own process, serving until the block ends; yields
    the port it announced on its first line."""
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "statehold.cli", "ui", job_dir, "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until served (bounded by the test timeout)
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/$", line.strip())
        assert found, f"no announcement: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield int(found[1])
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server shuts down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
