"""Format upgrades: job directories written by earlier versions (tests/fixtures/<version>/,
made by tests/support/make_fixtures.py and never rewritten) are read, resumed and
garbage-collected by the current code without losing a referenced file; a document that
declares a newer format version than this code reads is refused with one line, and
nothing is deleted because of it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from statehold import tools
from statehold.cleanup.gc import gc
from statehold.cli import app
from statehold.errors import StateholdError
from statehold.format import layout, signed
from statehold.format import metadata as metadata_format
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.ha import embedded
from statehold.job import history, owner
from statehold.job.directory import open_job, read_owner
from statehold.storage import LocalStorage
from tests.support import make_fixtures
from tests.support.simulated_tasks import run_checkpoint

runner = CliRunner()
FIXTURES = sorted(
    p
    for p in make_fixtures.FIXTURES.iterdir()
    if not p.name.startswith(".") and (p / make_fixtures.MANIFEST).is_file()
)
#: A format version no statehold has written yet.
FUTURE = 10**6


@dataclass
class Copy:
    """A fixture copied to a temporary directory (the committed one is never touched)."""

    root: Path
    storage: LocalStorage
    manifest: dict[str, Any]

    def listing(self) -> dict[str, int]:
        return {info.key: info.size for info in self.storage.list()}


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name)
def fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Copy:
    source: Path = request.param
    root = tmp_path / "job"
    shutil.copytree(source / make_fixtures.JOB_DIR, root)
    manifest = json.loads((source / make_fixtures.MANIFEST).read_text())
    return Copy(root, LocalStorage(root), manifest)


def one_line_error(result: Any) -> str:
    """The CLI's refusal: exit 1, one line on stderr, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statehold: error: "), result.stderr
    return lines[0]


def test_the_current_formats_have_a_fixture() -> None:
    """A format version bump comes with a new fixture (python -m tests.support.make_fixtures),
    so the next version is tested against what this one writes."""
    current = {
        metadata_format.FORMAT_NAME: metadata_format.FORMAT_VERSION,
        embedded.FORMAT_NAME: embedded.FORMAT_VERSION,
        owner.OWNER_FORMAT: owner.OWNER_VERSION,
        history.FORMAT: history.VERSION,
    }
    written = [json.loads((p / make_fixtures.MANIFEST).read_text())["formats"] for p in FIXTURES]
    assert current in written


def test_the_fixture_is_as_written(fixture: Copy) -> None:
    assert fixture.listing() == fixture.manifest["files"]
    assert set(fixture.manifest["referenced"]) <= set(fixture.manifest["files"])


def test_the_fixture_reads(fixture: Copy) -> None:
    m = fixture.manifest
    listing = tools.list_checkpoints(str(fixture.root))
    assert listing.problems == []
    assert listing.ha_epoch == m["epoch"]
    assert [f"{c.path}/_metadata" for c in listing.checkpoints if c.retained] == m["retained"]
    assert [f"{s.path}/_metadata" for s in listing.savepoints] == m["savepoints"]
    assert all(c.error is None for c in [*listing.checkpoints, *listing.savepoints])
    named: set[str] = set()
    for key in [*m["retained"], *m["savepoints"]]:
        location = f"{fixture.root}/{_dir(key)}"
        inspection = tools.inspect(location)
        assert inspection.job_id == m["job_id"] and inspection.file_count > 0
        # a job's key hash was recorded from version 3; before, every job's was BLAKE2b
        older = m["formats"][metadata_format.FORMAT_NAME] < 3
        assert inspection.key_hash == ("blake2b-64" if older else "xxhash64")
        named |= {f.path for f in inspection.files} | {key}
        report = tools.verify(location)
        assert report.ok, report.problems
        assert report.files_checked == inspection.file_count
    assert named == set(m["referenced"])
    record = read_owner(fixture.storage)
    assert record is not None and record.job_id == m["job_id"] and record.ha == "embedded"
    records = history.read_history(fixture.storage, limit=None)
    assert len(records) == len([k for k in m["files"] if history.is_history_record(k)]) > 0
    assert {r.outcome for r in records} == {"completed", "aborted"}


def test_the_fixture_resumes(fixture: Copy) -> None:
    m = fixture.manifest
    coord = make_fixtures.start(fixture.storage)
    try:
        assert coord.epoch == m["epoch"] + 1
        assert [key for key, _ in coord.retained()] == m["retained"]
        tasks = make_fixtures.tasks_of(fixture.storage, coord, seed=7)
        latest = coord.latest()
        assert latest is not None
        following = latest[1].checkpoint_id + 1
        run_checkpoint(coord, tasks, following)
        coord.start_reconcile()
        assert coord.wait_reconciled(60)
        retained = [key for key, _ in coord.retained()]
    finally:
        coord.close()
    assert retained[-1] == layout.checkpoint_metadata_key(following)
    # the new checkpoint keeps the job's key hash, whichever version wrote the job
    written = read_metadata(fixture.storage, retained[-1]).key_hash
    assert written == read_metadata(fixture.storage, m["retained"][-1]).key_hash
    present = set(fixture.listing())
    for key in [*retained, *m["savepoints"]]:
        assert key in present
        assert set(referenced_keys(read_metadata(fixture.storage, key), key)) <= present, key
        report = tools.verify(f"{fixture.root}/{_dir(key)}")
        assert report.ok, report.problems


def test_gc_of_the_fixture_deletes_nothing(fixture: Copy) -> None:
    before = fixture.listing()
    with open_job(str(fixture.root)) as job:
        report = gc(job)
    assert report.deleted == 0 and report.quarantined == {}
    assert fixture.listing() == before
    cli = runner.invoke(app, ["gc", str(fixture.root), "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["deleted"] == 0
    assert fixture.listing() == before
    assert set(fixture.manifest["referenced"]) <= set(before)


def test_dispose_of_the_savepoint_deletes_it(fixture: Copy) -> None:
    """What the refusals below are measured against: on the fixture as written, dispose of
    its savepoint deletes the savepoint's directory and nothing else."""
    before = fixture.listing()
    savepoint = _dir(fixture.manifest["savepoints"][0])
    cli = runner.invoke(app, ["dispose", f"{fixture.root}/{savepoint}"])
    assert cli.exit_code == 0, cli.output
    gone = set(before) - set(fixture.listing())
    assert gone and all(k.startswith(savepoint + "/") for k in gone)


def _dir(metadata_key: str) -> str:
    return metadata_key.rsplit("/", 1)[0]


# -- a document of a newer format version ---------------------------------------------------
def _newest_history_record(copy: Copy) -> str:
    return sorted(k for k in copy.manifest["files"] if history.is_history_record(k))[-1]


def _head_pointer(copy: Copy) -> str:
    return max(k for k in copy.manifest["files"] if k.startswith(layout.HA_DIR + "/"))


#: Which document, its reader, and who refuses it. `open`: every tool and driver, which
#: open the job directory (owner record) and read its HA store; `holder`: a retained
#: checkpoint's or savepoint's `_metadata`, which gc quarantines (sparing every data file:
#: what a newer format names is unknown) and dispose refuses, forced or not; the history
#: is for people: gc and dispose read none of it.
NEWER: dict[str, tuple[Any, Any, str]] = {
    "newest-metadata": (
        lambda c: c.manifest["retained"][-1],
        lambda storage, key: metadata_format.decode(storage.read(key), key),
        "holder",
    ),
    "savepoint-metadata": (
        lambda c: c.manifest["savepoints"][0],
        lambda storage, key: metadata_format.decode(storage.read(key), key),
        "holder",
    ),
    "ha-pointer": (
        _head_pointer,
        lambda storage, key: embedded.decode_document(storage.read(key), key),
        "open",
    ),
    "owner": (
        lambda c: owner.OWNER_KEY,
        lambda storage, key: read_owner(storage),
        "open",
    ),
    "history": (
        _newest_history_record,
        lambda storage, key: history.decode(storage.read(key), key),
        "none",
    ),
}


def newer(data: bytes, *, restructured: bool = False) -> bytes:
    """The document declaring version FUTURE, re-signed as statehold signs it; with
    `restructured`, its files are where this version does not look for them."""
    doc = json.loads(data)
    doc["version"] = FUTURE
    if restructured:
        doc["operators_v3"] = doc.pop("operators")
    doc["checksum"] = signed.digest(doc)
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


@pytest.mark.parametrize("which", sorted(NEWER))
def test_a_newer_document_is_refused_and_nothing_is_deleted(which: str, fixture: Copy) -> None:
    key_of, read, refused_by = NEWER[which]
    key = key_of(fixture)
    fixture.storage.write(key, newer(fixture.storage.read(key)))
    with pytest.raises(StateholdError) as refused:
        read(fixture.storage, key)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 1000
    assert str(FUTURE) in message and "upgrade statehold" in message

    before = fixture.listing()
    gc_run = runner.invoke(app, ["gc", str(fixture.root)])
    if refused_by == "open":
        assert "upgrade statehold" in one_line_error(gc_run)
    else:
        assert gc_run.exit_code == 0, gc_run.output
        assert ("upgrade statehold" in gc_run.stdout) == (refused_by == "holder")
    assert fixture.listing() == before

    savepoint = _dir(fixture.manifest["savepoints"][0])
    for args in (["dispose", f"{fixture.root}/{savepoint}"],
                 ["dispose", f"{fixture.root}/{savepoint}", "--force"],
                 ["dispose", str(fixture.root), "--force"]):
        if refused_by == "none":
            break
        assert "upgrade statehold" in one_line_error(runner.invoke(app, args)), args
        assert fixture.listing() == before, args
    if refused_by == "none":  # the history is no holder: the savepoint goes as ever
        dispose_run = runner.invoke(app, ["dispose", f"{fixture.root}/{savepoint}"])
        assert dispose_run.exit_code == 0, dispose_run.output
        after = fixture.listing()
        assert key in after
        assert all(k.startswith(savepoint + "/") for k in set(before) - set(after))


@pytest.mark.parametrize("which", ["newest-metadata", "ha-pointer", "owner"])
def test_a_newer_document_stops_a_new_attempt(which: str, fixture: Copy) -> None:
    key_of, _read, _refused_by = NEWER[which]
    key = key_of(fixture)
    fixture.storage.write(key, newer(fixture.storage.read(key)))
    before = fixture.listing()
    with pytest.raises(StateholdError) as refused:
        make_fixtures.start(fixture.storage)
    message = str(refused.value)
    assert "\n" not in message and "upgrade statehold" in message
    assert set(before) <= set(fixture.listing())  # a claimed epoch at most; nothing deleted


@pytest.mark.parametrize("which", ["newest-metadata", "savepoint-metadata"])
def test_files_only_a_newer_document_names_are_kept(which: str, fixture: Copy) -> None:
    """A newer format may name its files where this version does not look: gc spares
    every data file rather than trust what it can read of such a document."""
    key = NEWER[which][0](fixture)
    only_it = set(referenced_keys(read_metadata(fixture.storage, key), key))
    for other in {*fixture.manifest["retained"], *fixture.manifest["savepoints"]} - {key}:
        only_it -= set(referenced_keys(read_metadata(fixture.storage, other), other))
    assert only_it  # the fixture has files only this document names
    fixture.storage.write(key, newer(fixture.storage.read(key), restructured=True))
    before = fixture.listing()
    gc_run = runner.invoke(app, ["gc", str(fixture.root)])
    assert gc_run.exit_code == 0, gc_run.output
    assert fixture.listing() == before
