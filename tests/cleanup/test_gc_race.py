"""`statehold gc` racing a running job: gc runs in a loop (`gc.gc` in a thread,
plus the real CLI at chosen moments) beside

(a) a driver process killed with SIGKILL and restarted a few times, and
(b) a driver stopped (SIGSTOP) longer than its lease ttl — once with a checkpoint's
    files uploaded and not completed, once between checkpoints — then resumed.

After every gc the storage is LISTED: no file a retained checkpoint or a savepoint
references may be missing (`reconcile.referenced_by_job` semantics, counted only for
checkpoints retained before and after the listing, so a subsume in between is not
mistaken for a loss). At the end the keyed state restored from the newest checkpoint,
and from every savepoint, equals a plain-Python computation of the batches.

The drivers are tests/support/gc_race_driver.py (tests/support/crash_driver.py with a
lease ttl of 2 s and self-pauses). A gc that overlapped a failover or a resumed attempt stops with
GcInterruptedError ("run gc again"): expected, counted and printed.

The random seed is printed; STATEHOLD_GC_RACE_SEED replays a run's kill schedule.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from statehold.cleanup.gc import GcInterruptedError, gc
from statehold.cleanup.holders import read_holders
from statehold.cleanup.reconcile import ReconcileError
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.job.directory import open_job
from statehold.storage import LocalStorage
from tests.support import crash_driver as cd
from tests.support.paths import ROOT, SUPPORT

pytestmark = pytest.mark.crash

DRIVER = SUPPORT / "gc_race_driver.py"
SEED = int(os.environ.get("STATEHOLD_GC_RACE_SEED") or random.SystemRandom().randrange(2**31))
TTL = 2.0
#: Bound on any wait for a driver (not a timing assertion).
WAIT = 60.0


# -- the driver ------------------------------------------------------------------------------
class Driver:
    """One gc_race_driver process; its ``PHASE`` lines are collected as they come."""

    def __init__(self, job_dir: Path, local_dir: Path, batches: int, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(job_dir), str(local_dir), "--batches",
             str(batches), "--seed", "1", "--lease-ttl", str(TTL), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.phases: list[tuple[str, int]] = []
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._drain, daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if len(words) >= 2 and words[0] == "PHASE":
                n = int(words[2]) if len(words) > 2 and words[2].isdigit() else 0
                self.phases.append((words[1], n))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def saw(self, phase: str, n: int | None = None) -> bool:
        return any(p == phase and (n is None or m == n) for p, m in self.phases)

    def wait_for(self, what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not cond():
            if self.proc.poll() is not None and not cond():
                raise AssertionError(f"driver exited ({self.proc.returncode}) before {what}:"
                                     f"\n{''.join(self.stderr[-30:])}")
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            time.sleep(0.01)

    def stopped(self) -> bool:
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(WAIT)
        for t in self._readers:
            t.join(5)

    def finish(self) -> int:
        code = self.proc.wait(WAIT * 2)
        for t in self._readers:
            t.join(5)
        return code


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for d in started:  # only the processes this test started, by their own handle
        if d.proc.poll() is None:
            d.kill()


# -- gc beside it, and the listing after every gc ------------------------------------------
def missing_references(job_dir: Path) -> dict[str, set[str]]:
    """metadata key -> referenced files missing (or of another size), for every savepoint
    and every checkpoint retained (by the same pointer) before and after the listing."""
    storage = LocalStorage(job_dir)
    with open_job(storage) as job:
        first = job.state()
        holders = read_holders(job, first)
        sizes = {info.key: info.size for info in storage.list()}
        second = job.state()
    throughout = set(first.retained) & set(second.retained)
    problems: dict[str, set[str]] = {}
    for pointer in throughout:
        if pointer.metadata not in holders.documents:
            problems[pointer.metadata] = {
                f"unreadable: {holders.quarantined.get(pointer.metadata)}"}
    for key, meta in holders.documents.items():
        if layout.parse(key).kind is Kind.CHECKPOINT_METADATA and not any(
                p.metadata == key for p in throughout):
            continue
        need = {key: None, **{k: f.size for k, f in referenced_keys(meta, key).items()}}
        bad = {k for k, size in need.items()
               if k not in sizes or (size is not None and sizes[k] != size)}
        if bad:
            problems[key] = bad
    return problems


@dataclass
class GcLoop:
    job_dir: Path
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def once(self) -> None:
        try:
            with open_job(str(self.job_dir)) as job:
                report = gc(job)
            self.counts["completed"] += 1
            self.counts["deleted"] += report.deleted
            self.counts["while live" if report.live_epoch is not None else "no live attempt"] += 1
        except GcInterruptedError:
            self.counts["interrupted (run gc again)"] += 1
        except ReconcileError as e:
            if "missing" in str(e):
                self.violations.append(f"gc: {e}")
            else:
                self.counts["could not delete (run gc again)"] += 1
        except StateholdError as e:  # e.g. a listing or read that raced a delete: nothing done
            self.counts["refused"] += 1
            self.errors[f"{type(e).__name__}: {str(e)[:120]}"] += 1
        self.check("after gc")

    def check(self, when: str) -> None:
        try:
            problems = missing_references(self.job_dir)
        except StateholdError as e:  # the checker's own read raced a change: look again
            self.errors[f"check: {type(e).__name__}: {str(e)[:120]}"] += 1
            return
        self.counts["checks"] += 1
        if problems:
            self.violations.append(f"{when}: {problems}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.once()
            except Exception as e:  # a bug, not a refusal: record it, keep the race going
                self.violations.append(f"gc loop raised {type(e).__name__}: {e}")
            time.sleep(0.01)

    def start(self) -> GcLoop:
        self._thread = threading.Thread(target=self._run, name="gc-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the gc loop hangs"

    def summary(self) -> str:
        return f"gc loop: {dict(self.counts)}; refusals: {dict(self.errors)}"


def cli_gc(job_dir: Path) -> dict[str, object]:
    """The real command, as an operator runs it."""
    proc = subprocess.run([sys.executable, "-m", "statehold.cli", "gc", str(job_dir), "--json"],
                          capture_output=True, text=True, timeout=WAIT)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout)
    if proc.returncode != 0:
        assert "run gc again" in proc.stderr, proc.stderr
    return doc


def assert_final_state(job_dir: Path, tmp_path: Path, batches: int) -> None:
    """The newest checkpoint, restored from storage alone, and every savepoint hold
    exactly what a plain-Python computation of the batches says."""
    storage = LocalStorage(job_dir)
    with open_job(storage) as job:
        latest = job.state().latest
        assert latest is not None and latest.checkpoint_id == batches
        meta = read_metadata(storage, latest.metadata)
        state = cd.read_state(storage, tmp_path / "verify-latest", latest.metadata, meta)
        assert state == cd.reference(1, batches)
        for key in job.savepoint_keys():
            sp = read_metadata(storage, key)
            restored = cd.read_state(storage, tmp_path / f"verify-{sp.checkpoint_id}", key, sp)
            assert restored == cd.reference(1, sp.checkpoint_id), key


# -- (a) killed and restarted -----------------------------------------------------------------
def test_gc_beside_a_driver_killed_and_restarted(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    print(f"STATEHOLD_GC_RACE_SEED={SEED}")
    rng = random.Random(SEED)
    batches, kills = 40, 5
    job_dir = tmp_path / cd.JOB_ID

    def driver(i: int) -> Driver:
        d = Driver(job_dir, tmp_path / f"local-{i}", batches)
        drivers.append(d)
        return d

    d = driver(0)
    d.wait_for("the first attempt starts", lambda: d.saw("started"))
    loop = GcLoop(job_dir).start()
    killed_at: list[str] = []
    latest = 0
    try:
        for i in range(kills):
            if i == kills - 1:  # the last kill lands in the job-end cleanup
                d.wait_for("the job end", lambda d=d: d.saw("end") or d.saw("done"))
                time.sleep(rng.uniform(0.0, 0.1))
            else:  # soon after one of the next eight checkpoints, wherever that is
                target = min(batches - 2, latest + rng.randint(1, 8))
                d.wait_for(f"checkpoint {target}", lambda d=d, t=target: any(
                    p == "completed" and n >= t for p, n in d.phases))
                time.sleep(rng.uniform(0.0, 0.12))
            d.kill()
            killed_at.append(f"{d.phases[-1] if d.phases else 'start'}")
            latest = max([latest, *(n for p, n in d.phases if p == "completed")])
            loop.check(f"after kill {i} at {killed_at[-1]}")
            if rng.random() < 0.5:
                time.sleep(TTL + 0.5)  # its lease lapses: gc sees no attempt meanwhile
            d = driver(i + 1)
        assert d.finish() == 0, "".join(d.stderr[-30:])
        assert d.saw("done")
    finally:
        loop.stop()
    loop.once()
    report = cli_gc(job_dir)
    loop.check("after the final CLI gc")
    print(f"kills at {killed_at}; {loop.summary()}; final CLI gc: deleted {report['deleted']}")
    assert not loop.violations, "\n".join(loop.violations)
    assert loop.counts["completed"] > kills
    assert_final_state(job_dir, tmp_path, batches)


# -- (b) stopped past its lease ----------------------------------------------------------------
def test_gc_beside_a_driver_stopped_past_its_lease(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    batches = 14
    job_dir = tmp_path / cd.JOB_ID
    d = Driver(job_dir, tmp_path / "local", batches, "--pause", "uploaded:5",
               "--pause", "completed:9")
    drivers.append(d)
    d.wait_for("the attempt starts", lambda: d.saw("started"))
    loop = GcLoop(job_dir).start()
    try:
        # 1. Stopped with checkpoint 5's files uploaded, not completed.
        d.wait_for("the pause at uploaded 5", lambda: d.saw("uploaded", 5) and d.stopped())
        epoch = next(n for p, n in d.phases if p == "started")
        storage = LocalStorage(job_dir)
        uploads = {i.key for i in storage.list()
                   if (p := layout.parse(i.key)).epoch == epoch and p.checkpoint_id == 5}
        assert uploads, "checkpoint 5 uploaded files"
        time.sleep(TTL + 1.0)  # the lease lapses
        report = cli_gc(job_dir)
        assert report["live_epoch"] is None, report
        # Its in-flight files are fair game now (by this gc or the loop's), and went.
        assert not uploads & {i.key for i in storage.list()}
        loop.check("while stopped")
        d.proc.send_signal(signal.SIGCONT)
        # It must not publish checkpoint 5 over the deleted files: refused, then redone.
        d.wait_for("checkpoint 5 completes", lambda: d.saw("completed", 5))
        assert d.saw("refused", 5), d.phases
        assert d.phases.index(("refused", 5)) < d.phases.index(("completed", 5))
        loop.check("after checkpoint 5 completed")

        # 2. Stopped between checkpoints 9 and 10.
        d.wait_for("the pause at completed 9", lambda: d.saw("completed", 9) and d.stopped())
        time.sleep(TTL + 1.0)
        assert cli_gc(job_dir)["live_epoch"] is None
        loop.check("while stopped between checkpoints")
        d.proc.send_signal(signal.SIGCONT)
        assert d.finish() == 0, "".join(d.stderr[-30:])
        assert d.saw("done")
    finally:
        loop.stop()
    loop.once()
    print(f"refused: {[n for p, n in d.phases if p == 'refused']}; {loop.summary()}")
    assert not loop.violations, "\n".join(loop.violations)
    assert_final_state(job_dir, tmp_path, batches)
