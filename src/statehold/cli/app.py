"""The ``statehold`` command: one entry point over `statehold.tools`.

Every command takes ``--json`` (machine-readable result on stdout, no progress bars);
any problem exits non-zero with one line ``statehold: error: ...`` on stderr (and, with
``--json``, an ``{"ok": false, "error": ..., "problems": [...]}`` document on stdout).

Human-readable output (`statehold.cli.output`) depends on where it goes. To a terminal:
rich tables and highlighting, progress of long work on stderr (`RichProgress`: only when
stdout and stderr are both terminals), rich ``--help``. To a pipe or a
file: never wrapped or styled, whatever ``COLUMNS`` says: one line per message, a table
as a tab-separated header line and one tab-separated line per row, no progress, and
plain ``--help`` with each paragraph on one line.

Each command group is a module with ``register(app)``, registered here by name.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from statehold import __version__
from statehold.cli import gc, history, jobs, operate, spark_checkpoints, state
from statehold.cli.output import UNWRAPPED, PlainWhenPiped

app = typer.Typer(
    name="statehold",
    help="Inspect, verify, measure, export and dispose statehold checkpoints, and own the "
    "checkpoint location of any Structured Streaming query (savepoint, rollback, gc).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainWhenPiped,
    context_settings={"terminal_width": UNWRAPPED},
)



def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"statehold {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print statehold's version and exit.",
        ),
    ] = False,
) -> None:
    # The options of `statehold` itself, before any command (typer calls this first).
    pass


for group in (jobs, gc, state, history, spark_checkpoints, operate):
    group.register(app)


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        # `statehold list JOB | head`: the reader left; that is no error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)

