"""What an operator can do to a job directory with the `statehold` command, and what a
crafted or damaged job directory can make it do: nothing outside the deletion policy.

Black-box through the CLI (typer's CliRunner on `statehold.cli.app`, or a real
``python -m statehold.cli`` process where a traceback or a stack overflow would only show
there) and the public Python API. Every test proves its claim by LISTING THE STORAGE
before and after: key -> (size, sha256) of every file under the job directory (and of
any directory outside it that a link points to), so a deleted, added or rewritten file
fails it.

1. the HA store a job directory records (ZooKeeper): used by default, another refused;
   ``set-ha`` moves the job, and the next attempt restores the same checkpoint;
2. a document naming bookkeeping (``../_ha``, another savepoint, ``../_spark``);
3. dispose and gc beside a running attempt with a checkpoint in flight;
4. symlinks in the job directory;
5. crafted numbers and 100000-deep JSON;
6. a damaged savepoint (quarantined);
7. every command on what is not a (readable) job directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.cleanup.reconcile import referenced_by_job
from statehold.cli import app
from statehold.format import layout, signed
from statehold.format.layout import Kind, Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    OperatorState,
    StateFile,
    read_metadata,
    referenced_keys,
)
from statehold.ha.base import CheckpointPointer, HAState, HAStore
from statehold.ha.embedded import EmbeddedHAStore
from statehold.ha.zookeeper import ZooKeeperHAStore
from statehold.job.directory import OWNER_KEY, HAStoreMismatchError, open_job, read_owner
from statehold.storage import Storage, open_storage
from tests.support.job_dir_contents import bytes_checksum
from tests.support.jobs import MAX_PARALLELISM, RANGES, Task
from tests.support.zk import ZooKeeperServer

runner = CliRunner()

#: The running attempt rewrites its own lease (and its temp file) every ttl/4: the only
#: files a listing of a live job may differ in without anyone deleting anything.
_LEASE = re.compile(r"^_job/\.?lease-e\d+\.json")
#: A hang guard for one CLI command in a real process (a timeout, not a timed assertion:
#: a crafted number that made it loop would never finish).
HANG_GUARD = 120.0

Snap = dict[str, tuple[int, str]]


# -- listing ----------------------------------------------------------------------------
def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snap(storage: Storage) -> Snap:
    """key -> (size, sha256) of every file under the job directory; a symlink (local
    storage lists it, never follows it) as (its own size, 'link -> target')."""
    out: Snap = {}
    for info in storage.list():
        if info.symlink:
            target = os.readlink(Path(storage.root, info.key))  # type: ignore[attr-defined]
            out[info.key] = (info.size, f"link -> {target}")
        else:
            out[info.key] = (info.size, sha(storage.read(info.key)))
    return out


def tree(top: Path) -> Snap:
    """The same for a local directory read with the OS, links not followed (a directory
    that is not there lists as empty)."""
    out: Snap = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(Path(dirpath, d)))]:
            path = Path(dirpath, name)
            st = os.lstat(path)
            digest = f"link -> {os.readlink(path)}" if path.is_symlink() else sha(
                path.read_bytes())
            out[os.path.relpath(path, top)] = (st.st_size, digest)
    return out


def stable(s: Snap) -> Snap:
    return {k: v for k, v in s.items() if not _LEASE.match(k)}


def gone(before: Snap, after: Snap) -> set[str]:
    return set(before) - set(after)


def changed(before: Snap, after: Snap) -> set[str]:
    return {k for k in before.keys() & after.keys() if before[k] != after[k]}


def ha_state(store: HAStore) -> tuple[int, tuple[CheckpointPointer, ...]]:
    state = store.read()
    return state.epoch, state.retained


# -- the command line --------------------------------------------------------------------
def cli(*args: str) -> Result:
    """One command in this process. An exception that escaped the command (a traceback
    for a user) fails the test; a clean exit (SystemExit) is a result."""
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"statehold {' '.join(args)} raised instead of exiting:\n{tb}")
    return result


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return json.loads(result.stdout)


def one_error_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    """The one ``statehold: error:`` line a refusal prints on stderr."""
    code = result.exit_code if isinstance(result, Result) else result.returncode
    assert code == 1, (code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statehold: error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def refused(result: Result, *fragments: str) -> str:
    line = one_error_line(result)
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def real_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One command as its own process (``python -m statehold.cli``): what a person sees,
    including any traceback or crash; it must end (HANG_GUARD)."""
    proc = subprocess.run(
        [sys.executable, "-m", "statehold.cli", *args],
        capture_output=True, text=True, timeout=HANG_GUARD, env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


# -- jobs --------------------------------------------------------------------------------
@dataclass
class Where:
    """A place for job directories: local disk or the moto S3 server (then the CLI finds
    the server through AWS_* variables)."""

    base: str

    def job(self) -> tuple[str, str, Storage]:
        job_id = f"job-{uuid.uuid4().hex[:10]}"
        uri = f"{self.base}/{job_id}"
        return job_id, uri, open_storage(uri)


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> Where:
    if request.param == "local":
        return Where(str(tmp_path / "jobs"))
    server = request.getfixturevalue("s3_server")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return Where(f"s3://{server.bucket}/opsafety-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def local(tmp_path: Path) -> Where:
    return Where(str(tmp_path / "jobs"))


@dataclass
class Job:
    job_id: str
    uri: str
    storage: Storage
    coord: CheckpointCoordinator
    tasks: list[Task]

    def checkpoint(self, n: int) -> None:
        self.coord.begin(n)
        for task in self.tasks:
            self.coord.acknowledge(n, "agg", task.snapshot(self.coord.epoch, n))
        self.coord.complete(n, {"batch_id": n})
        assert self.coord.cleaner.wait_idle(60)

    def restart(self, ha: HAStore, **kwargs: Any) -> None:
        self.coord = start(self.storage, ha, self.job_id, **kwargs)

    def stop(self) -> None:
        assert self.coord.wait_reconciled(60)
        self.coord.close()


def start(storage: Storage, ha: HAStore, job_id: str, **kwargs: Any) -> CheckpointCoordinator:
    return CheckpointCoordinator.start(storage, ha, job_id=job_id,
                                       max_parallelism=MAX_PARALLELISM, retain=2, **kwargs)


def build(where: Where, ha: Callable[[Storage, str], HAStore] | None = None, *,
          checkpoints: int = 4, savepoint: tuple[int, str] | None = None,
          seed: int = 3, stop: bool = True) -> Job:
    """A job (directory name = job id, as every tool expects) with `checkpoints`
    completed checkpoints (2 retained) and optionally a savepoint taken after one."""
    job_id, uri, storage = where.job()
    store = ha(storage, job_id) if ha else EmbeddedHAStore(storage)
    rng = random.Random(seed)
    job = Job(job_id, uri, storage, start(storage, store, job_id),
              [Task(storage, r, rng) for r in RANGES])
    for n in range(1, checkpoints + 1):
        job.checkpoint(n)
        if savepoint is not None and n == savepoint[0]:
            job.coord.savepoint(savepoint[1])
    if stop:
        job.stop()
    return job


def retained_references(storage: Storage) -> set[str]:
    with open_job(storage) as job:
        return referenced_by_job(job)


def sign(doc: dict[str, Any]) -> bytes:
    """A raw document with a valid checksum, whatever its fields hold."""
    doc = {**doc, "checksum": ""}
    doc["checksum"] = signed.digest(doc)
    return json.dumps(doc, indent=1).encode()


def deep_json(depth: int = 100_000) -> bytes:
    return b"[" * depth + b"]" * depth


# == 1. the recorded HA store (ZooKeeper) =================================================
@pytest.mark.zookeeper
def test_zookeeper_job_uses_its_recorded_store_and_refuses_another(
    where: Where, zk_server: ZooKeeperServer
) -> None:
    zk_uri = f"zookeeper://{zk_server.hosts}/statehold-opsafety"

    def zk(_storage: Storage, job_id: str) -> HAStore:
        return ZooKeeperHAStore.from_uri(zk_uri, job_id)

    job = build(where, zk, checkpoints=4)
    job.coord.ha.close()
    storage, uri = job.storage, job.uri
    watch = ZooKeeperHAStore.from_uri(zk_uri, job.job_id)
    try:
        zk_before = ha_state(watch)
        assert [p.checkpoint_id for p in zk_before[1]] == [3, 4]
        assert not any(k.startswith("_ha/") for k in snap(storage))  # all of it in ZooKeeper
        # An orphan gc may delete: an old exclusive file no checkpoint references.
        orphan = layout.exclusive_key(zk_before[0], 1, "leftover")
        storage.write(orphan, b"left behind by a crash")
        before = snap(storage)

        # Another store named: refused with the right --ha, nothing deleted or written.
        for args in (["gc", uri, "--ha", "embedded"],
                     ["dispose", uri, "--force", "--ha", "embedded"],
                     ["dispose", f"{uri}/chk-3", "--force", "--ha", "embedded"]):
            refused(cli(*args), f"--ha {zk_uri}")
            assert snap(storage) == before, args
            assert ha_state(watch) == zk_before, args
        # A driver started with another store: refused before it writes anything.
        with pytest.raises(HAStoreMismatchError, match=re.escape(zk_uri)):
            start(storage, EmbeddedHAStore(storage), job.job_id)
        assert snap(storage) == before
        assert ha_state(watch) == zk_before

        # No --ha: the recorded store (ZooKeeper); only the orphan goes.
        report = cli_json("gc", uri)
        assert report["orphans"] == [orphan] and report["deleted"] == 1
        after = snap(storage)
        assert gone(before, after) == {orphan} and not changed(before, after)
        assert set(after) >= retained_references(storage)
        assert ha_state(watch) == zk_before

        # Move the stopped job to the embedded store.
        assert cli("set-ha", uri, "embedded").exit_code == 0
        moved = snap(storage)
        assert not gone(after, moved) and changed(after, moved) <= {OWNER_KEY}
        assert all(k.startswith("_ha/") or k == OWNER_KEY for k in set(moved) - set(after))
        owner = read_owner(storage)
        assert owner is not None and owner.ha == "embedded"
        fenced_epoch, zk_retained = ha_state(watch)
        assert fenced_epoch == zk_before[0] + 1 and zk_retained == zk_before[1]
        assert ha_state(EmbeddedHAStore(storage)) == (fenced_epoch, zk_before[1])
        # ...and now ZooKeeper is the other store.
        refused(cli("gc", uri, "--ha", zk_uri), "--ha embedded")
        assert snap(storage) == moved

        # The next attempt, on the embedded store, restores the same newest checkpoint.
        job.restart(EmbeddedHAStore(storage))
        assert job.coord.epoch > fenced_epoch
        latest = job.coord.latest()
        assert latest is not None
        assert (latest[0], latest[1].checksum) == (zk_before[1][-1].metadata,
                                                   zk_before[1][-1].checksum)
        job.checkpoint(5)
        job.stop()
        assert ha_state(watch)[0] == fenced_epoch  # nothing went to ZooKeeper any more
        assert cli_json("verify", uri)["ok"]
    finally:
        watch.close()


# == 2. a document naming bookkeeping ======================================================
def test_document_naming_bookkeeping_deletes_none_of_it(where: Where) -> None:
    job = build(where, checkpoints=4, savepoint=(2, "keep"))
    storage, uri = job.storage, job.uri
    storage.write("_spark/offsets/0", b'v1\n{"batchWatermarkMs":0}\n')
    head = max(k for k in snap(storage) if k.startswith("_ha/"))
    victims = [head, "savepoints/keep/_metadata", "_spark/offsets/0"]
    key = layout.checkpoint_metadata_key(9)

    def exclusive(target: str) -> StateFile:
        data = storage.read(target)
        return StateFile(path=layout.relativize(key, target), scope=Scope.EXCLUSIVE,
                         size=len(data), checksum=bytes_checksum(data))

    files = [exclusive(v) for v in victims]
    assert [f.path for f in files] == [f"../{head}", "../savepoints/keep/_metadata",
                                       "../_spark/offsets/0"]
    crafted = CheckpointMetadata(
        job_id=job.job_id, checkpoint_id=9, epoch=job.coord.epoch,
        max_parallelism=MAX_PARALLELISM,
        operators=[OperatorState(operator="agg", ranges=[KeyGroupState(
            key_groups=KeyGroupRange(start=0, end=MAX_PARALLELISM - 1), files=files)])])
    document = signed.encode(crafted)  # metadata.encode refuses these paths
    storage.write(key, document)
    ha_before = ha_state(EmbeddedHAStore(storage))
    before = snap(storage)

    refused(cli("verify", f"{uri}/chk-9"), "chk-9/_metadata", "may only name files")
    refused(cli("dispose", f"{uri}/chk-9"), "--force")
    assert snap(storage) == before

    # dispose --force removes the document, and nothing it names.
    cli_json("dispose", f"{uri}/chk-9", "--force")
    after = snap(storage)
    assert gone(before, after) == {key} and not changed(before, after)
    assert set(after) == set(before) - {key}
    assert ha_state(EmbeddedHAStore(storage)) == ha_before

    # gc of the same: what it names is never deleted; the document itself, a chk-N/
    # after the newest retained, is spared by an outside gc too (the next attempt writes
    # that very key; the attempt that replaces it or the job's end removes it).
    storage.write(key, document)
    before = snap(storage)
    report = cli_json("gc", uri)
    after = snap(storage)
    assert report["orphans"] == [] and key in report["protected"]
    assert after == before
    assert all(after[v] == before[v] for v in victims)
    assert ha_state(EmbeddedHAStore(storage)) == ha_before
    assert cli_json("verify", f"{uri}/savepoints/keep")["ok"]


# == 3. dispose and gc beside a running attempt =============================================
class HoldingHA(HAStore):
    """Any HA store whose publish of checkpoint `hold` waits to be released: then
    ``chk-N/_metadata`` is written and N is not yet published — still in flight."""

    def __init__(self, inner: HAStore, hold: int) -> None:
        self.inner, self.hold = inner, hold
        self.reached, self.release = threading.Event(), threading.Event()

    @property
    def uri(self) -> str | None:
        return getattr(self.inner, "uri", None)

    def read(self) -> HAState:
        return self.inner.read()

    def claim_epoch(self) -> HAState:
        return self.inner.claim_epoch()

    def publish(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        if retained and retained[-1].checkpoint_id == self.hold:
            self.reached.set()
            assert self.release.wait(120), "never released"
        return self.inner.publish(epoch, retained)

    def seed(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        return self.inner.seed(epoch, retained)

    def check_epoch(self, epoch: int) -> None:
        self.inner.check_epoch(epoch)

    def close(self) -> None:
        self.inner.close()


def test_dispose_and_gc_beside_a_checkpoint_in_flight(where: Where) -> None:
    n = 4
    holding: list[HoldingHA] = []

    def ha(storage: Storage, _job_id: str) -> HAStore:
        holding.append(HoldingHA(EmbeddedHAStore(storage), hold=n))
        return holding[0]

    job = build(where, ha, checkpoints=n - 1, stop=False)
    hold = holding[0]
    storage, uri, coord = job.storage, job.uri, job.coord
    assert coord.wait_reconciled(60)
    try:
        # Checkpoint N begun, every task's files uploaded, nothing completed.
        listed = set(snap(storage))
        coord.begin(n)
        for task in job.tasks:
            coord.acknowledge(n, "agg", task.snapshot(coord.epoch, n))
        before = stable(snap(storage))
        uploads = set(before) - listed
        assert uploads and all(layout.parse(k).checkpoint_id == n for k in uploads)

        refused(cli("dispose", f"{uri}/chk-{n}"), "no such")
        refused(cli("dispose", f"{uri}/chk-{n}", "--force"), "no such")
        report = cli_json("gc", uri)
        assert report["live_epoch"] == coord.epoch and uploads <= set(report["protected"])
        assert stable(snap(storage)) == before

        # complete(N) has written chk-N/_metadata and waits in the publish.
        completing: list[CheckpointMetadata] = []
        thread = threading.Thread(
            target=lambda: completing.append(coord.complete(n, {"batch_id": n})), daemon=True)
        thread.start()
        assert hold.reached.wait(60)
        key = layout.checkpoint_metadata_key(n)
        before = stable(snap(storage))
        assert key in before
        ha_before = ha_state(EmbeddedHAStore(storage))
        retained = [p.checkpoint_id for p in ha_before[1]]
        assert retained == [n - 2, n - 1]

        refused(cli("dispose", f"{uri}/chk-{n}"), "in flight")
        refused(cli("dispose", f"{uri}/chk-{n}", "--force"), "in flight")
        refused(cli("dispose", f"{uri}/chk-{retained[0]}", "--force"), "running attempt")
        refused(cli("dispose", f"{uri}/chk-{retained[-1]}", "--force"), "running attempt")
        refused(cli("dispose", uri, "--force"), "running")
        report = cli_json("gc", uri)
        assert {key, *uploads} <= set(report["protected"])
        assert stable(snap(storage)) == before
        assert ha_state(EmbeddedHAStore(storage)) == ha_before

        # Released: N completes, with every file it references present.
        hold.release.set()
        thread.join(60)
        assert completing and completing[0].checkpoint_id == n
        assert coord.cleaner.wait_idle(60)  # its subsume of checkpoint N-2 done
        assert [p.checkpoint_id for p in EmbeddedHAStore(storage).read().retained] == [
            n - 1, n]
        present = set(snap(storage))
        assert retained_references(storage) <= present
        assert set(referenced_keys(read_metadata(storage, key), key)) <= present
        assert uploads <= present
        assert cli_json("verify", uri)["ok"]
    finally:
        hold.release.set()
        coord.close()


# == 4. symlinks ===========================================================================
def test_symlinks_are_reported_and_never_followed(local: Where, tmp_path: Path) -> None:
    job = build(local, checkpoints=3, savepoint=(2, "sp"))
    storage, uri = job.storage, job.uri
    root = Path(storage.root)  # type: ignore[attr-defined]
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret").write_bytes(b"outside secret")
    (outside / "f").write_bytes(b"outside f")
    (outside / "sub" / "g").write_bytes(b"outside g")
    links = {
        "shared/evil": outside / "secret",  # a file link
        "shared/e1-c1-0123456789abcdef-evil": outside / "f",  # named like an orphan
        "exclusive/linked": outside / "sub",  # a directory link
        "chk-77": outside,  # a directory link named like a checkpoint
    }
    for key, target in links.items():
        os.symlink(target, root / key, target_is_directory=target.is_dir())
    orphan = layout.exclusive_key(job.coord.epoch, 1, "orphan")
    storage.write(orphan, b"an orphan gc deletes")
    outside_before, before = tree(outside), tree(root)
    assert {k for k, v in before.items() if v[1].startswith("link")} == set(links)

    result = cli("verify", uri, "--json")
    assert result.exit_code == 1
    problems = {p["path"]: p["problem"] for p in json.loads(result.stdout)["problems"]}
    assert set(problems) == set(links) and all("symlink" in p for p in problems.values())
    refused(cli("verify", uri), "symlink")
    # the checkpoint's document is looked up by its key (a listing may lag): the link
    # under it is refused by name, not followed
    refused(cli("dispose", f"{uri}/chk-77", "--force"), "symlink")
    assert tree(root) == before

    report = cli_json("gc", uri)
    assert set(links) <= set(report["foreign"]) and report["orphans"] == [orphan]
    after = tree(root)
    assert gone(before, after) == {orphan} and not changed(before, after)
    assert tree(outside) == outside_before
    assert retained_references(storage) <= set(after)

    # Even disposing of the whole job leaves what the links point to alone. (The embedded
    # HA store and the owner record stay, so the job's epochs never start again.)
    cli_json("dispose", uri, "--force")
    assert tree(outside) == outside_before
    assert not {
        k for k in tree(root) if k not in links and not k.startswith("_ha/") and k != OWNER_KEY
    }


# == 5. crafted numbers, deep JSON ===========================================================
@pytest.mark.parametrize("epoch", [10**9, 2**53 + 1, 10**30])
def test_crafted_epoch_is_handled_promptly(local: Where, tmp_path: Path, epoch: int) -> None:
    job = build(local, checkpoints=3, savepoint=(2, "sp"))
    storage, uri = job.storage, job.uri
    sp = json.loads(storage.read("savepoints/sp/_metadata"))
    storage.write("savepoints/sp/_metadata", sign({**sp, "epoch": epoch}))
    # chk-1 (subsumed, so not retained) again: the newest document, renumbered.
    chk = json.loads(storage.read(layout.checkpoint_metadata_key(3)))
    storage.write(layout.checkpoint_metadata_key(1), sign({**chk, "checkpoint_id": 1,
                                                           "epoch": epoch}))
    before = snap(storage)
    for target in (f"{uri}/savepoints/sp", f"{uri}/chk-1"):
        dest = tmp_path / f"export-{target.rsplit('/', 1)[-1]}"
        proc = real_cli("export", target, str(dest))
        if epoch <= signed.MAX_ID:
            # A plausible number: the export is a copy, its HA store seeded at the epoch
            # (not claimed up to it one by one).
            assert proc.returncode == 0, proc.stderr
            exported = open_storage(str(dest))
            assert EmbeddedHAStore(exported).read().epoch == epoch
            assert cli_json("verify", str(dest))["ok"]
        else:
            line = one_error_line(proc)
            assert "epoch" in line, line
            assert not dest.exists()
    assert snap(storage) == before


def test_deep_json_metadata_every_command_one_line(local: Where, tmp_path: Path) -> None:
    """The newest retained checkpoint's `_metadata` is 100000-deep nested JSON."""
    job = build(local, checkpoints=4, savepoint=(2, "sp"))
    storage, uri = job.storage, job.uri
    key = layout.checkpoint_metadata_key(4)
    storage.write(key, deep_json())
    before = snap(storage)
    dest, out = tmp_path / "dest", tmp_path / "state-out"
    must_refuse = [
        ["list", uri], ["inspect", uri], ["verify", uri], ["export", uri, str(dest)],
        ["diff", f"{uri}/chk-3", uri], ["inspect", f"{uri}/chk-4"],
        ["state", uri, "--out", str(out), "--format", "jsonl"],
    ]
    for args in must_refuse:
        line = one_error_line(real_cli(*args))
        assert "nested more than" in line and "chk-4/_metadata" in line, (args, line)
        assert snap(storage) == before, args
    # dispose of it (or of the whole job) without --force: refused on its own grounds.
    refused(cli("dispose", f"{uri}/chk-4"), "--force")
    refused(cli("dispose", uri), "--force")
    # gc, du and status do not need the document to answer: gc quarantines it (its
    # files and, since no path can be read from it, every data file are spared).
    for args in (["gc", uri], ["du", uri], ["status", uri], ["gc", uri, "--dry-run"]):
        proc = real_cli(*args, "--json")
        assert proc.returncode == 0 and proc.stderr.strip() == "", (args, proc.stderr)
        if args[0] == "gc":
            report = json.loads(proc.stdout)
            assert set(report["quarantined"]) == {key} and report["deleted"] == 0
        assert snap(storage) == before, args
    assert not dest.exists() and not out.exists()


# == 6. a damaged savepoint ==================================================================
def damage(data: bytes, how: str) -> bytes:
    if how == "value":  # still JSON: a letter of the job id
        i = data.index(b'"job_id": "') + len(b'"job_id": "')
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
    if how == "structure":  # no longer JSON
        return bytes([data[0] ^ 0x01]) + data[1:]
    return b""  # not one path left to read: every data file is spared


@pytest.mark.parametrize("how", ["value", "structure", "emptied"])
def test_damaged_savepoint_is_quarantined_and_spared(local: Where, how: str) -> None:
    job = build(local, checkpoints=4, savepoint=(2, "sp"))
    storage, uri = job.storage, job.uri
    sp = "savepoints/sp/_metadata"
    named = set(referenced_keys(read_metadata(storage, sp), sp))
    held = named | {k for k in snap(storage) if k.startswith("savepoints/sp/")}
    storage.write(sp, damage(storage.read(sp), how))
    before = snap(storage)

    # A new attempt starts, completes checkpoints past every one sharing files with the
    # savepoint, and reconciles: the savepoint's files stay.
    job.restart(EmbeddedHAStore(storage))
    for n in range(5, 10):
        job.checkpoint(n)
    assert job.coord.wait_reconciled(60)
    job.coord.start_reconcile()
    assert job.coord.wait_reconciled(60)
    assert job.coord.last_reconcile is not None
    assert set(job.coord.last_reconcile.quarantined) == {sp}
    job.stop()
    after = snap(storage)
    assert {k: after.get(k) for k in held} == {k: before[k] for k in held}

    report = cli_json("gc", uri)
    assert set(report["quarantined"]) == {sp}
    after = snap(storage)
    assert {k: after.get(k) for k in held} == {k: before[k] for k in held}
    assert retained_references(storage) <= set(after)

    result = cli("verify", uri, "--json")
    assert result.exit_code == 1
    problems = {p["path"]: p["problem"] for p in json.loads(result.stdout)["problems"]}
    assert list(problems) == [sp] and problems[sp].startswith("quarantined")

    refused(cli("dispose", f"{uri}/savepoints/sp"), "--force")
    assert snap(storage) == after
    cli_json("dispose", f"{uri}/savepoints/sp", "--force")
    disposed = snap(storage)
    assert gone(after, disposed) == {k for k in after if k.startswith("savepoints/sp/")}
    assert not changed(after, disposed)

    # What only the savepoint held is now an orphan, and gc deletes it; with nothing
    # readable in the damaged document, every data file was spared, and goes now too.
    cli_json("gc", uri)
    final = snap(storage)
    referenced = retained_references(storage)
    assert referenced <= set(final)
    # A savepoint names only its own copies (task-owned files aside): the dispose took
    # them all, so nothing it named is left for gc.
    assert all(k.startswith("savepoints/sp/") or k.startswith("taskowned/") for k in named)
    released = (named & set(disposed)) - referenced
    assert not released
    if how == "emptied":
        data = {k for k in disposed if layout.parse(k).kind in (Kind.SHARED, Kind.EXCLUSIVE)}
        assert data - referenced, "every data file was spared until the dispose"
        assert gone(disposed, final) == data - referenced
    else:
        assert gone(disposed, final) == released
    assert not changed(disposed, final)


# == 7. what is not a (readable) job directory ===============================================
def make_dir(kind: str, path: Path) -> None:
    files: dict[str, bytes] = {}
    if kind == "foreign":
        files = {
            "notes.txt": b"not statehold's",
            "data/report.csv": b"a,b\n1,2\n",
            "shared/e1-c2-0123456789abcdef": b"named like a data file",
            "exclusive/e0-c0-x": b"named like a data file",
            "taskowned/t1/x": b"x",
            "_spark/offsets/0": b"v1",
            "savepoints/readme.txt": b"no savepoint",
            "chk-x/readme": b"no checkpoint",
        }
    elif kind == "corrupt-ha":
        files = {
            "_ha/00000000000000000003.json": os.urandom(64),
            "shared/e1-c1-0123456789abcdef": b"data",
            "chk-1/_metadata": b"\x00garbage",
        }
    elif kind == "deep-ha":
        files = {"_ha/00000000000000000001.json": deep_json(),
                 "shared/e1-c1-0123456789abcdef": b"data"}
    elif kind == "corrupt-owner":
        files = {OWNER_KEY: b'{"format": "statehold.job-owner", "ha": "emb',
                 "shared/e1-c1-0123456789abcdef": b"data",
                 "chk-1/_metadata": b"{}"}
    if kind != "missing":
        path.mkdir(parents=True)
    for key, data in files.items():
        (path / key).parent.mkdir(parents=True, exist_ok=True)
        (path / key).write_bytes(data)


def commands(target: str, dest: str, out: str, new_ha: str = "embedded") -> list[list[str]]:
    return [
        ["list", target], ["inspect", target], ["verify", target], ["du", target],
        ["export", target, dest], ["diff", target, target], ["status", target],
        ["dispose", target], ["dispose", target, "--force"],
        ["gc", target, "--dry-run"], ["gc", target],
        ["set-ha", target, new_ha],
        ["state", target, "--out", out, "--format", "jsonl"],
    ]


@pytest.mark.parametrize("ha", [None, "embedded"], ids=["recorded", "ha-embedded"])
@pytest.mark.parametrize(
    "kind", ["missing", "empty", "foreign", "corrupt-ha", "deep-ha", "corrupt-owner"])
def test_every_command_refuses_what_is_not_a_job_directory(
    tmp_path: Path, kind: str, ha: str | None
) -> None:
    """Exit 1, one line, nothing deleted or written — also when an HA store is named
    (naming a store must not make any directory a job directory)."""
    failures: list[str] = []
    for i, args in enumerate(commands("T", "D", "O")):
        base = tmp_path / f"{i}"
        target, dest, out = base / "dir", base / "dest", base / "out"
        make_dir(kind, target)
        before = tree(target)
        argv = [{"T": str(target), "D": str(dest), "O": str(out)}.get(a, a) for a in args]
        if ha is not None:
            argv += ["--ha", ha]
        result = cli(*argv)
        lines = result.stderr.strip().splitlines()
        what = " ".join(args)
        if result.exit_code != 1:
            failures.append(f"{what}: exit {result.exit_code}: {result.stdout.strip()[:150]}")
        elif len(lines) != 1 or not lines[0].startswith("statehold: error: "):
            failures.append(f"{what}: stderr {result.stderr!r}")
        if (kind == "missing") != (not target.exists()):
            failures.append(f"{what}: the directory was {'made' if target.exists() else 'removed'}")
        elif tree(target) != before:
            lost = sorted(set(before) - set(tree(target)))
            failures.append(f"{what}: the directory changed (deleted: {lost})")
        if dest.exists() or out.exists():
            failures.append(f"{what}: wrote {dest if dest.exists() else out}")
    assert not failures, "\n".join(failures)


def test_deep_ha_document_every_command_real_process(tmp_path: Path) -> None:
    """The same for a 100000-deep `_ha/` document, as real processes (a stack overflow
    or a traceback would show only there)."""
    target = tmp_path / "job"
    make_dir("deep-ha", target)
    before = tree(target)
    # (set-ha to another store than the one in use: to the one in use it refuses first)
    for args in commands(str(target), str(tmp_path / "dest"), str(tmp_path / "out"),
                         new_ha="zookeeper://127.0.0.1:1/nowhere"):
        line = one_error_line(real_cli(*args))
        assert "nested more than" in line, (args, line)
        assert tree(target) == before, args

