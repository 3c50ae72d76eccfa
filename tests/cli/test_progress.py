"""Progress of long work: drawn on a terminal, never on a pipe or with ``--json``; a
restore from another job logs its copy progress.

Each command runs as its own process (``python -m statehold.cli``) once with stdout and
stderr on a real pseudo-terminal (the pty module) and once with pipes; the terminal sees
each phase's progress line, the pipe sees the plain output of tests/cli/test_cli_output.py
and nothing on stderr."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from statehold.checkpoint import copy_log as progress
from statehold.checkpoint.restore import restore_into
from statehold.cli.output import RichProgress
from statehold.format import layout
from statehold.format.metadata import RestoreMode, read_metadata, referenced_keys
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import open_storage
from tests.support.cli_process import SRC, statehold_cli
from tests.support.jobs import build_job
from tests.support.spark_locations.committed_fixtures import copy_of, extractor, manifests
from tests.support.spark_locations.disk_trees import plant

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(*args: str) -> tuple[int, str]:
    """`args` run as ``python -m statehold.cli`` with stdin, stdout and stderr a pty
    (200 columns); the exit code and everything it wrote, escape codes removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=os.pathsep.join(
        filter(None, [SRC, env.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "statehold.cli", *args], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process has gone and closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        code = proc.wait(timeout=120)
    return code, ESCAPES.sub("", b"".join(chunks).decode(errors="replace"))


def test_long_work_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    job = str(tmp_path / "job")
    build_job(open_storage(job)).coord.close()
    uri = Path(job).as_uri()
    # a Spark checkpoint location (a committed fixture) with an old orphan for its gc
    version = sorted(manifests())[-1]
    spark = copy_of(extractor(tmp_path / "fixtures")(version), version, "window",
                    "rocksdb_changelog", tmp_path / "spark").checkpoint
    plant(spark / "state" / "0" / "0" / "SSTs" / "orphan.sst")
    spark_uri = re.escape(spark.as_uri())
    listed = re.compile(rf"listing {re.escape(uri)} .*\d+ files")
    runs = {
        "list": (["list", job], [listed, re.compile(rf"reading {re.escape(uri)} .*\d+/5 "
                                                    "checkpoints")]),
        "du": (["du", job], [listed]),
        "gc": (["gc", job], [re.compile(rf"gc {re.escape(uri)}: listed .*\d+ files"),
                            re.compile(rf"gc {re.escape(uri)}: deleted .*\d+ files")]),
        "spark gc": (["gc", str(spark)], [re.compile(rf"gc {spark_uri}: listed .*\d+ files"),
                                           re.compile(rf"gc {spark_uri}: deleted .*\d+/\d+ "
                                                      "files"),
                                           re.compile(rf"gc {spark_uri}: freed .*/[\d.]+ "
                                                      "(kB|bytes)")]),
        "dispose": (["dispose", job + "/chk-99", "--dry-run"], [listed]),
        "export": (["export", job, str(tmp_path / "exported")],
                   [re.compile(r"checking chk-5 .*\d+/\d+ files"),
                    re.compile(r"export chk-5 .*/[\d.]+ (kB|bytes)"),
                    re.compile(r"verify chk-5 ")]),
    }
    for name, (args, phases) in runs.items():
        code, shown = on_terminal(*args)
        assert code == 0, (name, shown)
        for phase in phases:
            assert phase.search(shown), (name, phase.pattern, shown)
    # The same through pipes: not a character of progress (test_cli_output.py pipes
    # every command and checks its whole output, stderr empty).
    for args in (runs["list"][0], runs["du"][0]):
        piped = statehold_cli(*args)
        assert piped.code == 0 and piped.err == [], piped
        assert not any("listing " in line or "reading " in line for line in piped.out)
    # --json on a terminal: the document alone.
    code, shown = on_terminal("du", job, "--json")
    assert code == 0 and "listing" not in shown
    assert json.loads(shown)["total_files"] > 0


def test_counter_draws_nothing_off_a_terminal(capfd: object) -> None:
    """Off a terminal the callback is accepted and ignored (gc and the tools call it
    unconditionally)."""
    with RichProgress(True) as progress:
        count = progress.counter("gc: listed")
        count(1000)
        progress.start("export", 10)
        count(500)
    out, err = capfd.readouterr()  # type: ignore[attr-defined]
    assert (out, err) == ("", "")


def test_a_restore_from_another_job_logs_its_copy_progress(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = open_storage(str(tmp_path / "source"))
    build_job(source).coord.close()
    key = layout.checkpoint_metadata_key(5)
    files = referenced_keys(read_metadata(source, key), key)
    total_bytes = sum(f.size for f in files.values())
    assert len(files) > 3
    monkeypatch.setattr(progress, "LOG_EVERY_FILES", 2)
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 1e9)  # by count only: no timing
    target = open_storage(str(tmp_path / "target"))
    with caplog.at_level(logging.INFO, logger="statehold.checkpoint.restore"):
        report = restore_into(source, key, target, EmbeddedHAStore(target), job_id="copy",
                              mode=RestoreMode.NO_CLAIM, threads=1)
    lines = [r.getMessage() for r in caplog.records if "restore from" in r.getMessage()]
    done = [re.fullmatch(rf"{re.escape(target.uri)}: restore from {re.escape(source.uri)}: "
                         rf"(\d+) of {len(files)} files, (\d+) of {total_bytes} bytes", line)
            for line in lines]
    assert all(done), lines
    counts = [int(m.group(1)) for m in done if m]
    assert counts == list(range(2, len(files), 2)) + [len(files)], counts
    assert done[-1] and int(done[-1].group(2)) == total_bytes == report.bytes
