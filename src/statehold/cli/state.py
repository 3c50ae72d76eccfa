"""``statehold state CHECKPOINT --out DIR --format parquet|jsonl [--json]``: dump keyed state.

Runs without Spark (a CLI should start in a second): each key-group range is restored
into a temporary local RocksDB and written out. One row per key: ``key`` plus one field
per state name. ``jsonl``: the values as JSON (``{"key": "a", "count": 3, "last": [1]}``);
``parquet``: one string column per state holding the value's JSON text (state values have
no fixed type). One file per key-group range: ``part-<first>-<last>.<ext>``.

On a Spark checkpoint location (told apart as every command does:
`statehold.open`), one store of one operator as a batch left it
(`SparkLocation.read_state`): the key's columns, then the value's, typed as the
store's schema says (``--schema FILE`` where the location holds none it can read). One
file per state partition, ``part-<partition>.<ext>``, written as the record batches come
(a parquet row group, or JSON lines, per batch), so memory does not grow with the state.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer
from pydantic import BaseModel
from typer.core import TyperGroup

from statehold.cli.common import HaOption, JsonOption, emit, fail, handle_errors, job_only, opened
from statehold.cli.output import RichProgress, say
from statehold.job.locate import TargetLike
from statehold.spark_checkpoints import SparkLocation
from statehold.spark_checkpoints.errors import SparkCheckpointError, StateSchemaUnreadable
from statehold.tools.listing import NoProgress, Progress

if TYPE_CHECKING:
    import pyarrow as pa

    from statehold.spark_checkpoints.state_schema import StateSchema

_ROWS_PER_GROUP = 50_000
_T = TypeVar("_T")


class Side(StrEnum):
    """``state delete --side``: a join's side."""

    left = "left"
    right = "right"


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


class SparkStateDump(BaseModel):
    """What ``statehold state`` wrote of a Spark checkpoint location's store."""

    kind: Literal["spark-checkpoint"] = "spark-checkpoint"
    checkpoint: str
    batch: int
    operator: int
    store: str
    format: str
    out: str
    #: the key's columns, then the value's; `key_columns` of them are the key
    columns: list[str]
    key_columns: int
    rows: int
    files: list[str]
    #: a transformWithState operator's state variable read
    state_var: str | None = None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dump_state(
    checkpoint: TargetLike,
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


def _empty_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SparkCheckpointError(f"{out}: exists and is not an empty directory")


def _one_of(names: Iterable[Any], given: Any, what: str, option: str, where: str) -> Any:
    """`given`, or the only one of `names` when not given; refused in one line when
    `given` is not one of them or there are several to choose from."""
    found = sorted(set(names))
    listed = ", ".join(str(n) for n in found) or "none"
    if given is None:
        if len(found) == 1:
            return found[0]
        raise SparkCheckpointError(f"{where}: {what}s {listed}; choose one with {option}")
    if given not in found:
        raise SparkCheckpointError(f"{where}: no {what} {given} ({what}s: {listed})")
    return given


def dump_spark_state(
    location: SparkLocation,
    out: Path,
    fmt: Format,
    *,
    batch: int | None = None,
    operator: int | None = None,
    store: str | None = None,
    schema: StateSchema | None = None,
    state_var: str | None = None,
    progress: Progress | None = None,
) -> SparkStateDump:
    """Write one store of `location` as `batch` (default: the newest committed) left it
    to `out` (created; must be empty if it exists), one file per partition. `operator`
    and `store` may be left out where the location has one. Everything is checked (the
    batch, the operator and store, the schema) before `out` is made. `state_var`: a
    transformWithState operator's state variable (which such an operator needs)."""
    # imported when used: the other commands start without Arrow's and RocksDB's import
    from statehold.spark_checkpoints.layout import StoreId
    from statehold.spark_checkpoints.state_reader import read_store
    from statehold.spark_checkpoints.tws_state import read_variable, tws_operator

    progress = progress or NoProgress()
    _empty_out(out)
    found = location.scan()
    uri = location.uri
    if batch is None:
        batch = found.newest_committed
        if batch is None:
            raise SparkCheckpointError(f"{uri}: no committed batch to read state at")
    if batch not in found.commits:
        raise SparkCheckpointError(f"{uri}: batch {batch} is not committed in the location")
    operator = _one_of((s.operator for s in found.stores), operator, "operator",
                       "--operator", uri)
    store = _one_of((s.name for s in found.stores if s.operator == operator), store,
                    "store", "--store", f"{uri} operator {operator}")
    partitions = sorted(s.partition for s in found.stores
                        if (s.operator, s.name) == (operator, store))
    tws = tws_operator(location, found, operator, store)
    if tws is None and state_var is not None:
        raise SparkCheckpointError(
            f"{uri}: operator {operator} is not transformWithState's; --state-var applies to "
            "such an operator only")
    if tws is not None:
        if state_var is None:
            raise SparkCheckpointError(
                f"{uri}: operator {operator} is transformWithState's: name a state variable "
                f"(--state-var): {', '.join(tws.variables)}")
        schema = tws.family(state_var).schema()
    schema = schema or location.state_schema(operator=operator, store=store)
    arrow = schema.arrow()
    repeated = sorted({n for n in arrow.names if arrow.names.count(n) > 1})
    if repeated:
        raise SparkCheckpointError(
            f"{uri} operator {operator} store {store}: the key and the value both have a "
            f"column {repeated[0]!r}")
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    rows = 0
    progress.start(f"writing {uri} operator {operator} {store}", None, "rows")
    for partition in partitions:
        path = out / f"part-{partition:05d}.{fmt.value}"
        # the listing taken above, not one more per partition (read_state lists anew)
        one = StoreId(operator, partition, store)
        batches = (read_variable(location, found, tws, one, batch, state_var, 4096)
                   if tws is not None and state_var is not None
                   else read_store(location, found, one, batch, schema=schema))
        written = (_write_jsonl(path, batches, progress) if fmt is Format.jsonl
                   else _write_batches(path, batches, arrow, progress))
        rows += written
        files.append(path.name)
    return SparkStateDump(
        checkpoint=uri, batch=batch, operator=operator, store=store, format=fmt.value,
        out=str(out), columns=arrow.names, key_columns=len(schema.key.fields), rows=rows,
        files=files, state_var=state_var,
    )


def _write_batches(path: Path, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
                   progress: Progress) -> int:
    """Each record batch a row group of its own, as it comes."""
    import pyarrow.parquet as pq

    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        for b in batches:
            writer.write_batch(b)
            n += b.num_rows
            progress.advance(b.num_rows)
    return n


def _write_jsonl(path: Path, batches: Iterable[pa.RecordBatch], progress: Progress) -> int:
    """One JSON object per row (column: value), a record batch at a time."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for b in batches:
            fields = list(b.schema)
            for row in zip(*(c.to_pylist() for c in b.columns), strict=True):
                f.write(_json({fl.name: _plain(v, fl.type)
                               for fl, v in zip(fields, row, strict=True)}) + "\n")
            n += b.num_rows
            progress.advance(b.num_rows)
    return n


def _plain(value: Any, t: pa.DataType) -> Any:
    """An Arrow value as JSON data, as `statehold.state.values` shows typed state: structs
    as objects, maps as objects (a key that is not text, a number or a boolean as its
    JSON), timestamps and dates as ISO text, decimals as their exact text, binary as
    base64, a float that JSON has no number for as Spark's ``to_json`` writes it."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_struct(t):
        return {f.name: _plain(value.get(f.name), f.type) for f in t}
    if pa.types.is_map(t):
        return {_map_key(_plain(k, t.key_type)): _plain(v, t.item_type) for k, v in value}
    if pa.types.is_list(t):
        return [_plain(v, t.value_type) for v in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _map_key(key: Any) -> Any:
    if isinstance(key, str | int | float | bool) or key is None:
        return key
    return _json(key)


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


def read_schema_file(path: Path) -> StateSchema:
    """``--schema FILE``: the key and value schemas as JSON (Spark's StructType form)."""
    from statehold.spark_checkpoints.state_schema import MAX_SCHEMA_BYTES, parse_state_schema_json

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_BYTES + 1)
    except OSError as e:
        raise SparkCheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse_state_schema_json(data, str(path))


_SCHEMA_HINT = ('with --schema FILE (JSON: {"key": <StructType JSON>, "value": '
                '<StructType JSON>})')


def state_command(
    checkpoint: Annotated[str, typer.Argument(
        help="A statehold checkpoint (chk-N, savepoints/NAME, or a job directory: its "
        "newest retained checkpoint), or a Spark checkpoint location (a query's "
        "checkpointLocation). Plain path, file:// or s3://bucket/prefix.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (created; empty).")],
    fmt: Annotated[Format, typer.Option("--format", help="parquet or jsonl.")] = Format.parquet,
    operator: Annotated[
        str | None, typer.Option(
            "--operator", help="Operator to read (if several): its name in a job directory, "
            "its number in a Spark checkpoint location.")
    ] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", min=0, help="A Spark checkpoint location only: the state as this "
        "committed batch left it (default: the newest committed).")] = None,
    store: Annotated[str | None, typer.Option(
        "--store", help="A Spark checkpoint location only: the store's name (if the "
        "operator has several, e.g. a stream-stream join's left-keyToNumValues).")] = None,
    schema: Annotated[Path | None, typer.Option(
        "--schema", help="A Spark checkpoint location only: the key and value schemas, where "
        'the location holds none it can read: a JSON file {"key": ..., "value": ...}, each '
        "Spark's StructType JSON (StructType.json()).")] = None,
    state_var: Annotated[str | None, typer.Option(
        "--state-var", help="A Spark checkpoint location only: a transformWithState "
        "operator's state variable (its column family; the registered timers are "
        "$eventTimers_keyToTimestamp or $procTimers_keyToTimestamp); a list state's rows "
        "one per element.")] = None,
    as_json: JsonOption = False,
    ha: HaOption = None,
) -> None:
    """Write the keyed state of a checkpoint, one row per key. A job directory's: key + one
    column per state. A Spark checkpoint location's: one store of one operator as a
    committed batch left it, the key's columns then the value's, one file per partition."""
    given_spark = [o for o, v in (("--batch", batch), ("--store", store),
                                  ("--schema", schema), ("--state-var", state_var))
                   if v is not None]
    not_spark = (f"not a Spark checkpoint location, which {', '.join(given_spark)} apply to "
                 "only") if given_spark else ""
    with handle_errors(as_json), RichProgress(not as_json) as progress, opened(
        checkpoint, ha, or_else=not_spark
    ) as location:
        spark = location if isinstance(location, SparkLocation) else None
        if spark is not None:
            if operator is not None and not operator.isdecimal():
                fail(f"--operator {operator}: a Spark checkpoint location's operators are "
                     "numbers", as_json=as_json)
            try:
                given = read_schema_file(schema) if schema is not None else None
                spark_result = dump_spark_state(
                    spark, out, fmt, batch=batch,
                    operator=None if operator is None else int(operator), store=store,
                    schema=given, state_var=state_var, progress=progress)
            except StateSchemaUnreadable as e:
                fail(f"{e} {_SCHEMA_HINT}", as_json=as_json)
            except OSError as e:
                fail(f"{out}: {e}", as_json=as_json)
        else:
            if given_spark:
                fail(f"{checkpoint}: not a Spark checkpoint location, which "
                     f"{', '.join(given_spark)} apply to only", as_json=as_json)
            try:
                result = dump_state(job_only(location, "state").target, out, fmt, operator,
                                    progress=progress)
            except OSError as e:
                fail(f"{out}: {e}", as_json=as_json)

    if spark is not None:
        def render_spark() -> None:
            say(
                f"{spark_result.checkpoint} (operator {spark_result.operator}, "
                f"{spark_result.store}"
                + (f" {spark_result.state_var}" if spark_result.state_var else "")
                + f", batch {spark_result.batch}): {spark_result.rows} "
                f"rows, columns {', '.join(spark_result.columns)} -> {spark_result.out} "
                f"({len(spark_result.files)} {spark_result.format} files)"
            )

        emit(spark_result, as_json, render_spark)
        return

    def render() -> None:
        say(
            f"{result.checkpoint} ({result.operator}): {result.rows} keys, columns "
            f"{', '.join(result.columns)} -> {result.out} ({len(result.files)} "
            f"{result.format} files)"
        )

    emit(result, as_json, render)


class SparkStateDelete(BaseModel):
    """What ``statehold state delete`` wrote (`transform.DeleteReport`'s keys)."""

    kind: Literal["spark-checkpoint"] = "spark-checkpoint"
    source: str
    dest: str
    batch: int
    operator: int
    name: str
    store: str
    partitions: int
    keys_given: int
    deleted: int
    not_found: int
    #: Rows removed, by store (a join's: each key's count and every buffered row of it).
    removed: dict[str, int]
    side: str | None
    rows_read: int
    rows_written: int
    per_partition: list[int]
    files: int
    bytes: int
    verified: bool


def read_keys(path: Path) -> list[dict[str, Any]]:
    """``--keys FILE``: one JSON object per line (blank lines skipped), the key's column
    names to values; a line that is not one is refused in one line, naming it."""
    keys: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SparkCheckpointError(
                        f"{path} line {number}: not JSON ({e.msg})") from None
                if not isinstance(doc, dict) or not doc:
                    raise SparkCheckpointError(
                        f"{path} line {number}: not a JSON object of the key's columns")
                keys.append(doc)
    except OSError as e:
        raise SparkCheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise SparkCheckpointError(f"{path}: not UTF-8 text") from None
    if not keys:
        raise SparkCheckpointError(f"{path}: no keys in it; nothing written")
    return keys


def delete_command(
    checkpoint: Annotated[str, typer.Argument(
        help="A Spark checkpoint location (a query's checkpointLocation: path, file://, "
        "s3://, ...).", show_default=False)],
    dest: Annotated[str, typer.Argument(
        help="An empty or absent destination (path, file://, s3://, ...).",
        show_default=False)],
    operator: Annotated[int, typer.Option(
        "--operator", min=0, help="The operator whose keys are deleted (its number: an "
        "aggregation, dropDuplicates, flatMapGroupsWithState, a session window, a "
        "stream-stream join, ...).",
        show_default=False)],
    keys: Annotated[Path, typer.Option(
        "--keys", help='The keys to delete: JSON lines, one object per key, the key\'s '
        'column names to values (timestamps as ISO 8601 text, a window as {"start": ..., '
        '"end": ...}); of a transformWithState operator, its grouping key\'s (the groupBy '
        "columns): their records go from every state variable, timer and TTL family.",
        show_default=False)],
    side: Annotated[Side | None, typer.Option(
        "--side", help="A stream-stream join's keys (its join key's columns) are removed "
        "from both sides' state; left or right: from that side's only.",
        show_default=False)] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", min=0, help="The batch to restart after (default: the newest committed "
        "one a restart can start after).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a new checkpoint location at DEST whose state is the source's without the keys
    given (a stream-stream join's: each key's count and buffered rows, on both sides or
    --side's). The operator's other rows, the other operators and the logs are as they were;
    the source is never modified; DEST's commit is written last and DEST is verified. A
    query started with checkpointLocation=DEST continues from the next batch as if those
    keys had never been seen."""
    from statehold.cli.common import spark_only

    with handle_errors(as_json), RichProgress(not as_json) as progress:
        given = read_keys(keys)
        with opened(checkpoint, None) as location:
            report = spark_only(location, "state delete").delete_keys(
                dest, operator=operator, keys=given, side=side.value if side else None,
                batch=batch, progress=progress)
    result = SparkStateDelete(**report.model_dump(include=set(SparkStateDelete.model_fields)))

    def render() -> None:
        say(f"batch {result.batch}, operator {result.operator} ({result.name}) store "
            f"{result.store}: {result.deleted} of {result.keys_given} keys deleted "
            f"({result.not_found} not in the state), {result.rows_written} rows kept -> "
            f"{result.dest} ({result.files} files)" + (", verified" if result.verified else ""))

    emit(result, as_json, render)


class _StateGroup(TyperGroup):
    """``statehold state CKPT ...`` is ``statehold state read CKPT ...``: what the command
    was before it had a subcommand."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["read", *args]
        return super().parse_args(ctx, args)


state_app = typer.Typer(
    cls=_StateGroup, no_args_is_help=True,
    help="Read or delete keyed state. `statehold state CKPT --out DIR` reads (the read "
    "command); `statehold state delete CKPT DEST --operator OP --keys FILE` deletes keys of "
    "a Spark checkpoint location's state into a new location.")
state_app.command("read")(state_command)
state_app.command("delete")(delete_command)


def register(app: typer.Typer) -> None:
    app.add_typer(state_app, name="state")
