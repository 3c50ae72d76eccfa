"""The sessions example (``python -m statehold.examples.sessions``) in subprocesses against
a plain-Python reference: run to the end; kill -9 of the driver at random moments, then a
restart (local storage and S3 on moto); a rescale 2 -> 3 -> 1 with sessions open (their
timers move with their key groups). After every kill the retained checkpoints are intact;
at the end every closed session was written exactly once, the open ones (and only they)
are in the state with one timer each, and the job directory holds no orphan."""

from __future__ import annotations

import json
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

from statehold.backend.state import TIMERS_NAME
from statehold.cleanup.reconcile import plan
from statehold.ha.embedded import EmbeddedHAStore
from statehold.job.directory import open_job
from statehold.spark.reader import iter_state
from statehold.storage import Storage, open_storage
from tests.support.example_runs import check_retained_intact, example_env

pytestmark = [pytest.mark.spark, pytest.mark.crash]

GAP, DELAY = 300, 120
SEED = int(os.environ.get("STATEHOLD_CRASH_SEED") or random.SystemRandom().randrange(2**31))
Session = tuple[str, int, int, int]


def generate(input_dir: Path, files: int, rows: int = 40, users: int = 12, seed: int = 7) -> None:
    """Event times rising ~20 s per row with disorder below the watermark delay (so no row
    is late), bursts and pauses so sessions close, merge and stay open."""
    rng = random.Random(seed)
    input_dir.mkdir(parents=True, exist_ok=True)
    clock = 1_700_000_000
    for i in range(files):
        lines = []
        for _ in range(rows):
            clock += rng.choice([5, 10, 20, 40]) if rng.random() < 0.97 else 900
            ts = clock - rng.randrange(0, DELAY - 20)
            user = f"u{rng.randrange(users):02d}"
            lines.append(json.dumps({"user": user, "ts": ts, "page": f"p{rng.randrange(5)}"}))
        (input_dir / f"part-{i:04d}.jsonl").write_text("\n".join(lines) + "\n")


def reference(input_dir: Path, files_per_batch: int = 1) -> tuple[set[Session], set[Session]]:
    """(closed, open) sessions: batches of files in name order, each judged against the
    watermark of the batches before it (late rows dropped), gap sessions per user, closed
    once the final watermark reaches end + gap."""
    names = sorted(input_dir.glob("*.jsonl"))
    watermark: int | None = None
    events: dict[str, list[int]] = {}
    for i in range(0, len(names), files_per_batch):
        newest = None
        for path in names[i : i + files_per_batch]:
            for line in path.read_text().splitlines():
                row = json.loads(line)
                newest = row["ts"] if newest is None else max(newest, row["ts"])
                if watermark is None or row["ts"] > watermark:
                    events.setdefault(row["user"], []).append(row["ts"])
        if newest is not None:
            moved = newest - DELAY
            watermark = moved if watermark is None else max(watermark, moved)
    closed, still_open = set(), set()
    for user, times in events.items():
        times.sort()
        start = end = times[0]
        n = 0
        for t in times:
            if t - end > GAP:
                (closed if end + GAP <= (watermark or 0) else still_open).add(
                    (user, start, end, n))
                start, n = t, 0
            end, n = t, n + 1
        (closed if end + GAP <= (watermark or 0) else still_open).add((user, start, end, n))
    return closed, still_open


def read_sessions(output: Path) -> list[Session]:
    out = []
    for part in sorted(output.glob("batch-*/part-*.json")):
        for line in part.read_text().splitlines():
            r = json.loads(line)
            out.append((r["user"], r["start"], r["end"], r["events"]))
    return out


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


def check_end(job: Storage, output: Path, inp: Path, files_per_batch: int) -> None:
    closed, still_open = reference(inp, files_per_batch)
    written = read_sessions(output)
    assert len(written) == len(set(written)), "a session was written twice"
    assert set(written) == closed
    assert closed and still_open  # the input exercises both
    state = dict(iter_state(job))
    opened = {(str(u), *s) for u, st in state.items() for s in st.get("open", [])}
    assert opened == still_open
    assert all(len(st[TIMERS_NAME]) == len(st["open"]) for st in state.values())
    check_retained_intact(job)
    leftovers = plan(open_job(job), None)
    assert leftovers.orphans == [], [f.key for f in leftovers.orphans]


def scenario(tmp: Path, checkpoints: str, job: Storage, kills: int,
             env: Mapping[str, str] | None = None) -> None:
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
    stdout = run_to_end(tmp, args, env)
    assert "no input (timers)" in stdout or kills, stdout
    print(f"seed {SEED}: killed {moments}")
    check_end(job, out, inp, 1)


@pytest.mark.timeout(1800)  # each run starts Spark; slow on a shared machine
def test_sessions_match_reference_after_kills(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    scenario(tmp_path, str(ckpt), open_storage(str(ckpt / "sessions")), kills=2)


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
