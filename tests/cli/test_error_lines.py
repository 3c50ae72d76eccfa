"""Errors that say what to do: an unreachable ZooKeeper is one line naming what was tried
and how long, with none of the client's own log lines; a regular file given where a job
directory or a Spark checkpoint location is expected is called a file, not missing."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statehold.cli import app
from statehold.ha.base import HAStoreError
from statehold.ha.zookeeper import CONNECT_TIMEOUT, ZooKeeperHAStore
from statehold.job.owner import write_owner
from statehold.storage.local import LocalStorage
from tests.support.infra.server import free_port
from tests.support.paths import ROOT, SRC, python_path

runner = CliRunner()


def test_unreachable_zookeeper_is_one_line_naming_the_bound(tmp_path: Path) -> None:
    """`statehold status` on a job whose HA store is a port nothing listens on: exit 1, one
    line on stderr (no kazoo warnings before it) saying where, how long and why."""
    port = free_port()
    job = tmp_path / "job"
    write_owner(LocalStorage(job), "job", f"zookeeper://127.0.0.1:{port}/statehold")
    done = subprocess.run(
        [sys.executable, "-m", "statehold", "status", str(job)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path([SRC, ROOT])},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    where = f"127.0.0.1:{port}"
    assert lines[0].startswith(f"statehold: error: cannot connect to ZooKeeper at {where}:")
    assert f"no connection within {CONNECT_TIMEOUT:g} s" in lines[0]
    assert "Connection refused" in lines[0]  # the last attempt's reason


def test_connect_bound_is_the_one_given_and_kazoo_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bound in the message is the `connect_timeout` given, and no record of the
    attempt reaches a log handler (caplog's, on the root logger)."""
    caplog.set_level(logging.DEBUG)
    with pytest.raises(HAStoreError) as raised:
        ZooKeeperHAStore(f"127.0.0.1:{free_port()}", "/statehold", "job", connect_timeout=0.5)
    assert "no connection within 0.5 s" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert [r for r in caplog.records if r.name.startswith("kazoo")] == []


def _error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statehold: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [["list"], ["inspect"], ["verify"], ["du"], ["status"], ["history"], ["gc", "--dry-run"]],
)
def test_a_file_for_a_job_directory_says_so(command: list[str], tmp_path: Path) -> None:
    file = tmp_path / "job"
    file.write_text("not a directory\n")
    line = _error([*command, str(file)])
    assert "is a file, not a directory" in line
    assert "no such directory" not in line
    assert file.read_text() == "not a directory\n"  # nothing written or deleted


@pytest.mark.parametrize(
    "command", [["savepoint", "{file}", "{dest}"], ["relocate", "{file}", "--from", "/a",
                                                    "--to", "/b"]],
)
def test_a_file_for_a_spark_checkpoint_location_says_so(
    command: list[str], tmp_path: Path
) -> None:
    file = tmp_path / "ckpt"
    file.write_text("x")
    dest = tmp_path / "dest"
    line = _error([a.format(file=file, dest=dest) for a in command])
    assert f"{file}: is a file, not a directory" in line
    assert not dest.exists()


def test_a_missing_directory_is_still_missing(tmp_path: Path) -> None:
    """The other case keeps its words: nothing at the path is 'no such directory'."""
    assert "no such directory" in _error(["list", str(tmp_path / "nowhere")])
