"""What every ``statehold`` command shares: its argument and option types, `fail` (one
line, exit 1, a JSON error document with ``--json``), `handle_errors` and `emit`; the
rules they follow are in `statehold.cli.app`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from pydantic import BaseModel

from statehold.errors import StateholdError
from statehold.format.location_kind import SPARK_NEEDS
from statehold.job.directory import JobDirectory, NotAJobDirectoryError, open_job
from statehold.job.locate import split_location
from statehold.spark_checkpoints import SparkCheckpointError, SparkLocation
from statehold.tools import Problem, ToolError
from statehold.tools.locations import (
    JobLocation,
    Location,
    UnknownLocationError,
    open_location,
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


def error_line(message: str) -> None:
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
    error_line(message)
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
def opened(location: str, ha: str | None, *, or_else: str = "") -> Iterator[Location]:
    """The location at `location`, of the kind it is (`statehold.open`: the one place
    that decides), closed afterwards. `or_else`: what the command adds to the one line
    when the location is neither kind (what it works on)."""
    try:
        found = open_location(location, ha=ha)
    except UnknownLocationError as e:
        if not or_else:
            raise
        raise UnknownLocationError(f"{e}; {or_else}") from None
    with found:
        yield found


def job_only(location: Location, command: str) -> JobLocation:
    """`location` as a job directory; a Spark checkpoint location is refused."""
    if isinstance(location, JobLocation):
        return location
    raise NotAJobDirectoryError(
        f"{location.uri}: a Spark checkpoint location, not a statehold job directory "
        f"(statehold {command} works on job directories)")


def spark_only(location: Location, command: str) -> SparkLocation:
    """`location` as a Spark checkpoint location; a job directory is refused."""
    if isinstance(location, SparkLocation):
        return location
    raise SparkCheckpointError(
        f"{location.uri}: {SPARK_NEEDS} (statehold {command} works on a query's "
        "checkpointLocation)")


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
