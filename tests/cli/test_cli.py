"""The `statehold` command line: every command's success, --json shape, and bad input
(not a job directory, corrupt/truncated metadata, '../' and absolute paths, a missing
file): a clear one-line message, a non-zero exit, nothing deleted."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from statehold.cli import app
from statehold.storage import Storage, open_storage
from tests.support.jobs import (
    Job,
    build_job,
    listing,
    refs,
    retained_keys,
    rewrite_with_valid_checksum,
)

runner = CliRunner()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


def run_json(*args: str, code: int = 0) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == code, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def assert_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statehold: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.fixture
def built(tmp_path: Path) -> Job:
    """The job of `job`, its attempt still running (a fresh lease) until a test stops it."""
    return build_job(open_storage(str(tmp_path / "job")))


@pytest.fixture
def job(built: Job, tmp_path: Path) -> tuple[Storage, str]:
    return built.storage, str(tmp_path / "job")


# -- success and --json shape ----------------------------------------------------------
def test_list(job: tuple[Storage, str]) -> None:
    storage, path = job
    doc = run_json("list", path)
    assert [(c["checkpoint_id"], c["retained"]) for c in doc["checkpoints"]] == [
        (3, True), (4, True), (5, True), (99, False)]
    assert doc["savepoints"][0]["path"] == "savepoints/sp"
    assert doc["ha_epoch"] == 1 and doc["problems"] == []
    human = run("list", path)
    assert human.exit_code == 0 and "NOT RETAINED" in human.stdout and "chk-99" in human.stdout


def test_inspect(job: tuple[Storage, str]) -> None:
    storage, path = job
    doc = run_json("inspect", path + "/chk-4")
    expected = refs(storage, "chk-4/_metadata")
    assert doc["checkpoint_id"] == 4 and doc["metadata_path"] == "chk-4/_metadata"
    assert {f["path"] for f in doc["files"]} == set(expected)
    f = doc["files"][0]
    assert set(f) >= {"path", "scope", "size", "checksum", "operator", "key_groups"}
    assert f["size"] == expected[f["path"]].size and f["checksum"].startswith("sha256:")
    assert run_json("inspect", path)["checkpoint_id"] == 5  # job dir: newest retained
    human = run("inspect", path + "/savepoints/sp")
    assert human.exit_code == 0 and "savepoint" in human.stdout


def test_verify_success_and_failure(job: tuple[Storage, str]) -> None:
    storage, path = job
    doc = run_json("verify", path)
    assert doc["ok"] and doc["files_checked"] == len(refs(storage, "chk-5/_metadata"))
    assert run("verify", path + "/chk-3").exit_code == 0
    victim, f = sorted(refs(storage, "chk-5/_metadata").items())[-1]
    storage.write(victim, bytes(f.size))
    doc = run_json("verify", path, code=1)
    assert not doc["ok"] and doc["problems"] == [
        {"path": victim, "problem": "checksum mismatch", "kind": None, "spark_bug": None}]
    assert_error(run("verify", path), "verify failed", victim, "checksum mismatch")


def test_diff(job: tuple[Storage, str]) -> None:
    storage, path = job
    a, b = refs(storage, "chk-3/_metadata"), refs(storage, "chk-5/_metadata")
    doc = run_json("diff", path + "/chk-3", path + "/chk-5")
    assert {e["path"] for e in doc["added"]} == set(b) - set(a)
    assert {e["path"] for e in doc["removed"]} == set(a) - set(b)
    assert doc["removed_bytes"] == sum(a[k].size for k in set(a) - set(b))
    assert run("diff", path + "/chk-3", path).exit_code == 0


def test_du(job: tuple[Storage, str]) -> None:
    storage, path = job
    doc = run_json("du", path)
    assert doc["total_bytes"] == sum(listing(storage).values())
    assert sum(c["attributed_bytes"] for c in doc["by_checkpoint"]) == doc["referenced_bytes"]
    assert {c["path"] for c in doc["by_checkpoint"]} == {"chk-3", "chk-4", "chk-5",
                                                         "savepoints/sp"}
    assert "chk-99/_metadata" in doc["unreferenced_sample"]
    assert run("du", path).exit_code == 0


def test_export_and_verify_the_copy(job: tuple[Storage, str], tmp_path: Path) -> None:
    storage, path = job
    dest = str(tmp_path / "exported")
    doc = run_json("export", path + "/chk-4", dest)
    assert doc["verified"] and doc["checkpoint_id"] == 4
    exported = open_storage(dest)
    assert retained_keys(exported) == ["chk-4/_metadata"]
    assert run_json("verify", dest)["ok"]
    assert run("export", path, str(tmp_path / "second")).exit_code == 0


def test_dispose(job: tuple[Storage, str], built: Job) -> None:
    storage, path = job
    before = listing(storage)
    # changed on purpose: while the attempt runs, a retained checkpoint is refused even
    # with --force, a chk-N after the newest retained may be in flight, and a whole job is
    # refused
    assert_error(run("dispose", path + "/chk-3"), "retained by the running attempt")
    assert_error(run("dispose", path + "/chk-3", "--force"), "retained by the running attempt")
    assert_error(run("dispose", path + "/chk-99"), "in flight")
    assert_error(run("dispose", path, "--force"), "is running")
    assert listing(storage) == before
    doc = run_json("dispose", path + "/savepoints/sp")
    assert doc["kind"] == "savepoint" and doc["deleted"]
    assert not any(k.startswith("savepoints/") for k in listing(storage))
    assert all(run_json("verify", path + "/" + k.rsplit("/", 1)[0])["ok"]
               for k in retained_keys(storage))
    built.coord.close()  # the attempt stops
    before = listing(storage)
    assert_error(run("dispose", path + "/chk-3"), "retained", "--force")
    assert listing(storage) == before
    assert run("dispose", path + "/chk-99").exit_code == 0
    assert not any(k.startswith("chk-99/") for k in listing(storage))
    doc = run_json("dispose", path + "/chk-3", "--force")
    assert doc["unpublished"] and retained_keys(storage) == ["chk-4/_metadata",
                                                             "chk-5/_metadata"]
    assert_error(run("dispose", path), "--force")
    assert run("dispose", path, "--force").exit_code == 0
    # changed on purpose: the embedded HA store (its epoch) and its owner record stay
    assert all(k.startswith("_ha/") or k == "_job/owner.json" for k in listing(storage))


# -- S3 through the environment --------------------------------------------------------
@pytest.mark.parametrize("direction", ["local-to-s3", "s3-to-local"])
def test_export_across_backends(direction: str, tmp_path: Path, s3_server: Any,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    s3_uri = f"s3://{s3_server.bucket}/cli-{direction}-{random.random()}"
    local_uri = str(tmp_path / "local")
    src, dst = (local_uri, s3_uri) if direction == "local-to-s3" else (s3_uri, local_uri)
    build_job(open_storage(src))
    doc = run_json("export", src + "/chk-5", dst)
    assert doc["verified"]
    assert run_json("verify", dst)["ok"]
    listed = run_json("list", dst)
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [5]
    assert run_json("list", src)["checkpoints"][-1]["checkpoint_id"] == 99


# -- bad input -------------------------------------------------------------------------
def commands(target: str, dest: str) -> list[list[str]]:
    return [
        ["list", target],
        ["inspect", target],
        ["verify", target],
        ["diff", target, target],
        ["du", target],
        ["export", target, dest],
        ["dispose", target, "--force"],
    ]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_not_a_job_directory(backend: str, tmp_path: Path, s3_server: Any,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "s3":
        for k, v in s3_server.env.items():
            monkeypatch.setenv(k, v)
        target = f"s3://{s3_server.bucket}/notajob-{random.random()}"
    else:
        target = str(tmp_path / "plain")
    storage = open_storage(target)
    storage.write("data/report.csv", b"a,b\n")
    dest = str(tmp_path / "dest")
    for args in commands(target, dest):
        assert_error(run(*args), "not a statehold job directory")
        doc = run_json(*args, code=1)
        assert doc["ok"] is False and "not a statehold job directory" in doc["error"]
        assert listing(storage) == {"data/report.csv": 4}
        assert not Path(dest).exists()
    assert_error(run("list", str(tmp_path / "nowhere")), "no such directory")


@pytest.mark.parametrize("damage", ["truncated", "parent-path", "absolute-path"])
def test_bad_metadata(job: tuple[Storage, str], built: Job, tmp_path: Path,
                      damage: str) -> None:
    storage, path = job
    key = "chk-5/_metadata"
    if damage == "truncated":
        storage.write(key, storage.read(key)[:-40])
        message = "not valid JSON"
    else:
        rewrite_with_valid_checksum(
            storage, key, "../../outside" if damage == "parent-path" else "/etc/passwd")
        message = "unsafe state file path"
    before = listing(storage)
    dest = str(tmp_path / "dest")
    cases: list[tuple[list[str], str]] = [
        (["list", path], message),
        (["inspect", path], message),
        (["verify", path], message),
        (["diff", path + "/chk-4", path], message),
        (["export", path, dest], message),
        # changed on purpose: refused first because the attempt runs (retained checkpoint)
        (["dispose", path + "/chk-5", "--force"], "retained by the running attempt"),
        (["dispose", path + "/chk-5"], "retained by the running attempt"),
    ]
    for args, expected in cases:
        result = run(*args)
        assert_error(result, expected)
        assert "checksum" not in result.stderr
        run_json(*args, code=1)
        assert listing(storage) == before, args
        assert not Path(dest).exists()
    # changed on purpose: the damaged document is quarantined (statehold.cleanup.policy), not
    # fatal to du or to disposing something else; its directory and the data files it
    # names are spared, so only the savepoint's own files go
    doc = run_json("du", path)
    assert {c["path"] for c in doc["by_checkpoint"]} == {"chk-3", "chk-4", "savepoints/sp"}
    assert listing(storage) == before
    doc = run_json("dispose", path + "/savepoints/sp")
    assert set(doc["deleted"]) == {k for k in before if k.startswith("savepoints/sp/")}
    assert listing(storage) == {k: v for k, v in before.items()
                                if not k.startswith("savepoints/")}
    built.coord.close()  # the attempt stops
    before = listing(storage)
    assert_error(run("dispose", path + "/chk-5"), "retained", "--force")
    assert listing(storage) == before
    # changed on purpose: with --force a damaged retained document is disposed of (its
    # directory only; the data files it may name are left to gc)
    doc = run_json("dispose", path + "/chk-5", "--force")
    assert doc["deleted"] == [key] and doc["unpublished"]
    assert retained_keys(storage) == ["chk-3/_metadata", "chk-4/_metadata"]
    after = listing(storage)
    assert {k: v for k, v in after.items() if not k.startswith("_ha/")} == {
        k: v for k, v in before.items() if not k.startswith("_ha/") and k != key}


def test_missing_file(job: tuple[Storage, str], tmp_path: Path) -> None:
    storage, path = job
    gone = sorted(refs(storage, "chk-5/_metadata"))[0]
    storage.delete_many([gone])
    before = listing(storage)
    dest = str(tmp_path / "dest")
    assert_error(run("verify", path), gone, "missing")
    doc = run_json("verify", path, code=1)
    assert doc["problems"] == [{"path": gone, "problem": "missing", "kind": None,
                                "spark_bug": None}]
    assert_error(run("export", path, dest), "cannot export", gone, "missing")
    doc = run_json("export", path, dest, code=1)
    assert doc["problems"][0] == {"path": gone, "problem": "missing", "kind": None,
                                  "spark_bug": None}
    assert not Path(dest).exists()
    assert listing(storage) == before


def test_unknown_checkpoint_and_savepoint(job: tuple[Storage, str]) -> None:
    storage, path = job
    before = listing(storage)
    each: list[Callable[[], Result]] = [
        lambda: run("inspect", path + "/chk-42"),
        lambda: run("verify", path + "/savepoints/nope"),
        lambda: run("dispose", path + "/chk-42", "--force"),
    ]
    for invoke in each:
        assert_error(invoke(), "no such")
    assert listing(storage) == before
