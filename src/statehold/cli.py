"""The ``statehold`` command: one entry point over `statehold.tools`.

Every command takes ``--json`` (machine-readable result on stdout, no progress bars);
any problem exits non-zero with one line ``statehold: error: ...`` on stderr (and, with
``--json``, an ``{"ok": false, "error": ..., "problems": [...]}`` document on stdout).

Other modules add commands (``gc``, ``state``) without editing this file: a module named
in `EXTENSIONS` that exists must define ``register(app: typer.Typer) -> None``; it may use
`handle_errors`, `emit`, `JsonOption` and `RichProgress` from here.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichBar
from rich.table import Table

from statehold import tools
from statehold.errors import StateholdError
from statehold.jobdir import JobDirectory, change_ha_store, open_job
from statehold.tools import Problem, ToolError
from statehold.tools.locate import split_location

#: Modules that add commands, if installed: each defines ``register(app)``.
EXTENSIONS = ("statehold.gc_cli", "statehold.state_cli")

app = typer.Typer(
    name="statehold",
    help="Inspect, verify, measure, export and dispose statehold checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON (no progress bars).")
]
CheckpointArg = Annotated[
    str,
    typer.Argument(
        help="A chk-N directory, savepoints/NAME, or a job directory (its newest retained "
        "checkpoint). Plain path, file:// or s3://bucket/prefix."
    ),
]
JobArg = Annotated[str, typer.Argument(help="A job directory (path, file:// or s3://).")]
HaOption = Annotated[
    str | None,
    typer.Option(
        "--ha",
        help="The job's HA store: 'embedded' or zookeeper://host:port/path. Default: the "
        "store the job directory records; a different one is refused.",
    ),
]

console = Console()
err_console = Console(stderr=True)


def _error_line(message: str) -> None:
    sys.stderr.write(f"statehold: error: {' '.join(message.split())}\n")
    sys.stderr.flush()


def fail(message: str, *, as_json: bool = False, problems: list[Problem] | None = None) -> NoReturn:
    """Exit 1 with a one-line message (and a JSON error document with ``--json``)."""
    if as_json:
        doc = {
            "ok": False,
            "error": " ".join(message.split()),
            "problems": [p.model_dump(mode="json") for p in problems or []],
        }
        typer.echo(json.dumps(doc, indent=2))
    _error_line(message)
    raise typer.Exit(1)


@contextmanager
def handle_errors(as_json: bool) -> Iterator[None]:
    """Turn every statehold error into `fail` (one line, exit 1)."""
    try:
        yield
    except ToolError as e:
        fail(str(e), as_json=as_json, problems=e.problems)
    except StateholdError as e:
        fail(str(e), as_json=as_json)
    except (OSError, ValueError, RecursionError, MemoryError) as e:
        # Not statehold's own (a full disk, a permission, a value a library refused):
        # still one line, never a traceback; STATEHOLD_DEBUG=1 re-raises for one.
        if os.environ.get("STATEHOLD_DEBUG"):
            raise
        fail(f"{type(e).__name__}: {e}", as_json=as_json)


@contextmanager
def open_job_for(location: str, ha: str | None) -> Iterator[JobDirectory]:
    """The job directory at `location` (a job directory, or a checkpoint in one), opened
    with the HA store `--ha` names (None: the one it records), closed afterwards."""
    job_uri, _ref = split_location(location)
    with open_job(job_uri, ha) as job:
        yield job


def emit(result: BaseModel, as_json: bool, render: Callable[[], None]) -> None:
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        render()


class RichProgress:
    """A `tools.Progress` drawn on stderr; disabled (draws nothing) with ``--json``."""

    def __init__(self, enabled: bool) -> None:
        self._bar = RichBar(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=not enabled,
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.__exit__(exc_type, exc, tb)

    def start(self, description: str, total: int) -> None:
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)


def _time(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds") if ts else "-"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _problems_table(problems: list[Problem]) -> None:
    table = Table("path", "problem", title="problems", title_justify="left")
    for p in problems:
        table.add_row(p.path, p.problem)
    console.print(table)


# -- commands --------------------------------------------------------------------------
@app.command("list")
def list_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Retained checkpoints, chk-N directories not retained (flagged), and savepoints."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        result = tools.list_checkpoints(job)

    def render() -> None:
        table = Table("checkpoint", "status", "epoch", "completed", "files", "bytes", "error")
        for c in [*result.checkpoints, *result.savepoints]:
            status = "savepoint" if c.kind == "savepoint" else (
                "retained" if c.retained else "NOT RETAINED"
            )
            table.add_row(
                c.path,
                status,
                str(c.epoch if c.epoch is not None else "-"),
                _time(c.completed_at),
                str(c.file_count),
                _size(c.referenced_bytes),
                c.error or "",
            )
        console.print(f"{result.job_uri} (HA epoch {result.ha_epoch})")
        console.print(table)

    emit(result, as_json, render)
    if result.problems:
        p = result.problems[0]
        n = len(result.problems)
        _error_line(f"{n} unreadable checkpoint(s), first: {p.path}: {p.problem}")
        raise typer.Exit(1)


@app.command("inspect")
def inspect_command(
    checkpoint: CheckpointArg, as_json: JsonOption = False, ha: HaOption = None
) -> None:
    """Header fields of a checkpoint; with --json also every file it references."""
    with handle_errors(as_json), open_job_for(checkpoint, ha) as job:
        result = tools.inspect(tools.locate(job, split_location(checkpoint)[1]))

    def render() -> None:
        table = Table(show_header=False, box=None)
        rows = {
            "job directory": result.job_uri,
            "metadata": result.metadata_path,
            "kind": result.kind + (" (retained)" if result.retained else ""),
            "job id": result.job_id,
            "checkpoint id": str(result.checkpoint_id),
            "savepoint": result.savepoint_name or "-",
            "epoch": str(result.epoch),
            "created": _time(result.created_at),
            "completed": _time(result.completed_at),
            "format version": str(result.format_version),
            "max parallelism": str(result.max_parallelism),
            "source position": json.dumps(result.source_position),
            "lineage": json.dumps(result.lineage) if result.lineage else "-",
            "operators": ", ".join(result.operators),
            "files": f"{result.file_count} ({_size(result.total_bytes)})",
        }
        for scope, n in sorted(result.bytes_by_scope.items()):
            rows[f"  {scope}"] = _size(n)
        for k, v in rows.items():
            table.add_row(k, v)
        console.print(table)

    emit(result, as_json, render)


@app.command("verify")
def verify_command(
    checkpoint: CheckpointArg,
    as_json: JsonOption = False,
    no_checksums: Annotated[
        bool, typer.Option("--no-checksums", help="Check presence and size only.")
    ] = False,
    ha: HaOption = None,
) -> None:
    """Every referenced file present, of the right size and checksum, inside the job
    directory. Exits 1 and lists the problems otherwise."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, open_job_for(
        checkpoint, ha
    ) as job:
        target = tools.locate(job, split_location(checkpoint)[1])
        result = tools.verify(target, checksums=not no_checksums, progress=progress)

    def render() -> None:
        if result.ok:
            console.print(
                f"OK {result.job_uri.rstrip('/')}/{result.metadata_path}: "
                f"{result.files_checked} files, {_size(result.bytes_checked)}"
            )
        else:
            _problems_table(result.problems)

    emit(result, as_json, render)
    if not result.ok:
        p = result.problems[0]
        n = len(result.problems)
        _error_line(f"verify failed: {n} problem(s), first: {p.path}: {p.problem}")
        raise typer.Exit(1)


@app.command("diff")
def diff_command(
    checkpoint_a: CheckpointArg,
    checkpoint_b: CheckpointArg,
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Files added and removed from checkpoint A to checkpoint B, and their bytes."""
    with handle_errors(as_json):
        result = tools.diff(checkpoint_a, checkpoint_b, ha=ha)

    def render() -> None:
        table = Table("", "path", "scope", "size")
        for e in result.added:
            table.add_row("+", e.path, e.scope.value, _size(e.size))
        for e in result.removed:
            table.add_row("-", e.path, e.scope.value, _size(e.size))
        for e in result.changed:
            table.add_row("!", e.path, e.scope.value, _size(e.size))
        console.print(table)
        console.print(
            f"added {len(result.added)} files ({_size(result.added_bytes)}), removed "
            f"{len(result.removed)} ({_size(result.removed_bytes)}), unchanged "
            f"{result.unchanged_files} ({_size(result.unchanged_bytes)})"
        )

    emit(result, as_json, render)
    if result.changed:
        _error_line(f"{len(result.changed)} file(s) differ in size or checksum under one path")
        raise typer.Exit(1)


@app.command("du")
def du_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Bytes by scope and by checkpoint (each shared file's bytes split evenly among the
    retained checkpoints and savepoints referencing it), and unreferenced bytes."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        result = tools.du(job)

    def render() -> None:
        scopes = Table("scope", "bytes")
        for scope, n in sorted(result.by_scope.items()):
            scopes.add_row(scope, _size(n))
        console.print(scopes)
        table = Table("checkpoint", "referenced", "exclusive", "shared (attributed)", "total")
        for c in result.by_checkpoint:
            table.add_row(
                c.path + ("" if c.retained or c.kind == "savepoint" else " (not retained)"),
                _size(c.referenced_bytes),
                _size(c.exclusive_bytes),
                _size(c.shared_attributed_bytes),
                _size(c.attributed_bytes),
            )
        console.print(table)
        console.print(
            f"total {_size(result.total_bytes)} in {result.total_files} files; unreferenced "
            f"{_size(result.unreferenced_bytes)} in {result.unreferenced_files} files"
        )

    emit(result, as_json, render)


@app.command("export")
def export_command(
    checkpoint: CheckpointArg,
    dest: Annotated[str, typer.Argument(help="An empty destination (path, file://, s3://).")],
    as_json: JsonOption = False,
    no_verify: Annotated[
        bool, typer.Option("--no-verify", help="Skip verifying the exported copy.")
    ] = False,
    ha: HaOption = None,
) -> None:
    """Write a minimal self-contained job directory holding only this checkpoint."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, open_job_for(
        checkpoint, ha
    ) as job:
        source = tools.locate(job, split_location(checkpoint)[1])
        result = tools.export(source, dest, progress=progress, verify_after=not no_verify)

    def render() -> None:
        console.print(
            f"exported {result.source} -> {result.dest.rstrip('/')}/{result.metadata_path}: "
            f"{result.files_copied} files, {_size(result.bytes_copied)}"
            + (", verified" if result.verified else "")
        )

    emit(result, as_json, render)


@app.command("dispose")
def dispose_command(
    target: Annotated[
        str, typer.Argument(help="A chk-N directory, savepoints/NAME, or a job directory.")
    ],
    as_json: JsonOption = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Also dispose retained checkpoints / whole jobs."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")
    ] = False,
    ha: HaOption = None,
) -> None:
    """Delete a checkpoint, a savepoint or a job directory; files that a retained
    checkpoint or another savepoint references are always kept."""
    with handle_errors(as_json), open_job_for(target, ha) as job:
        located = tools.locate(job, split_location(target)[1])
        result = tools.dispose(located, force=force, dry_run=dry_run)

    def render() -> None:
        verb = "would delete" if result.dry_run else "deleted"
        console.print(
            f"{verb} {len(result.deleted)} files ({_size(result.deleted_bytes)}) of "
            f"{result.job_uri.rstrip('/')}/{result.path}; kept {len(result.kept)} still "
            "referenced"
        )

    emit(result, as_json, render)


@app.command("set-ha")
def set_ha_command(
    job_dir: JobArg,
    new_ha: Annotated[
        str, typer.Argument(help="The new HA store: embedded or zookeeper://host:port/path.")
    ],
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Move a stopped job to another HA store: fences the old one (a new epoch there),
    seeds the new one with that epoch and the retained checkpoints, then records it."""
    with handle_errors(as_json), open_job_for(job_dir, ha) as job:
        state = change_ha_store(job, new_ha)
        result = SetHaReport(
            job_uri=job.uri,
            old_ha=job.ha_uri,
            new_ha=new_ha,
            epoch=state.epoch,
            retained=[p.checkpoint_id for p in state.retained],
        )

    def render() -> None:
        console.print(
            f"{result.job_uri}: HA store {result.old_ha} -> {result.new_ha} (epoch "
            f"{result.epoch}, retained {result.retained})"
        )

    emit(result, as_json, render)


class SetHaReport(BaseModel):
    job_uri: str
    old_ha: str
    new_ha: str
    epoch: int
    retained: list[int]


def _load_extensions() -> None:
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(app)


if __name__ != "__main__":  # run as a script, the real module below loads them
    _load_extensions()


def main() -> None:
    app()


if __name__ == "__main__":
    # `python -m statehold.cli`: run the importable module, so the extensions (which
    # import statehold.cli) see one module, not this __main__ copy of it.
    from statehold.cli import main as _main

    _main()
