"""The ``statehold`` command: one entry point over `statehold.tools`.

Every command takes ``--json`` (machine-readable result on stdout, no progress bars);
any problem exits non-zero with one line ``statehold: error: ...`` on stderr (and, with
``--json``, an ``{"ok": false, "error": ..., "problems": [...]}`` document on stdout).

Human-readable output (`statehold.cli_output`) depends on where it goes. To a terminal:
rich tables and highlighting, progress of long work on stderr (`RichProgress`: only when
stdout and stderr are both terminals), rich ``--help``. To a pipe or a
file: never wrapped or styled, whatever ``COLUMNS`` says: one line per message, a table
as a tab-separated header line and one tab-separated line per row, no progress, and
plain ``--help`` with each paragraph on one line.

Other modules add commands (``gc``, ``state``) without editing this file: a module named
in `EXTENSIONS` that exists must define ``register(app: typer.Typer) -> None``; it may use
`handle_errors`, `emit`, `JsonOption` and `RichProgress` from here, and
`statehold.cli_output` to print.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from pydantic import BaseModel

from statehold import tools
from statehold.cli_output import (
    UNWRAPPED,
    PlainWhenPiped,
    RichProgress,
    say,
    show_diff,
    show_inspection,
    show_listing,
    show_problems,
    show_usage,
    size,
)
from statehold.errors import StateholdError
from statehold.jobdir import JobDirectory, change_ha_store, open_job
from statehold.tools import Problem, ToolError
from statehold.tools.locate import split_location

#: Modules that add commands, if installed: each defines ``register(app)``.
EXTENSIONS = ("statehold.gc_cli", "statehold.state_cli", "statehold.history_cli")

app = typer.Typer(
    name="statehold",
    help="Inspect, verify, measure, export and dispose statehold checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainWhenPiped,
    context_settings={"terminal_width": UNWRAPPED},
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
    """Print `result` as JSON with ``--json``, else call `render`."""
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        render()


# -- commands --------------------------------------------------------------------------
@app.command("list")
def list_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Retained checkpoints, chk-N directories not retained (flagged), and savepoints."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, open_job_for(
        job_dir, ha
    ) as job:
        result = tools.list_checkpoints(job, progress=progress)

    emit(result, as_json, lambda: show_listing(result))
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

    emit(result, as_json, lambda: show_inspection(result))


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
            say(
                f"OK {result.job_uri.rstrip('/')}/{result.metadata_path}: "
                f"{result.files_checked} files, {size(result.bytes_checked)}"
            )
        else:
            show_problems(result.problems)

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

    emit(result, as_json, lambda: show_diff(result))
    if result.changed:
        _error_line(f"{len(result.changed)} file(s) differ in size or checksum under one path")
        raise typer.Exit(1)


@app.command("du")
def du_command(job_dir: JobArg, as_json: JsonOption = False, ha: HaOption = None) -> None:
    """Bytes by scope and by checkpoint (each shared file's bytes split evenly among the
    retained checkpoints and savepoints referencing it), and unreferenced bytes."""
    with handle_errors(as_json), RichProgress(not as_json) as progress, open_job_for(
        job_dir, ha
    ) as job:
        result = tools.du(job, progress=progress)

    emit(result, as_json, lambda: show_usage(result))


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
        say(
            f"exported {result.source} -> {result.dest.rstrip('/')}/{result.metadata_path}: "
            f"{result.files_copied} files, {size(result.bytes_copied)}"
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
    with handle_errors(as_json), RichProgress(not as_json) as progress, open_job_for(
        target, ha
    ) as job:
        located = tools.locate(job, split_location(target)[1])
        result = tools.dispose(located, force=force, dry_run=dry_run, progress=progress)

    def render() -> None:
        verb = "would delete" if result.dry_run else "deleted"
        say(
            f"{verb} {len(result.deleted)} files ({size(result.deleted_bytes)}) of "
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
        say(
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
    try:
        app()
    except BrokenPipeError:
        # `statehold list JOB | head`: the reader left; that is no error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    # `python -m statehold.cli`: run the importable module, so the extensions (which
    # import statehold.cli) see one module, not this __main__ copy of it.
    from statehold.cli import main as _main

    _main()
