"""What the `statehold` command prints to a pipe: every message whole on one line, tables
as tab-separated lines, no escape codes, no progress, and ``--help`` as written, however
long the job path and whatever COLUMNS, FORCE_COLOR or the time zone say. Each command
runs as its own process (``python -m statehold.cli``) with stdout and stderr pipes."""

from __future__ import annotations

import inspect
import io
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer

from statehold.cli import app
from statehold.cli import output as cli_output
from statehold.storage import open_storage
from tests.support.cli_process import Run, statehold_cli
from tests.support.jobs import build_job, refs

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d")
SIZE = r"\d+(\.\d)? (B|KiB|MiB)"


def assert_unbroken(run: Run, *paths: str) -> None:
    """A line showing any part of one of `paths` shows all of it."""
    for line in run.out + run.err:
        for path in paths:
            for part in Path(path).parts[1:]:
                if len(part) > 10 and part in line:
                    assert path in line, (path, line)


def assert_one_error_line(run: Run, *fragments: str) -> str:
    assert run.code == 1, run
    assert len(run.err) == 1 and run.err[0].startswith("statehold: error: "), run.err
    for fragment in fragments:
        assert fragment in run.err[0], (fragment, run.err[0])
    return run.err[0]


def tables(lines: list[str]) -> Iterator[list[list[str]]]:
    """Runs of tab-separated lines, split into fields."""
    block: list[list[str]] = []
    for line in [*lines, ""]:
        if "\t" in line:
            block.append(line.split("\t"))
        elif block:
            yield block
            block = []


def assert_table(lines: list[str], header: list[str]) -> list[list[str]]:
    """The table under `header` in `lines`: every row has as many fields as the header."""
    for block in tables(lines):
        if block[0] == header:
            assert all(len(row) == len(header) for row in block), block
            return block[1:]
    raise AssertionError(f"no table {header} in {lines}")


def only(lines: list[str], pattern: str) -> re.Match[str]:
    matches = [m for line in lines if (m := re.fullmatch(pattern, line))]
    assert len(matches) == 1, (pattern, lines)
    return matches[0]


# -- every command, through a pipe, on a job under a very long path -----------------------
def test_every_command_prints_whole_lines_to_a_pipe(tmp_path: Path) -> None:
    path = tmp_path / ("d" * 60) / ("e" * 60) / ("f" * 60) / "job"
    assert len(str(path)) > 200
    built = build_job(open_storage(str(path)))
    job = str(path)
    uri = path.as_uri()
    q = re.escape(uri)

    # While the attempt runs.
    status = statehold_cli("status", job)
    assert status.code == 0 and status.err == []
    assert status.out[0] == f"{uri}: epoch 1, retained [3, 4, 5]"
    only(status.out, r"running \(lease renewed \d+s ago\); cleanup backlog \d+ file\(s\) \+ "
                     r"\d+ dir\(s\), \d+ failed attempt\(s\)")
    gc_live = statehold_cli("gc", job, "--dry-run")
    assert gc_live.code == 0 and gc_live.err == []
    only(gc_live.out, q + r": would delete \d+ orphan\(s\), \d+ bytes; kept \d+ referenced "
                          r"file\(s\)")
    only(gc_live.out, r"a running attempt \(epoch 1\) holds \d+ in-flight file\(s\): spared")
    built.coord.close()

    listed = statehold_cli("list", job)
    assert listed.code == 0 and listed.err == [] and listed.out[0] == f"{uri} (HA epoch 1)"
    rows = assert_table(listed.out, ["checkpoint", "status", "epoch", "completed", "files",
                                     "bytes", "error"])
    assert [(r[0], r[1]) for r in rows] == [
        ("chk-3", "retained"), ("chk-4", "retained"), ("chk-5", "retained"),
        ("chk-99", "NOT RETAINED"), ("savepoints/sp", "savepoint")]
    assert all(TIMESTAMP.fullmatch(r[3]) for r in rows), rows
    assert_unbroken(listed, job)

    inspected = statehold_cli("inspect", job + "/savepoints/sp")
    assert inspected.code == 0 and inspected.err == []
    fields = dict(line.split("\t") for line in inspected.out)  # one tab on every line
    assert fields["job directory"] == uri and fields["kind"] == "savepoint"
    assert fields["metadata"] == "savepoints/sp/_metadata"
    assert TIMESTAMP.fullmatch(fields["completed"])

    verified = statehold_cli("verify", job)
    assert verified.code == 0 and verified.err == []  # no progress bar on a pipe
    assert verified.out == [only(verified.out, f"OK {q}/chk-5/_metadata: \\d+ files, {SIZE}")[0]]

    diffed = statehold_cli("diff", job + "/chk-3", job)
    assert diffed.code == 0 and diffed.err == []
    changes = assert_table(diffed.out, ["", "path", "scope", "size"])
    added = set(refs(built.storage, "chk-5/_metadata")) - set(refs(built.storage,
                                                                   "chk-3/_metadata"))
    assert {r[1] for r in changes if r[0] == "+"} == added
    only(diffed.out, rf"added {len(added)} files \({SIZE}\), removed \d+ \({SIZE}\), "
                     rf"unchanged \d+ \({SIZE}\)")

    du = statehold_cli("du", job)
    assert du.code == 0 and du.err == []
    assert_table(du.out, ["scope", "bytes"])
    usage = assert_table(du.out, ["checkpoint", "referenced", "exclusive",
                                  "shared (attributed)", "total"])
    assert {r[0] for r in usage} == {"chk-3", "chk-4", "chk-5", "savepoints/sp"}
    only(du.out, rf"total {SIZE} in \d+ files; unreferenced {SIZE} in \d+ files")

    dest = tmp_path / ("x" * 100) / ("y" * 100) / "export"
    exported = statehold_cli("export", job, str(dest))
    assert exported.code == 0 and exported.err == []
    only(exported.out, rf"exported {q}/chk-5 -> {re.escape(dest.as_uri())}/chk-5/_metadata: "
                       rf"\d+ files, {SIZE}, verified")
    assert_unbroken(exported, job, str(dest))

    disposed = statehold_cli("dispose", job + "/chk-99", "--dry-run")
    assert disposed.code == 0 and disposed.err == []
    only(disposed.out, rf"would delete \d+ files \({SIZE}\) of {q}/chk-99; kept \d+ still "
                       r"referenced")

    dry = statehold_cli("gc", job, "--dry-run")
    n = int(only(dry.out, q + r": would delete (\d+) orphan\(s\), \d+ bytes; kept \d+ "
                              r"referenced file\(s\)")[1])
    gc = statehold_cli("gc", job)
    assert gc.code == 0 and gc.err == []
    only(gc.out, q + rf": deleted {n} orphan\(s\), bytes not counted; kept \d+ referenced "
         r"file\(s\)")  # a local gc deletes by name, without an lstat

    status = statehold_cli("status", job)
    assert status.code == 0 and status.out == [
        f"{uri}: epoch 1, retained [3, 4, 5]", "no running attempt"]

    assert_one_error_line(statehold_cli("set-ha", job, "embedded"), uri, "already uses")
    assert_one_error_line(statehold_cli("state", job, "--out", str(tmp_path / "state")), uri)

    victim, f = sorted(refs(built.storage, "chk-5/_metadata").items())[-1]
    built.storage.write(victim, bytes(f.size))
    failed = statehold_cli("verify", job)
    assert_one_error_line(failed, "verify failed: 1 problem(s)", victim, "checksum mismatch")
    assert assert_table(failed.out, ["path", "problem"]) == [[victim, "checksum mismatch"]]

    for run in (status, gc_live, listed, inspected, verified, diffed, du, exported, disposed,
                dry, gc, failed):
        assert_unbroken(run, job)


# -- --help through a pipe ----------------------------------------------------------------
def one_line(text: str) -> str:
    return " ".join(text.split())


def test_help_reads_as_written_through_a_pipe() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    names = list(group.commands)
    assert {"list", "verify", "du", "gc", "status", "set-ha"} <= set(names)
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(zip(names, pool.map(lambda n: statehold_cli(n, "--help"), names),
                        strict=True))
    top = statehold_cli("--help")
    assert top.code == 0
    for name, command in group.commands.items():
        run = runs[name]
        assert run.code == 0 and run.err == [], (name, run)
        lines = [line.strip() for line in run.out]
        assert re.fullmatch(rf"Usage: \S.* {name} \[OPTIONS\].*", run.out[0]), run.out[0]
        # The docstring's first paragraph: one line, as written (no wrap, no "...").
        first = one_line(inspect.cleandoc(command.help or "").split("\n\n")[0])
        assert first in lines, (name, first, run.out)
        for param in command.params:
            text = getattr(param, "help", None)
            if text:
                assert any(one_line(text) in line for line in lines), (name, text, run.out)
        # The command list names each command with the first sentence of its help.
        sentence = first.split(". ")[0].rstrip(".")
        assert any(re.match(rf"{re.escape(name)}\s+{re.escape(sentence)}", line)
                   for line in (line.strip() for line in top.out)), (name, top.out)


# -- the helpers themselves ---------------------------------------------------------------
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_rich_but_never_loses_brackets_or_splits_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("FORCE_COLOR", "1")
    message = "deleted 6 orphan(s) of /x/[bold]y[/bold]/" + "z" * 80 + " [red]"
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    cli_output.say(message)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    assert shown == message + "\n"  # the terminal wraps it, not statehold


def test_a_pipe_gets_plain_lines_and_tab_separated_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "10")
    monkeypatch.setenv("FORCE_COLOR", "1")
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stdout", pipe)
    cli_output.say("a [b]c[/b]\nd " + "e" * 50)
    cli_output.table(("k", "v"), [("x\ty", "[i]one\ntwo"), ("", "")], title="not shown")
    assert pipe.getvalue().splitlines() == [
        "a [b]c[/b] d " + "e" * 50, "k\tv", "x y\t[i]one two", "\t"]


def test_progress_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with cli_output.RichProgress(True) as progress:
        progress.start("copy", 10)
        progress.advance(10)
    assert stderr.getvalue() == ""
