"""The sessions example (``python -m statehold.examples.sessions``) in subprocesses against
a plain-Python reference: run to the end; kill -9 of the driver at random moments, then a
restart (local storage and S3 on moto; on local storage the restart keeps running and is
stopped from outside once idle); a rescale 2 -> 3 -> 1 with sessions open (their
timers move with their key groups). After every kill the retained checkpoints are intact;
at the end every closed session was written exactly once, the open ones (and only they)
are in the state with one timer each, and the job directory holds no orphan."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage, open_storage
from tests.support.cli_process import statehold_cli
from tests.support.driver_process import Driver
from tests.support.example_runs import check_retained_intact, example_env
from tests.support.sessions_reference import DELAY, GAP, check_end, generate

pytestmark = [pytest.mark.spark, pytest.mark.crash]

SEED = int(os.environ.get("STATEHOLD_CRASH_SEED") or random.SystemRandom().randrange(2**31))


def cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "statehold.examples.sessions", *args,
            "--gap-seconds", str(GAP), "--watermark-delay-seconds", str(DELAY)]


def run_to_end(cwd: Path, args: list[str], env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(cmd(args), cwd=cwd, env=example_env(cwd, env), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def kill_at_random(cwd: Path, args: list[str], rng: random.Random,
                   env: Mapping[str, str] | None = None) -> str:
    """Start the example and SIGKILL its driver at a random moment: after a random number
    of finished batches (0: while Spark starts or the first batch runs) plus a random
    pause. Waits for the driver's children (same session) to go."""
    after, pause = rng.randrange(0, 4), rng.uniform(0.0, 3.0)
    log = cwd / f"kill-{time.monotonic_ns()}.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd(args), cwd=cwd, env=example_env(cwd, env),
                                stdout=subprocess.PIPE, stderr=out, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        seen = 0
        try:
            for line in proc.stdout:
                out.write(line)
                seen += line.startswith("batch ")
                if seen >= after:
                    break
            time.sleep(pause)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
    return f"after {after} batches + {pause:.1f} s (rc {proc.returncode})"


def scenario(tmp: Path, checkpoints: str, job: Storage, kills: int,
             env: Mapping[str, str] | None = None, stop_when_idle: bool = False) -> None:
    """`kills` runs killed at random, then one to the end: with `stop_when_idle`, one
    that keeps running (``--keep-running``) and is stopped from outside once it waits for
    files (its timers fired), which must exit 0 with one line."""
    inp, out = tmp / "input", tmp / "output"
    generate(inp, files=4)
    args = ["--input", str(inp), "--output", str(out), "--checkpoints", checkpoints,
            "--max-parallelism", "16", "--parallelism", "2"]
    rng = random.Random(SEED)
    moments = []
    for _ in range(kills):
        moments.append(kill_at_random(tmp, args, rng, env))
        if EmbeddedHAStore(job).read().retained:  # none if killed before the first
            check_retained_intact(job)
    if stop_when_idle:
        driver = Driver(tmp, "sessions", cmd([*args, "--keep-running", "--poll-seconds",
                                              "0.5"]), env)
        driver.wait_line(f"waiting for new files in {inp}")
        stopped = statehold_cli("stop", f"{checkpoints}/sessions", "--wait", "--timeout", "10",
                                env=env)
        assert stopped.code == 0, stopped.err
        assert driver.exited() == 0, driver.log.read_text()[-3000:]
        assert driver.lines[-1].startswith("stopped from outside after checkpoint "), \
            driver.lines[-3:]
        stdout = "\n".join(driver.lines)
    else:
        stdout = run_to_end(tmp, args, env)
    assert "no input (timers)" in stdout or kills, stdout
    print(f"seed {SEED}: killed {moments}")
    check_end(job, out, inp, 1)


@pytest.mark.timeout(1800)  # each run starts Spark; slow on a shared machine
def test_sessions_match_reference_after_kills(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    scenario(tmp_path, str(ckpt), open_storage(str(ckpt / "sessions")), kills=2,
             stop_when_idle=True)


@pytest.mark.timeout(1800)
def test_sessions_kill_on_s3(tmp_path: Path, s3_server: Any) -> None:
    uri = f"s3://{s3_server.bucket}/sessions-{os.getpid()}-{tmp_path.name}"
    job = open_storage(f"{uri}/sessions", **s3_server.options)
    scenario(tmp_path, uri, job, kills=1, env=s3_server.env)


@pytest.mark.timeout(1800)
def test_sessions_rescale_with_open_timers(tmp_path: Path) -> None:
    """Parallelism 2, then 3, then 1, two more files each time: sessions open at a
    rescale close later from timers restored into other tasks."""
    source, inp, out, ckpt = (tmp_path / d for d in ("source", "input", "output", "ckpt"))
    generate(source, files=6, seed=11)
    inp.mkdir()
    names = sorted(source.glob("*.jsonl"))
    common = ["--input", str(inp), "--output", str(out), "--checkpoints", str(ckpt),
              "--max-parallelism", "12", "--files-per-batch", "2"]
    for parallelism, files in (("2", names[:2]), ("3", names[2:4]), ("1", names[4:])):
        for f in files:
            f.rename(inp / f.name)
        stdout = run_to_end(tmp_path, [*common, "--parallelism", parallelism])
        assert "no input (timers)" in stdout
    check_end(open_storage(str(ckpt / "sessions")), out, inp, 2)
