"""Runs of the Structured Streaming driver of the processor tests
(tests/support/processor_stream.py) in a subprocess: killed with kill -9 where it pauses,
run to the end, and the whole scenario checked against the sessions reference."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from statehold.storage import Storage
from tests.support.example_runs import check_retained_intact, example_env, group_alive, latest_id
from tests.support.paths import SUPPORT
from tests.support.pause_hooks import PAUSE_ENV, PAUSE_MARK_ENV
from tests.support.sessions_reference import DELAY, GAP, check_end, generate

DRIVER = SUPPORT / "processor_stream.py"
START_TIMEOUT = 600.0


def _cmd(args: list[str]) -> list[str]:
    return [sys.executable, str(DRIVER), *args, "--gap-seconds", str(GAP),
            "--watermark-delay-seconds", str(DELAY)]


def kill_at(cwd: Path, args: list[str], pause_at: str, env: Mapping[str, str] | None) -> None:
    """Run the streaming driver until it pauses at `pause_at`, then kill -9 it and wait
    for its JVM and Python workers to go."""
    mark = cwd / f"pause-{pause_at.replace(':', '-')}"
    log = cwd / f"log-{pause_at.replace(':', '-')}.txt"
    extra = {**dict(env or {}), PAUSE_ENV: pause_at, PAUSE_MARK_ENV: str(mark)}
    with open(log, "w") as out:
        proc = subprocess.Popen(_cmd(args), cwd=cwd, env=example_env(cwd, extra), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not mark.exists():
                if proc.poll() is not None:
                    pytest.fail(f"the driver exited ({proc.returncode}) before {pause_at}:\n"
                                f"{log.read_text()[-4000:]}")
                assert time.monotonic() < deadline, f"never paused at {pause_at}"
                time.sleep(0.1)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait() == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            grace = time.monotonic() + 60
            while group_alive(proc.pid) and time.monotonic() < grace:
                time.sleep(0.2)
            if group_alive(proc.pid):  # our own session only: the driver's children
                os.killpg(proc.pid, signal.SIGKILL)


def run_to_end(cwd: Path, args: list[str], env: Mapping[str, str] | None) -> str:
    done = subprocess.run(_cmd(args), cwd=cwd, env=example_env(cwd, env), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def scenario(tmp: Path, checkpoints: str, job: Storage, kills: list[tuple[str, int]],
             env: Mapping[str, str] | None = None, spark_checkpoint: Path | None = None,
             driver_args: Sequence[str] = ()) -> str:
    """The sessions processor over 4 input files, killed at each of `kills` (a pause point
    and the newest checkpoint id expected then), then run to the end and checked exactly
    against the plain-Python reference. The last run's stdout."""
    inp, out = tmp / "input", tmp / "output"
    generate(inp, files=4)
    for i, f in enumerate(sorted(inp.glob("*.jsonl"))):  # the file source's order
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))
    args = [str(inp), str(out), checkpoints, *driver_args]
    if spark_checkpoint is not None:
        args += ["--spark-checkpoint", str(spark_checkpoint)]
    for pause_at, expected_latest in kills:
        kill_at(tmp, args, pause_at, env)
        assert latest_id(job) == expected_latest, pause_at
        check_retained_intact(job)
    stdout = run_to_end(tmp, args, env)
    assert " 0 rows, " in stdout  # a batch without input fired timers
    check_end(job, out, inp, 1)
    return stdout
