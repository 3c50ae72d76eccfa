"""How the ``statehold`` command writes for people: lines, tables, progress and help.

The choice is made at each write, from whether the stream is a terminal (``isatty``);
``COLUMNS``, ``FORCE_COLOR`` and the like never make a pipe behave like a terminal.

* stdout a terminal: lines and tables through rich (highlighted; never rich markup, so
  ``[...]`` in a path stays), a line left to the terminal to wrap, a table fitted to it.
* stdout anything else (a pipe, a file): one plain line per message, never wrapped, no
  escape codes; a table is a tab-separated header line, then one tab-separated line per
  row (a tab or line break inside a cell becomes a space).
* progress (one transient line per phase, on stderr) only when stdout and stderr are
  both terminals and ``--json`` is not given.
* ``--help`` and usage errors: rich panels when stdout and stderr are both terminals,
  otherwise click's plain text with every paragraph and option help on one line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TextIO

from rich import box, filesize
from rich.console import Console
from rich.progress import (
    BarColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichBar
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from statehold.progress import Advance
from statehold.tools import DiffReport, DiskUsage, Inspection, JobListing, Problem
from statehold.web_page import size as size
from statehold.web_page import when as when

#: The help formatter's width: wide enough that click never wraps a help text.
UNWRAPPED = 1_000_000


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (False for anything that cannot tell)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _flat(text: str) -> str:
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ")


def say(message: str) -> None:
    """One message on stdout: one line (line breaks inside it become spaces)."""
    if is_terminal(sys.stdout):
        Console(markup=False, emoji=False).print(message, soft_wrap=True)
    else:
        sys.stdout.write(_flat(message) + "\n")
        sys.stdout.flush()


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    title: str | None = None,
    grid: bool = False,
) -> None:
    """Rows under `headers` on stdout. A `grid` has no header line and no borders; a
    `title` is shown on a terminal only."""
    if not is_terminal(sys.stdout):
        lines = [] if grid else ["\t".join(_flat(h) for h in headers)]
        lines += ["\t".join(_flat(cell) for cell in row) for row in rows]
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        return
    drawn = Table(title=title, title_justify="left", show_header=not grid,
                  box=None if grid else box.HEAVY_HEAD)
    for h in headers:
        drawn.add_column(Text(h), overflow="fold")
    for row in rows:
        drawn.add_row(*(Text(cell) for cell in row))
    Console(emoji=False).print(drawn)


class _Amount(ProgressColumn):
    """``1.2/3.4 MB`` for bytes, ``1,234/5,678 files`` for counts (no total: no ``/``)."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "bytes")
        done, total = int(task.completed), task.total
        if unit == "bytes":
            shown = filesize.decimal(done)
            if total is not None:
                shown = f"{filesize.decimal(done).split()[0]}/{filesize.decimal(int(total))}"
            return Text(shown, style="progress.download")
        count = f"{done:,}" if total is None else f"{done:,}/{int(total):,}"
        return Text(f"{count} {unit}", style="progress.download")


def progress_wanted(enabled: bool = True) -> bool:
    """Whether to draw progress: asked for (not ``--json``), and stdout and stderr both
    terminals (a redirected stream means a script or a pager is reading)."""
    return enabled and is_terminal(sys.stdout) and is_terminal(sys.stderr)


class RichProgress:
    """The one renderer of `statehold.progress.Progress`, for every command on either
    kind of location: drawn on stderr as one transient line per phase and one per
    counter, only when `progress_wanted`; otherwise it draws nothing."""

    def __init__(self, enabled: bool) -> None:
        self._bar = RichBar(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            _Amount(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not progress_wanted(enabled),
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

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        """A new phase; the previous one's line goes."""
        if self._task is not None:
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task(description, total=total, unit=unit)

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        """A line of its own beside the current phase (work running in parallel, e.g.
        gc's listing and its deletes), and the callback that adds `n` to its count;
        safe from any thread."""
        task = self._bar.add_task(description, total=total, unit=unit)

        def count(n: int) -> None:
            self._bar.advance(task, n)

        return count


class PlainWhenPiped(TyperGroup):
    """A typer group whose help and usage errors are click's plain text unless stdout
    and stderr are both terminals (give the app ``context_settings`` with
    ``terminal_width=UNWRAPPED`` so that plain text is never wrapped)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if not (is_terminal(sys.stdout) and is_terminal(sys.stderr)):
            # Typer rebuilds these objects for every run: this lasts one invocation.
            self.rich_markup_mode = None
            for command in self.commands.values():
                if isinstance(command, TyperCommand | TyperGroup):
                    command.rich_markup_mode = None
        return super().main(*args, **kwargs)


# -- formatting ----------------------------------------------------------------------------
# -- the tables of the commands -----------------------------------------------------------
def show_problems(problems: list[Problem]) -> None:
    table(("path", "problem"), [(p.path, p.problem) for p in problems], title="problems")


def show_listing(result: JobListing) -> None:
    """``statehold list``: the job line, then one row per checkpoint and savepoint."""
    rows = []
    for c in [*result.checkpoints, *result.savepoints]:
        status = "savepoint" if c.kind == "savepoint" else (
            "retained" if c.retained else "NOT RETAINED"
        )
        rows.append((
            c.path,
            status,
            str(c.epoch if c.epoch is not None else "-"),
            when(c.completed_at),
            str(c.file_count),
            size(c.referenced_bytes),
            c.error or "",
        ))
    say(f"{result.job_uri} (HA epoch {result.ha_epoch})")
    table(("checkpoint", "status", "epoch", "completed", "files", "bytes", "error"), rows)


def show_inspection(result: Inspection) -> None:
    """``statehold inspect``: one ``field value`` row per header field."""
    rows = {
        "job directory": result.job_uri,
        "metadata": result.metadata_path,
        "kind": result.kind + (" (retained)" if result.retained else ""),
        "job id": result.job_id,
        "checkpoint id": str(result.checkpoint_id),
        "savepoint": result.savepoint_name or "-",
        "epoch": str(result.epoch),
        "created": when(result.created_at),
        "completed": when(result.completed_at),
        "format version": str(result.format_version),
        "max parallelism": str(result.max_parallelism),
        "key hash": result.key_hash,
        "source position": json.dumps(result.source_position),
        "lineage": json.dumps(result.lineage) if result.lineage else "-",
        "operators": ", ".join(result.operators),
        "files": f"{result.file_count} ({size(result.total_bytes)})",
    }
    for scope, n in sorted(result.bytes_by_scope.items()):
        rows[f"  {scope}"] = size(n)
    table(("field", "value"), rows.items(), grid=True)


def show_diff(result: DiffReport) -> None:
    """``statehold diff``: ``+`` added, ``-`` removed, ``!`` changed, then the totals."""
    rows = [
        (mark, e.path, e.scope.value, size(e.size))
        for mark, entries in (("+", result.added), ("-", result.removed), ("!", result.changed))
        for e in entries
    ]
    table(("", "path", "scope", "size"), rows)
    say(
        f"added {len(result.added)} files ({size(result.added_bytes)}), removed "
        f"{len(result.removed)} ({size(result.removed_bytes)}), unchanged "
        f"{result.unchanged_files} ({size(result.unchanged_bytes)})"
    )


def show_usage(result: DiskUsage) -> None:
    """``statehold du``: bytes by scope, an empty line, bytes by checkpoint, the totals."""
    table(("scope", "bytes"), [(s, size(n)) for s, n in sorted(result.by_scope.items())])
    say("")  # on a pipe, an empty line ends the first table
    table(
        ("checkpoint", "referenced", "exclusive", "shared (attributed)", "total"),
        [
            (
                c.path + ("" if c.retained or c.kind == "savepoint" else " (not retained)"),
                size(c.referenced_bytes),
                size(c.exclusive_bytes),
                size(c.shared_attributed_bytes),
                size(c.attributed_bytes),
            )
            for c in result.by_checkpoint
        ],
    )
    say(
        f"total {size(result.total_bytes)} in {result.total_files} files; unreferenced "
        f"{size(result.unreferenced_bytes)} in {result.unreferenced_files} files"
    )
