"""The running-totals example (``python -m statehold.examples.running_totals``) in
subprocesses: its environment and command line, a plain-Python reference of its output
and state, and runs killed -9 where the example pauses (tests/support/pause_hooks.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from statehold.backend.rocks import TaskStateBackend, sources_from_metadata
from statehold.examples.totals import LAST_N
from statehold.format.metadata import KeyGroupRange, read_metadata
from statehold.ha.embedded import EmbeddedHAStore
from statehold.job.directory import open_job
from statehold.storage import Storage
from statehold.tools import locate, verify
from tests.support.paths import ROOT, SRC, SUPPORT
from tests.support.pause_hooks import PAUSE_ENV, PAUSE_MARK_ENV

Totals = dict[str, tuple[int, int]]


def example_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an example subprocess: this tree's code (and `tests.support`, for
    the drivers and phase hooks), task state under tmp."""
    path = [str(SRC), str(ROOT),
            *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(path),
        "STATEHOLD_LOCAL_DIR": str(tmp / "task-state"),
        **dict(extra or {}),
    }


def example_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "statehold.examples.running_totals", *args]


def run_example(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        example_cmd(*args), cwd=cwd, env=example_env(cwd), capture_output=True, text=True,
        timeout=600,
    )


def read_rows(path: Path) -> list[tuple[str, int]]:
    return [(r["key"], r["value"]) for r in map(json.loads, path.read_text().splitlines())]


def reference(input_dir: Path, files_per_batch: int = 1) -> list[Totals]:
    """Per batch (files in name order): (count, sum) of the keys it touched."""
    totals: Totals = {}
    batches = []
    names = sorted(input_dir.glob("*.jsonl"))
    for i in range(0, len(names), files_per_batch):
        touched: Totals = {}
        for path in names[i : i + files_per_batch]:
            for key, value in read_rows(path):
                c, s = totals.get(key, (0, 0))
                totals[key] = touched[key] = (c + 1, s + value)
        batches.append(touched)
    return batches


def reference_state(input_dir: Path) -> dict[str, dict[str, object]]:
    """The final state per key: count, sum and the last values, in file and line order."""
    state: dict[str, dict[str, object]] = {}
    for path in sorted(input_dir.glob("*.jsonl")):
        for key, value in read_rows(path):
            s = state.setdefault(key, {"count": 0, "sum": 0, "last": []})
            s["count"] = int(str(s["count"])) + 1
            s["sum"] = int(str(s["sum"])) + value
            s["last"] = [*list(s["last"]), value][-LAST_N:]  # type: ignore[call-overload]
    return state


def read_output(output: Path) -> list[Totals]:
    batches = []
    for d in sorted(output.glob("batch-*")):
        rows = {}
        for part in d.glob("part-*.json"):
            for line in part.read_text().splitlines():
                r = json.loads(line)
                assert r["key"] not in rows, f"{d.name}: key {r['key']} written twice"
                rows[r["key"]] = (r["count"], r["sum"])
        batches.append(rows)
    return batches


START_TIMEOUT = 300.0
PAUSED_EXAMPLE = SUPPORT / "pause_hooks.py"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_and_kill(
    cwd: Path, args: list[str], pause_at: str, env: Mapping[str, str] | None = None
) -> str:
    """Run the example until it pauses at `pause_at`, then kill -9 its driver. Returns the
    driver's output. Waits until the driver's JVM and Python workers are gone as well
    (their own stdin watch ends them), killing stragglers after a grace period."""
    mark = cwd / f"pause-{pause_at.replace(':', '-')}"
    log = cwd / f"log-{pause_at.replace(':', '-')}.txt"
    extra = {PAUSE_ENV: pause_at, PAUSE_MARK_ENV: str(mark)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(PAUSED_EXAMPLE), *args], cwd=cwd,
            env=example_env(cwd, {**dict(env or {}), **extra}),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not mark.exists():
                if proc.poll() is not None:
                    pytest.fail(f"the example exited ({proc.returncode}) before pausing at "
                                f"{pause_at}:\n{log.read_text()[-4000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the example never paused at {pause_at}")
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
    assert pause_at in mark.read_text()
    return log.read_text()


def latest_id(job: Storage) -> int | None:
    latest = EmbeddedHAStore(job).read().latest
    return None if latest is None else latest.checkpoint_id


def check_retained_intact(job: Storage) -> None:
    """Every file a retained checkpoint references is there, with its size and checksum."""
    retained = EmbeddedHAStore(job).read().retained
    assert retained
    for ptr in retained:
        report = verify(locate(job, ptr.metadata))
        assert report.ok, (ptr.metadata, report.problems)
        assert report.files_checked > 0


def final_state(job: Storage, scratch: Path, max_parallelism: int) -> dict[str, dict[str, Any]]:
    """The keyed state of the job's newest retained checkpoint (operator ``state``), read
    with the state backend over every key group."""
    with open_job(job) as opened:
        latest = opened.ha.read().latest
    assert latest is not None
    meta = read_metadata(job, latest.metadata)
    sources = sources_from_metadata(job, latest.metadata, meta, "state")
    everything = KeyGroupRange(start=0, end=max_parallelism - 1)
    with TaskStateBackend.open(scratch, "state", everything, max_parallelism, sources) as b:
        return {str(k): v for k, v in b.items()}
