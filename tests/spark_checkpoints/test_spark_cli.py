"""The shared commands on a Spark checkpoint location: each tells it from a job directory
by what it holds, takes ``--json``, and says a problem in one line with exit status 1."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from statehold.cli.app import app
from tests.support.spark_locations.handmade_files import logs, rocksdb_changelog_store

STORE = "state/0/0"
runner = CliRunner()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


def run_json(*args: str, code: int = 0) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == code, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def make(root: Path) -> Path:
    logs(root, range(3, 7))
    rocksdb_changelog_store(root, STORE, range(1, 8), {2, 5})
    return root


def test_list_and_inspect(tmp_path: Path) -> None:
    root = str(make(tmp_path))
    listed = run_json("list", root)
    assert listed["kind"] == "spark-checkpoint" and listed["restart_batch"] == 6
    assert [b["batch"] for b in listed["batches"] if b["restartable"]] == [6, 5, 4]
    [store] = run_json("inspect", root)["stores"]
    held = (store["how"], store["base"], store["versions"])
    assert held == ("snapshot+changelogs", 5, list(range(1, 8)))
    text = run("inspect", root)
    assert text.exit_code == 0 and "snapshot+changelogs" in text.stdout


def test_verify_ok_then_one_line_per_problem(tmp_path: Path) -> None:
    root = make(tmp_path)
    assert run_json("verify", str(root))["ok"] is True
    assert run_json("verify", str(root), "--batch", "4")["batch"] == 4
    os.unlink(root / STORE / "6.changelog")
    os.unlink(root / "offsets" / "5")
    result = run("verify", str(root))
    assert result.exit_code == 1
    assert result.stderr.strip() == "statehold: error: verify failed: 2 problem(s) for batch 6"
    problem_lines = [line for line in result.stdout.splitlines() if not line.startswith("bound")]
    assert len(problem_lines) == 2 and any("offsets/5: missing" in p for p in problem_lines)
    doc = run_json("verify", str(root), code=1)
    assert doc["ok"] is False and len(doc["problems"]) == 2


def test_du_and_history(tmp_path: Path) -> None:
    root = str(make(tmp_path))
    usage = run_json("du", root)
    assert usage["bytes"]["ssts"] > 0 and usage["bytes"]["changelogs"] > 0
    assert usage["total_bytes"] == sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    records = run_json("history", root)["records"]
    assert [r["batch"] for r in records] == [3, 4, 5, 6]
    assert records[-1]["operators"][0]["files"] == 5  # 5.zip, 2 SSTs, 6 and 7.changelog


def test_a_job_directory_is_still_a_job_directory(tmp_path: Path) -> None:
    result = run("verify", str(tmp_path / "nothing-here"))
    assert result.exit_code == 1 and "spark" not in result.stderr.lower()


def test_savepoint_rollback_and_relocate_are_commands(tmp_path: Path) -> None:
    root = make(tmp_path / "ckpt")
    saved = run_json("savepoint", str(root), str(tmp_path / "sp"), "--batch", "5")
    assert saved["batch"] == 5 and saved["verified"] is True
    assert run_json("verify", str(tmp_path / "sp"))["batch"] == 5
    alive = run("rollback", str(root), "--to-batch", "4")  # just written: looks alive
    assert alive.exit_code == 1 and "looks alive" in alive.stderr
    assert sorted(os.listdir(root / "commits")) == ["3", "4", "5", "6"]
    rolled = run_json("rollback", str(root), "--to-batch", "4", "--force", "--keep",
                      str(tmp_path / "kept"))
    assert rolled["from_batch"] == 6 and rolled["kept"].endswith("/kept")
    assert sorted(os.listdir(root / "commits")) == ["3", "4"]
    assert run_json("list", str(tmp_path / "kept"))["restart_batch"] == 6
    move = ("relocate", str(root), "--from", "file:///data/in", "--to", "file:///new/in")
    alive = run(*move)  # a running query would read a log rewritten under it
    assert alive.exit_code == 1 and "looks alive" in alive.stderr
    assert run_json("verify", str(root))["bound_to"] == {"file:///data/in": 5}
    moved = run_json(*move, "--force")
    assert moved["paths"] == 5  # the source's log up to batch 4: files 0-4
    assert run_json("verify", str(root))["bound_to"] == {"file:///new/in": 5}


def test_savepoint_of_a_job_directory_says_what_it_takes(tmp_path: Path) -> None:
    result = run("savepoint", str(tmp_path), str(tmp_path / "dest"))
    assert result.exit_code == 1 and "not a Spark checkpoint location" in result.stderr
