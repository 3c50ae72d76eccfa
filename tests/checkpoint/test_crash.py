"""Crash suite: kill -9 a real driver process (tests/support/crash_driver.py) at random points of
checkpoint, abort, subsume, reconcile and job-end cleanup, restart it, and prove by
listing the storage that

(a) after every kill, no file a retained checkpoint or savepoint references is missing;
(b) once the final run's job-end cleanup finished, the job directory holds exactly the
    referenced files, the HA pointer documents and the job result entry — no orphan;
(c) the final keyed state (and every savepoint's) equals a plain-Python computation.

The HA store is the embedded one, or (the cluster-like configuration) ZooKeeper over S3.

The random seed is printed; set STATEHOLD_CRASH_SEED to replay a run's kill schedule
(the instants still vary with timing, the phases and delays do not).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from statehold.cleanup.reconcile import referenced_by_job
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.ha.base import HAStore
from statehold.ha.embedded import EmbeddedHAStore
from statehold.ha.open import EMBEDDED, open_ha_store
from statehold.job.directory import OWNER_KEY, open_job
from statehold.job.history import is_history_record
from statehold.job.result import read_result
from statehold.storage import Storage, open_storage
from statehold.tools import locate, verify
from tests.support import crash_driver as drv
from tests.support.infra.object_store_servers import S3Server
from tests.support.paths import ROOT, SUPPORT, python_path
from tests.support.zk import ZooKeeperServer

pytestmark = pytest.mark.crash

DRIVER = SUPPORT / "crash_driver.py"
SEED = int(os.environ.get("STATEHOLD_CRASH_SEED") or random.SystemRandom().randrange(2**31))
BATCHES = 16
#: Phases the driver reports, with how long to wait after the marker before the kill.
PER_BATCH = {"begin": 0.03, "uploaded": 0.02, "metadata-written": 0.01, "completed": 0.05}
ANYTIME = {"start": 0.3, "started": 0.1, "reconciled": 0.05, "timer": 0.0}
HA_DOC = re.compile(r"^_ha/\d{20}\.json$")


@dataclass
class Kill:
    phase: str
    occurrence: int
    delay: float


@dataclass
class Outcome:
    kills: Counter[str] = field(default_factory=Counter)
    runs: int = 0


def listing(storage: Storage) -> set[str]:
    """The job directory's files, the checkpoint history's records left out."""
    return {info.key for info in storage.list() if not is_history_record(info.key)}


@contextmanager
def open_ha(storage: Storage, ha_uri: str) -> Iterator[HAStore]:
    """The crash driver's HA store (embedded or ``zookeeper://``), closed afterwards."""
    ha = open_ha_store(ha_uri, storage, drv.JOB_ID)
    try:
        yield ha
    finally:
        ha.close()


def missing_references(storage: Storage, ha: str | HAStore = EMBEDDED) -> dict[str, set[str]]:
    """Invariant (a): every retained checkpoint's and savepoint's files are present
    (same size as the metadata says). `ha`: the HA store, or its URI."""
    sizes = {info.key: info.size for info in storage.list()}
    if isinstance(ha, str):
        with open_ha(storage, ha) as store:
            retained = store.read().retained
    else:
        retained = ha.read().retained
    holders = [p.metadata for p in retained]
    holders += [k for k in sizes if layout.parse(k).kind is Kind.SAVEPOINT_METADATA]
    problems: dict[str, set[str]] = {}
    for metadata_key in holders:
        if metadata_key not in sizes:
            problems[metadata_key] = {metadata_key}
            continue
        meta = read_metadata(storage, metadata_key)
        bad = {
            key for key, f in referenced_keys(meta, metadata_key).items()
            if sizes.get(key) != f.size
        }
        if bad:
            problems[metadata_key] = bad
    return problems


def plan_kill(
    rng: random.Random, latest: int, index: int, kills: int, finished: bool = False
) -> Kill:
    """Where to kill next, given the newest completed checkpoint the test has seen. The
    last kills land in the job-end cleanup; the others anywhere before it. Once the job
    has finished, a driver's job end only confirms it (about 25 ms on a local disk), so
    the kill comes sooner: a later one would miss most times and use up the runs."""
    if index >= kills - 2:
        return Kill("end", 1, rng.uniform(0.0, 0.01 if finished else 0.15))
    ahead = range(latest + 1, BATCHES + 1)
    choices = list(ANYTIME)
    if ahead:
        choices += list(PER_BATCH) * 2
    if any(b % drv.ABORT_EVERY == drv.ABORT_AT for b in ahead):
        choices += ["abort"] * 2
    if any(b % drv.SAVEPOINT_EVERY == 0 for b in ahead):
        choices.append("savepoint")
    phase = rng.choice(choices)
    if phase == "timer":
        return Kill(phase, 1, rng.uniform(0.2, 1.0))  # from process start, no marker
    delay = PER_BATCH.get(phase) or ANYTIME.get(phase) or 0.02
    occurrence = rng.randint(1, 2) if phase in PER_BATCH else 1
    return Kill(phase, occurrence, rng.uniform(0.0, delay))


def run_job(
    job_uri: str,
    storage: Storage,
    work: Path,
    kills: int,
    seed: int,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    ha_uri: str = EMBEDDED,
) -> Outcome:
    """Run the driver until it finished the job after `kills` SIGKILLs; check invariant
    (a) after each kill."""
    rng = random.Random(seed)
    out = Outcome()
    latest = 0
    done = False
    while not done or sum(out.kills.values()) < kills:
        assert out.runs < 2 * kills + 10, f"seed {SEED}: too many runs"
        plan = plan_kill(rng, latest, sum(out.kills.values()), kills, done) if (
            sum(out.kills.values()) < kills
        ) else None
        # Half the restarts get a fresh local disk (executor lost), half keep it.
        local = work / f"local-{out.runs if rng.random() < 0.5 else 0}"
        err_path = work / f"stderr-{out.runs}.txt"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-u", str(DRIVER), job_uri, str(local),
                 "--batches", str(BATCHES), "--seed", str(seed), "--ha", ha_uri, *extra],
                stdout=subprocess.PIPE, stderr=err, text=True,
                env={**os.environ, "PYTHONPATH": python_path([ROOT]), **(env or {})},
            )
        out.runs += 1
        killed_at: str | None = None
        timer: threading.Timer | None = None
        if plan is not None and plan.phase == "timer":
            timer = threading.Timer(plan.delay, os.kill, (proc.pid, signal.SIGKILL))
            timer.start()
            killed_at = "timer"
        seen: Counter[str] = Counter()
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            # A kill can cut the last line short ("PHASE" alone): only whole lines count.
            if not line.endswith("\n") or len(words) < 2 or words[0] != "PHASE":
                continue
            name = words[1]
            seen[name] += 1
            if name in ("started", "completed"):
                latest = int(words[-1])
            if name == "done":
                done = True
            if plan is None or killed_at:
                continue
            if plan.phase == name and seen[name] == plan.occurrence:
                time.sleep(plan.delay)
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = name
        rc = proc.wait()
        if timer is not None:
            timer.cancel()
        if killed_at and rc == -signal.SIGKILL:
            done = False  # killed after printing "done" still counts as a kill
            out.kills[killed_at] += 1
            problems = missing_references(storage, ha_uri)
            assert not problems, (
                f"seed {SEED}: after a kill at {killed_at!r} referenced files are missing: "
                f"{problems}"
            )
            continue
        assert rc == 0 or (rc == 3 and not done), (
            f"seed {SEED}: driver exited {rc}:\n{err_path.read_text()[-3000:]}"
        )
    return out


def check_final_state(storage: Storage, work: Path, seed: int, ha_uri: str = EMBEDDED) -> None:
    with open_ha(storage, ha_uri) as ha:
        _check_final_state(storage, work, seed, ha, embedded=ha_uri == EMBEDDED)


def _check_final_state(
    storage: Storage, work: Path, seed: int, ha: HAStore, embedded: bool
) -> None:
    state = ha.read()
    # Job ended, keep-latest: exactly the newest checkpoint is retained, entry is clean.
    assert [p.checkpoint_id for p in state.retained] == [BATCHES], f"seed {SEED}"
    result = read_result(storage)
    assert result is not None and result.state == "clean", f"seed {SEED}: {result}"

    # (a) nothing referenced is missing; the retained checkpoint verifies byte for byte.
    assert not missing_references(storage, ha), f"seed {SEED}"
    files = listing(storage)
    savepoints = sorted(k for k in files if layout.parse(k).kind is Kind.SAVEPOINT_METADATA)
    for key in [state.retained[0].metadata, *savepoints]:
        report = verify(locate(storage, key.rsplit("/", 1)[0], ha=ha))
        assert report.ok, f"seed {SEED}: {key}: {report.problems}"

    # (b) no orphan: the listing is exactly what is referenced, plus the HA pointer
    # documents and the job result entry.
    referenced = referenced_by_job(open_job(storage, ha, job_id=drv.JOB_ID))
    # (With ZooKeeper the pointers live there: an ``_ha/`` document would be an orphan.)
    ha_docs = {k for k in files if HA_DOC.match(k)} if embedded else set()
    expected = referenced | ha_docs | {"_job/result.json", OWNER_KEY}
    assert files - expected == set(), f"seed {SEED}: orphans left: {sorted(files - expected)}"
    assert expected - files == set(), f"seed {SEED}: missing: {sorted(expected - files)}"

    # (c) exact results: the final state and each savepoint's equal the reference.
    meta = read_metadata(storage, state.retained[0].metadata)
    got = drv.read_state(storage, work / "read-final", state.retained[0].metadata, meta)
    assert got == drv.reference(seed, BATCHES), f"seed {SEED}: final state differs"
    for key in savepoints:
        sp = read_metadata(storage, key)
        b = int(sp.source_position["batch_id"])
        got = drv.read_state(storage, work / f"read-{sp.savepoint_name}", key, sp)
        assert got == drv.reference(seed, b), f"seed {SEED}: savepoint {key} differs"


def report(name: str, out: Outcome) -> None:
    print(f"[{name}] seed={SEED} runs={out.runs} kills={sum(out.kills.values())} "
          f"by phase={dict(sorted(out.kills.items()))}")


def test_kill_9_on_local_storage(tmp_path: Path) -> None:
    print(f"crash suite seed: {SEED} (STATEHOLD_CRASH_SEED={SEED} to replay)")
    job = tmp_path / "job"
    storage = open_storage(str(job))
    out = run_job(str(job), storage, tmp_path, kills=14, seed=SEED)
    report("local", out)
    assert sum(out.kills.values()) == 14
    check_final_state(storage, tmp_path, SEED)


def test_kill_9_on_s3(tmp_path: Path, s3_server: S3Server) -> None:
    print(f"crash suite seed: {SEED} (STATEHOLD_CRASH_SEED={SEED} to replay)")
    uri = f"s3://{s3_server.bucket}/crash-{os.getpid()}-{SEED}"
    storage = open_storage(uri, **s3_server.options)
    out = run_job(uri, storage, tmp_path, kills=12, seed=SEED + 1, env=s3_server.env)
    report("s3", out)
    assert sum(out.kills.values()) == 12
    check_final_state(storage, tmp_path, SEED + 1)


def test_kill_9_on_s3_with_zookeeper(
    tmp_path: Path,
    s3_server: S3Server,
    zk_server: ZooKeeperServer,
) -> None:
    """The cluster-like configuration: state on S3 (moto), pointers and epoch in a real
    ZooKeeper. The same kills and the same listing-based checks as above."""
    print(f"crash suite seed: {SEED} (STATEHOLD_CRASH_SEED={SEED} to replay)")
    name = f"crash-zk-{os.getpid()}-{SEED}"
    uri = f"s3://{s3_server.bucket}/{name}"
    ha_uri = f"zookeeper://{zk_server.hosts}/{name}"
    storage = open_storage(uri, **s3_server.options)
    out = run_job(
        uri, storage, tmp_path, kills=9, seed=SEED + 3, env=s3_server.env, ha_uri=ha_uri
    )
    report("s3+zookeeper", out)
    assert sum(out.kills.values()) == 9
    # The pointers really are in ZooKeeper: nothing under _ha/ on the storage.
    assert not any(HA_DOC.match(k) for k in listing(storage)), f"seed {SEED}"
    check_final_state(storage, tmp_path, SEED + 3, ha_uri)


def test_kill_9_while_30_percent_of_deletes_fail(tmp_path: Path) -> None:
    """The cleaner is retrying failed deletes when the driver dies; nothing is lost and
    the final run still leaves no orphan."""
    print(f"crash suite seed: {SEED} (STATEHOLD_CRASH_SEED={SEED} to replay)")
    job = tmp_path / "job"
    storage = open_storage(str(job))
    out = run_job(
        str(job), storage, tmp_path, kills=8, seed=SEED + 2,
        extra=("--delete-fail-rate", "0.3", "--fault-seed", str(SEED)),
    )
    report("local+faults", out)
    assert sum(out.kills.values()) == 8
    check_final_state(storage, tmp_path, SEED + 2)


def test_a_lagging_abort_delete_never_removes_the_retried_checkpoint(storage: Storage) -> None:
    """Batch 3 fails, is aborted and replayed as checkpoint 3 again, while the cleaner is
    slow: the abort's discard must not take the replay's ``chk-3/_metadata`` with it."""
    import threading as th

    from statehold.checkpoint.coordinator import CheckpointCoordinator
    from tests.support.fault_injection_storage import FaultyStorage
    from tests.support.simulated_tasks import RANGES, SimulatedTask

    go = th.Event()
    go.set()

    def slow_deletes(method: str, kind: str) -> None:
        if kind == "delete":
            go.wait(30)

    st = FaultyStorage(storage, hook=slow_deletes)  # type: ignore[arg-type]
    coord = CheckpointCoordinator.start(
        st, EmbeddedHAStore(st), job_id="job-1", max_parallelism=8, retain=2
    )
    tasks = [SimulatedTask(st, r, random.Random(1)) for r in RANGES]
    for n in (1, 2):
        coord.begin(n)
        for t in tasks:
            coord.acknowledge(n, "agg", t.snapshot(coord.epoch, n))
        coord.complete(n)
    assert coord.wait_reconciled(30)
    go.clear()  # from here, deletes lag behind
    coord.begin(3)
    coord.acknowledge(3, "agg", tasks[0].snapshot(coord.epoch, 3))
    coord.abort(3, "task failed")
    tasks = [t.restore(coord) for t in tasks]
    coord.begin(3)
    for t in tasks:
        coord.acknowledge(3, "agg", t.snapshot(coord.epoch, 3))
    coord.complete(3)
    go.set()
    assert coord.wait_reconciled(30)
    coord.close()
    assert [p.checkpoint_id for p in coord.ha.read().retained] == [2, 3]
    assert not missing_references(storage)
