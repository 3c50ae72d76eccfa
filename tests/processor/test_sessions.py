"""The sessions example (``python -m statehold.examples.sessions``) in subprocesses against
a plain-Python reference. On local storage one job goes through a rescale 2 -> 3 -> 1 with
sessions open (their timers move with their key groups), new files each time: the run
at 2 goes to the end; at 3 and at 1 a run is first killed -9 at a random moment and
restarted (at 1 the restart keeps running and is stopped from outside once idle). On S3
(moto) a run killed at random, then one to the end. After every kill the retained
checkpoints are intact; at the end every closed session was written exactly once, the
open ones (and only they) are in the state with one timer each, and the job directory
holds no orphan."""

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
                   env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Start the example and SIGKILL its driver at a random moment: after a random number
    of finished batches (0: while Spark starts or the first batch runs) plus a random
    pause. Waits for the driver's children (same session) to go. (The moment, everything
    the run printed.)"""
    after, pause = rng.randrange(0, 4), rng.uniform(0.0, 3.0)
    log = cwd / f"kill-{time.monotonic_ns()}.txt"
    printed: list[str] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd(args), cwd=cwd, env=example_env(cwd, env),
                                stdout=subprocess.PIPE, stderr=out, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        seen = 0
        try:
            for line in proc.stdout:
                printed.append(line)
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
        printed.append(proc.stdout.read())  # what it printed before the kill: every writer gone
        out.write("".join(printed))
    return f"after {after} batches + {pause:.1f} s (rc {proc.returncode})", "".join(printed)


def kill_and_check(cwd: Path, args: list[str], rng: random.Random, job: Storage,
                   env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """`kill_at_random`, then the retained checkpoints (none if killed before the first)
    are intact."""
    moment, printed = kill_at_random(cwd, args, rng, env)
    if EmbeddedHAStore(job).read().retained:
        check_retained_intact(job)
    return moment, printed


@pytest.mark.timeout(1800)  # each run starts Spark; slow on a shared machine
def test_sessions_rescale_and_kills_match_reference(tmp_path: Path) -> None:
    """Parallelism 2 over two files, then 3 and 1 over eight more files each: sessions
    open at a rescale close later from timers restored into other tasks. The first run
    at 3 and at 1 is killed at random (a rescaled restore cut short; four batches with
    input and those without leave the kill moments room), then the restart finishes the
    files; the last restart keeps running and is stopped from outside once it waits for
    files (its timers fired): exit 0 with one line. Every parallelism ran a batch without
    input (timers)."""
    source, inp, out, ckpt = (tmp_path / d for d in ("source", "input", "output", "ckpt"))
    generate(source, files=18, seed=11)
    inp.mkdir()
    names = sorted(source.glob("*.jsonl"))
    job = open_storage(str(ckpt / "sessions"))
    common = ["--input", str(inp), "--output", str(out), "--checkpoints", str(ckpt),
              "--max-parallelism", "12", "--files-per-batch", "2"]
    rng = random.Random(SEED)
    moments = []
    for parallelism, files in (("2", names[:2]), ("3", names[2:10]), ("1", names[10:])):
        for f in files:
            f.rename(inp / f.name)
        args = [*common, "--parallelism", parallelism]
        if parallelism == "2":
            assert "no input (timers)" in run_to_end(tmp_path, args)
            continue
        moment, killed_printed = kill_and_check(tmp_path, args, rng, job)
        moments.append(moment)
        if parallelism == "3":
            stdout = run_to_end(tmp_path, args)
        else:
            driver = Driver(tmp_path, "sessions", cmd([*args, "--keep-running",
                                                       "--poll-seconds", "0.5"]))
            driver.wait_line(f"waiting for new files in {inp}")
            stopped = statehold_cli("stop", f"{ckpt}/sessions", "--wait", "--timeout", "10")
            assert stopped.code == 0, stopped.err
            assert driver.exited() == 0, driver.log.read_text()[-3000:]
            assert driver.lines[-1].startswith("stopped from outside after checkpoint "), \
                driver.lines[-3:]
            stdout = "\n".join(driver.lines)
        assert "no input (timers)" in killed_printed + stdout, (killed_printed, stdout)
    print(f"seed {SEED}: killed {moments}")
    check_end(job, out, inp, 2)


@pytest.mark.timeout(1800)
def test_sessions_kill_on_s3(tmp_path: Path, s3_server: Any) -> None:
    """One run killed at random, then one to the end, one file per batch."""
    uri = f"s3://{s3_server.bucket}/sessions-{os.getpid()}-{tmp_path.name}"
    job = open_storage(f"{uri}/sessions", **s3_server.options)
    inp, out = tmp_path / "input", tmp_path / "output"
    generate(inp, files=4)
    args = ["--input", str(inp), "--output", str(out), "--checkpoints", uri,
            "--max-parallelism", "16", "--parallelism", "2"]
    moment, _ = kill_and_check(tmp_path, args, random.Random(SEED), job, s3_server.env)
    run_to_end(tmp_path, args, s3_server.env)
    print(f"seed {SEED}: killed {moment}")
    check_end(job, out, inp, 1)
