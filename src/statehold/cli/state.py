"""``statehold state CHECKPOINT --out DIR --format parquet|jsonl [--json]``: dump keyed state.

Runs without Spark (a CLI should start in a second): each key-group range is restored
into a temporary local RocksDB and written out. One row per key: ``key`` plus one field
per state name. ``jsonl``: the values as JSON (``{"key": "a", "count": 3, "last": [1]}``);
``parquet``: one string column per state holding the value's JSON text (state values have
no fixed type). One file per key-group range: ``part-<first>-<last>.<ext>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from statehold.cli.common import CheckpointArg, HaOption, JsonOption, emit, fail, handle_errors
from statehold.cli.output import RichProgress, say
from statehold.tools.listing import NoProgress, Progress

_ROWS_PER_GROUP = 50_000
_T = TypeVar("_T")


class Format(StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"


class StateDump(BaseModel):
    checkpoint: str
    operator: str
    format: str
    out: str
    columns: list[str]
    rows: int
    files: list[str]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dump_state(
    checkpoint: str,
    out: Path,
    fmt: Format,
    operator: str | None = None,
    *,
    ha: str | None = None,
    progress: Progress | None = None,
) -> StateDump:
    """Write the state of `checkpoint` to `out` (created; must be empty if it exists);
    `progress` counts the keys written."""
    # Imported here, not at the top: every other command starts without PySpark's and
    # Arrow's import time (a quarter of a second).
    from statehold.spark.reader import KEY_COLUMN, StateReadError, key_text, locate_state, open_all

    progress = progress or NoProgress()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StateReadError(f"{out}: exists and is not an empty directory")
    src = locate_state(checkpoint, operator, ha=ha)
    with open_all(src) as backends:
        names = sorted(set().union(*(b.state_names() for b in backends)))
        if KEY_COLUMN in names:
            raise StateReadError(f"{src.uri}: a state is named {KEY_COLUMN!r}, like the key")
        out.mkdir(parents=True, exist_ok=True)
        files: list[str] = []
        rows = 0
        progress.start(f"writing {src.uri}", None, "keys")
        for b in backends:
            kg = b.key_groups
            path = out / f"part-{kg.start:05d}-{kg.end:05d}.{fmt.value}"
            items = _counted(b.items(src.decoders), progress)
            if fmt is Format.jsonl:
                with open(path, "w", encoding="utf-8") as f:
                    for key, states in items:
                        f.write(_json({KEY_COLUMN: key_text(key), **states}) + "\n")
                        rows += 1
            else:
                rows += _write_parquet(path, items, names)
            files.append(path.name)
    return StateDump(
        checkpoint=src.uri,
        operator=src.operator,
        format=fmt.value,
        out=str(out),
        columns=[KEY_COLUMN, *names],
        rows=rows,
        files=files,
    )


def _counted(items: Iterable[_T], progress: Progress, every: int = 1000) -> Iterator[_T]:
    """`items`, telling `progress` of every `every` of them (and of the rest at the end)."""
    n = 0
    for item in items:
        yield item
        n += 1
        if n == every:
            progress.advance(n)
            n = 0
    progress.advance(n)


def _write_parquet(path: Path, items: Any, names: list[str]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from statehold.spark.reader import KEY_COLUMN, key_text

    schema = pa.schema([pa.field(KEY_COLUMN, pa.string(), False)] + [
        pa.field(n, pa.string()) for n in names
    ])
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        chunk: list[tuple[Any, dict[str, Any]]] = []

        def flush() -> None:
            columns = [pa.array([key_text(k) for k, _ in chunk], pa.string())]
            for name in names:
                columns.append(
                    pa.array(
                        [_json(s[name]) if name in s else None for _, s in chunk], pa.string()
                    )
                )
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))

        for item in items:
            chunk.append(item)
            n += 1
            if len(chunk) >= _ROWS_PER_GROUP:
                flush()
                chunk = []
        if chunk or n == 0:
            flush()
    return n


def state_command(
    checkpoint: CheckpointArg,
    out: Annotated[Path, typer.Option("--out", help="Output directory (created; empty).")],
    fmt: Annotated[Format, typer.Option("--format", help="parquet or jsonl.")] = Format.parquet,
    operator: Annotated[
        str | None, typer.Option("--operator", help="Operator to read (if several).")
    ] = None,
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Write the keyed state of a checkpoint, one row per key (key + one column per state)."""
    with handle_errors(as_json), RichProgress(not as_json) as progress:
        try:
            result = dump_state(checkpoint, out, fmt, operator, ha=ha, progress=progress)
        except OSError as e:
            fail(f"{out}: {e}", as_json=as_json)

    def render() -> None:
        say(
            f"{result.checkpoint} ({result.operator}): {result.rows} keys, columns "
            f"{', '.join(result.columns)} -> {result.out} ({len(result.files)} "
            f"{result.format} files)"
        )

    emit(result, as_json, render)


def register(app: typer.Typer) -> None:
    app.command("state")(state_command)
