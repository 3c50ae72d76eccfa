"""A stateful processor straight from Structured Streaming (``job.foreach_batch(processor,
...)``, tests/support/processor_stream.py in a subprocess): a file source read one file
per micro-batch with ``trigger(availableNow=True)``, the sessions processor with
event-time timers, compared with the sessions example's plain-Python reference
(tests/support/sessions_reference.py). The driver is killed with kill -9 once, then
restarted to the end: locally after a checkpoint completed but before Spark committed its
batch (Spark replays the batch; its input must not count twice), on S3 while a batch's
output is written but its checkpoint is not (the retry replaces it). Every closed session
is written once, the open ones are in the state with one timer each, the retained
checkpoints are intact and no orphan is left. Local storage and S3 (moto)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from statehold.storage import Storage, open_storage
from tests.support.example_runs import check_retained_intact, example_env, group_alive, latest_id
from tests.support.paths import SUPPORT
from tests.support.pausing import PAUSE_ENV, PAUSE_MARK_ENV
from tests.support.sessions_reference import DELAY, GAP, check_end, generate

pytestmark = [pytest.mark.spark, pytest.mark.crash]

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
             env: Mapping[str, str] | None = None, spark_checkpoint: Path | None = None) -> None:
    inp, out = tmp / "input", tmp / "output"
    generate(inp, files=4)
    for i, f in enumerate(sorted(inp.glob("*.jsonl"))):  # the file source's order
        os.utime(f, (1_600_000_000 + i, 1_600_000_000 + i))
    args = [str(inp), str(out), checkpoints]
    if spark_checkpoint is not None:
        args += ["--spark-checkpoint", str(spark_checkpoint)]
    for pause_at, expected_latest in kills:
        kill_at(tmp, args, pause_at, env)
        assert latest_id(job) == expected_latest, pause_at
        check_retained_intact(job)
    stdout = run_to_end(tmp, args, env)
    assert " 0 rows, " in stdout  # a batch without input fired timers
    check_end(job, out, inp, 1)


@pytest.mark.timeout(1800)  # two Spark drivers; slow on a shared machine
def test_processor_stream_exact_after_kill(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    kills = [("after-complete:2", 2)]
    scenario(tmp_path, str(ckpt), open_storage(str(ckpt / "sessions")), kills)


@pytest.mark.timeout(1800)
def test_processor_stream_on_s3(tmp_path: Path, s3_server: Any) -> None:
    """The job directory on S3 (moto); Spark's own checkpoint stays local (no S3A)."""
    uri = f"s3://{s3_server.bucket}/stream-{os.getpid()}-{tmp_path.name}"
    job = open_storage(f"{uri}/sessions", **s3_server.options)
    scenario(tmp_path, uri, job, [("after-sink:1", 0)], s3_server.env,
             tmp_path / "spark-checkpoint")
