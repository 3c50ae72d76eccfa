"""The `statehold` command as its own process (``python -m statehold.cli``) with pipes
for stdout and stderr, in an environment that would make a careless CLI wrap, truncate
or colour its output."""

from __future__ import annotations

import os
import subprocess
import sys
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


def statehold_cli(*args: str) -> Run:
    """`args` run as ``python -m statehold.cli`` with pipes for stdout and stderr."""
    env = {**os.environ, **HOSTILE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "statehold.cli", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120,
    )
    for stream in (proc.stdout, proc.stderr):
        assert "\x1b" not in stream, stream  # no colour, no cursor movement
        assert "Traceback" not in stream, stream
    return Run(proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines())
