"""Two driver processes of one job at once: the first is paused (SIGSTOP) while a second
takes over, then resumed (SIGCONT). The old one must be fenced: it completes nothing,
deletes nothing, and the final state is exact. Five pause timings, each with the embedded
HA store and with ZooKeeper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statehold.format import layout
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.ha.open import open_ha_store
from statehold.job.lease import lease_key
from statehold.storage import LocalStorage, Storage
from tests.support import zombie_driver as zd
from tests.support.paths import ROOT, SUPPORT
from tests.support.zk import ZooKeeperServer

DRIVER = SUPPORT / "zombie_driver.py"
BATCHES = 8
#: Bound on any wait for a driver to reach a state (not a timing assertion).
WAIT = 120.0

#: (pause point of driver A, checkpoint) — self-paused at an exact point — or
#: ("external", delay ms): the test sends SIGSTOP that long after A's checkpoint 2.
TIMINGS = [
    ("before-complete", 3),  # uploads done, B later re-does 3..8 and subsumes 3
    ("before-complete", 7),  # A's abort would hit B's retained chk-7/ without the fence
    ("mid-upload", 4),  # one task uploaded, the other uploads after A resumes
    ("after-complete", 5),  # between checkpoints: A fails on the next one
    ("external", 30),  # wherever A happens to be
]


def wait_for(cond: Callable[[], Any], what: str, proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        value = cond()
        if value:
            return value
        if proc.poll() is not None and not cond():
            raise AssertionError(f"driver exited ({proc.returncode}) before: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.02)


def is_stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def events(path: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in zd.read_events(path) if e["event"] == name]


def listing(storage: Storage) -> set[str]:
    return {info.key for info in storage.list()}


def referenced_by(storage: Storage, metadata_keys: list[str]) -> set[str]:
    keys: set[str] = set()
    for key in metadata_keys:
        keys.add(key)
        keys.update(referenced_keys(read_metadata(storage, key), key))
    return keys


@pytest.fixture(params=["embedded", "zookeeper"])
def ha_uri(request: pytest.FixtureRequest) -> str:
    if request.param == "embedded":
        return "embedded"
    server: ZooKeeperServer = request.getfixturevalue("zk_server")
    return f"zookeeper://{server.hosts}/statehold-zombie"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:  # only the drivers this test started, by their own handle
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("timing", TIMINGS, ids=lambda t: f"{t[0]}-{t[1]}")
def test_paused_driver_is_fenced_and_loses_nothing(
    tmp_path: Path, ha_uri: str, timing: tuple[str, int], procs: list[subprocess.Popen[bytes]]
) -> None:
    point, at = timing
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    root = tmp_path / "checkpoints"
    storage = LocalStorage(root).child(job_id)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}

    def driver(name: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.events"
        cmd = [sys.executable, str(DRIVER), "--root", str(root), "--job-id", job_id,
               "--ha", ha_uri, "--batches", str(BATCHES), "--events", str(log),
               "--local-dir", str(tmp_path / f"local-{name}"), *extra]
        with (tmp_path / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, log

    # Driver A: self-paused at an exact point, or stopped from outside after a delay.
    if point == "external":
        a, a_log = driver("a", "--batch-delay", "0.05")
        wait_for(lambda: any(e["checkpoint"] == 2 for e in events(a_log, "completed")),
                 "A completes checkpoint 2", a)
        time.sleep(at / 1000)
        a.send_signal(signal.SIGSTOP)
    else:
        a, a_log = driver("a", "--pause", f"{point}:{at}")
        wait_for(lambda: events(a_log, "pausing"), "A pauses", a)
    wait_for(lambda: is_stopped(a.pid), "A is stopped", a)
    a_epoch = events(a_log, "started")[0]["epoch"]
    a_completed = [e["checkpoint"] for e in events(a_log, "completed")]
    assert a_completed, "A completed checkpoints before it was paused"

    # Driver B takes over the same job while A sleeps, and runs to the end.
    b, b_log = driver("b")
    assert b.wait(timeout=WAIT) == 0, (tmp_path / "b.log").read_text()
    b_started = events(b_log, "started")[0]
    assert b_started["epoch"] > a_epoch
    assert b_started["first_batch"] == a_completed[-1] + 1  # resumed from the HA store
    b_done = events(b_log, "done")[0]

    ha = open_ha_store(ha_uri, storage, job_id)
    try:
        ha_before = ha.read()
        assert ha_before.epoch == b_started["epoch"]
        b_retained = [p.metadata for p in ha_before.retained]
        assert [p.checkpoint_id for p in ha_before.retained] == [6, 7, 8]
        b_files = referenced_by(storage, b_retained)
        before = listing(storage)
        assert b_files <= before

        # Wake A up: it must be fenced, complete nothing and delete nothing.
        a.send_signal(signal.SIGCONT)
        assert a.wait(timeout=WAIT) == zd.FENCED_EXIT, (tmp_path / "a.log").read_text()
        fenced = events(a_log, "fenced")[0]
        assert fenced["error"] in ("FencedError", "CheckpointError")
        assert fenced["still_current"] is False
        assert fenced["cleaner_fenced"] is True  # its abort reached the guard, which refused
        if fenced["deleted_at_pause"] is not None:
            assert fenced["deleted_total"] == fenced["deleted_at_pause"]
        # Nothing A completed after the pause.
        assert [e["checkpoint"] for e in events(a_log, "completed")] == a_completed

        after = listing(storage)
        assert b_files <= after, f"lost: {sorted(b_files - after)}"
        assert before - after <= {lease_key(a_epoch)}  # at most A's own lease file
        ha_after = ha.read()
        assert (ha_after.epoch, ha_after.retained) == (ha_before.epoch, ha_before.retained)
        # Each retained document is the one its pointer names; those B made are B's
        # (no zombie replaced one).
        for pointer in ha_after.retained:
            epoch = read_metadata(storage, pointer.metadata).epoch
            assert epoch == pointer.epoch
            if pointer.checkpoint_id >= b_started["first_batch"]:
                assert epoch == b_started["epoch"]

        # The final state is exact: B's result and a restore from the HA store alone.
        expected = zd.reference(BATCHES)
        assert b_done["totals"] == expected
        assert zd.restored_totals(storage, ha, tmp_path / "verify") == expected
    finally:
        ha.close()

    # What A left behind (an upload after it woke, a stale chk-N/_metadata) is an orphan
    # of an old epoch: the next attempt's reconcile removes it, and only it.
    c, _ = driver("c")
    assert c.wait(timeout=WAIT) == 0, (tmp_path / "c.log").read_text()
    data = {
        k for k in listing(storage)
        if k.split("/", 1)[0] in (layout.SHARED_DIR, layout.EXCLUSIVE_DIR)
        or k.startswith("chk-")
    }
    assert data == b_files
