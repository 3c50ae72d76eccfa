"""``spark.read.format("statehold")``: statehold's state and figures as a Spark data source.

    statehold.spark.register_data_source(spark)      # StatefulJob(...) also registers it
                                                     # (statehold.spark.registration)
    spark.read.format("statehold").load("/ckpt/totals")                       # newest checkpoint
    spark.read.format("statehold").option("savepoint", "v1").option("stateVar", "count") ...
    spark.read.format("statehold").option("view", "history").load("/ckpt/totals")
    spark.read.format("statehold").option("view", "batches").load("/chk/orders")  # Spark's own

PySpark 4's Python data sources (`pyspark.sql.datasource`); on 3.5 `register_data_source`
refuses in one line and `read_state` is the reader. What a read gives depends on the
directory and `view`:

- a job directory (or its ``chk-N`` / ``savepoints/NAME``), ``view=state`` (the
  default): the keyed state of the newest retained checkpoint, or of ``checkpointId`` /
  ``savepoint``, of ``operator`` (needed only where there are several). Without
  ``stateVar``: one row per key and state variable, ``key, state, value`` with the value
  as JSON text. With ``stateVar``: one row per key holding that variable, ``key, value``,
  the value typed by the schema the checkpoint recorded (list state an array, map state a
  map; JSON text where none is recorded). With ``.schema("key string, count long, ...")``:
  one row per key, the named variables typed as given (as `read_state`'s `schema`).
  One partition per key-group range: each task opens the storage and restores its range
  itself, as `read_state`'s tasks do, with the same decoding (`statehold.spark.reader`).
- a job directory, ``view=history``: statehold's per-checkpoint figures (one row per
  history record, `statehold.spark.history`), to join with Spark's progress by batch id.
- a Spark checkpoint location (any query's ``checkpointLocation``): Spark's own state
  rows are Spark's ``format("statestore")`` source's to decode (UnsafeRow, per operator
  and store format); statehold gives its inspection views of the location instead,
  ``view=batches|stores|files|needs|history`` (`statehold.spark.checkpoint_views`), and
  without a view says so in one line.

Options are case-insensitive; an unknown one, or two that contradict, is refused in one
line naming the ones there are. Storage options go as ``storage.<name>`` (e.g.
``storage.endpoint_url``). Nothing is ever unpickled and nothing is written.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statehold.errors import StateholdError
from statehold.format import layout
from statehold.job.directory import open_job
from statehold.job.history import HistoryRecord, read_history
from statehold.job.locate import split_location
from statehold.spark.checkpoint_views import VIEWS as SPARK_VIEWS
from statehold.spark.checkpoint_views import is_spark_checkpoint, view_rows, view_schema
from statehold.spark.history import history_schema
from statehold.spark.reader import (
    KEY_COLUMN,
    CheckpointState,
    StateReadError,
    key_text,
    locate_state,
    state_batches,
    to_json,
)
from statehold.state.ddl import parse_ddl
from statehold.state.values import column_type, recorded_decoders, typed_decoders
from statehold.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

NAME = "statehold"
STATE_COLUMN = "state"
VALUE_COLUMN = "value"
JOB_VIEWS = ("state", "history")
#: The options a read takes (lower case, as Spark hands them over), besides storage.*.
OPTIONS = ("path", "view", "checkpointid", "savepoint", "operator", "statevar", "ha")
STORAGE_PREFIX = "storage."


class DataSourceError(StateholdError):
    """``format("statehold")`` cannot read as asked; the message says why in one line."""


class DataSourceUnavailableError(DataSourceError):
    """This PySpark has no Python data sources (they came with 4.0)."""


def data_sources_supported() -> bool:
    """Whether this PySpark has Python data sources (4.0 and newer)."""
    try:
        return importlib.util.find_spec("pyspark.sql.datasource") is not None
    except ModuleNotFoundError:
        return False


# -- options -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadOptions:
    """A read's options, checked: one line for the first that is wrong."""

    path: str
    view: str | None = None
    checkpoint_id: int | None = None
    savepoint: str | None = None
    operator: str | None = None
    state_var: str | None = None
    ha: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()}
        storage = {
            k[len(STORAGE_PREFIX):]: v for k, v in given.items() if k.startswith(STORAGE_PREFIX)
        }
        unknown = sorted(k for k in given if k not in OPTIONS and not k.startswith(STORAGE_PREFIX))
        if unknown:
            raise DataSourceError(
                f'format("statehold"): unknown option {unknown[0]!r}; the options are '
                "view, checkpointId, savepoint, operator, stateVar, ha and storage.<name>"
            )
        path = given.get("path")
        if not path:
            raise DataSourceError('format("statehold") needs a path: .load("<job directory>")')
        checkpoint_id = None
        if "checkpointid" in given:
            text = given["checkpointid"]
            if not (text.isascii() and text.isdigit()):
                raise DataSourceError(
                    f"checkpointId must be a checkpoint number (0, 1, ...), not {text!r}"
                )
            checkpoint_id = int(text)
        if checkpoint_id is not None and given.get("savepoint"):
            raise DataSourceError("give checkpointId or savepoint, not both")
        savepoint = given.get("savepoint") or None
        if savepoint is not None:
            try:
                layout.check_savepoint_name(savepoint)
            except StateholdError as e:
                raise DataSourceError(f"savepoint: {e}") from e
        return cls(
            path=path,
            view=given.get("view", "").lower() or None,
            checkpoint_id=checkpoint_id,
            savepoint=savepoint,
            operator=given.get("operator") or None,
            state_var=given.get("statevar") or None,
            ha=given.get("ha") or None,
            storage_options=storage,
        )

    @property
    def target(self) -> str:
        """The location to read: the path, or its checkpoint or savepoint named by option."""
        base = self.path.rstrip("/")
        if self.checkpoint_id is None and self.savepoint is None:
            return self.path
        if split_location(base)[1] is not None:
            raise DataSourceError(
                f"{self.path} already names a checkpoint or savepoint; give the job "
                "directory with checkpointId or savepoint, or this path alone"
            )
        if self.checkpoint_id is not None:
            return f"{base}/{layout.checkpoint_dir(self.checkpoint_id)}"
        assert self.savepoint is not None
        return f"{base}/{layout.savepoint_dir(self.savepoint)}"

    def state_only(self, what: str) -> None:
        for name, value in (
            ("checkpointId", self.checkpoint_id), ("savepoint", self.savepoint),
            ("operator", self.operator), ("stateVar", self.state_var),
        ):
            if value is not None:
                raise DataSourceError(f"option {name} is for view=state; {what}")


# -- plans: what the tasks read, as plain data ------------------------------------------------
@dataclass(frozen=True)
class StatePlan:
    """view=state: one partition per key-group range of one checkpoint."""

    state: CheckpointState
    #: None: the long layout (key, state, value JSON); a name: that variable, typed
    state_var: str | None
    #: a user's schema: the wide layout, exactly these columns (as `read_state`'s schema)
    wide: pa.Schema | None = None
    #: whether `state_var` has a recorded type (else its value is JSON text)
    typed: bool = False

    def partitions(self) -> list[int]:
        return list(range(len(self.state.ranges)))

    def read(self, index: int) -> Iterator[Any]:
        if self.wide is not None:
            decoders = recorded_decoders(self.state.schemas)
            yield from state_batches(self.state.rows(index, decoders), self.wide, KEY_COLUMN)
            return
        if self.state_var is None:
            for key, states in self.state.rows(index, recorded_decoders(self.state.schemas)):
                text = key_text(key)
                for name, value in sorted(states.items()):
                    yield text, name, to_json(value)
            return
        name = self.state_var
        schemas = self.state.schemas
        decoders = typed_decoders(schemas) if self.typed else recorded_decoders(schemas)
        for key, states in self.state.rows(index, decoders):
            if name in states:
                value = states[name]
                yield key_text(key), (value if self.typed else to_json(value))


@dataclass(frozen=True)
class ViewPlan:
    """A small table read in one task: a job's history or a Spark checkpoint's view."""

    uri: str
    storage_options: dict[str, str]
    view: str
    spark_checkpoint: bool

    def partitions(self) -> list[int]:
        return [0]

    def read(self, index: int) -> Iterator[Any]:
        if self.spark_checkpoint:
            yield from view_rows(self.view, self.uri, self.storage_options)
            return
        names = list(HistoryRecord.model_fields)
        for record in read_history(open_storage(self.uri, **self.storage_options), None):
            yield tuple(getattr(record, n) for n in names)


Plan = StatePlan | ViewPlan


def plan(
    options: Mapping[str, str], schema: StructType | None
) -> tuple[StructType | str, Plan]:
    """What to read for these options (and a user's schema, if given): the columns and
    the plan the tasks carry out. Runs where Spark plans the read (the driver's Python)."""
    from pyspark.sql.types import StringType, StructField, StructType

    opts = ReadOptions.parse(options)
    storage = open_storage(opts.path, **opts.storage_options)
    if is_spark_checkpoint(storage):
        if opts.view not in SPARK_VIEWS:
            raise DataSourceError(
                f"{opts.path} is a Spark checkpoint location: its state rows are Spark's own "
                '(read them with format("statestore")); format("statehold") gives its views: '
                f"option view={'|'.join(SPARK_VIEWS)}"
            )
        opts.state_only(f"{opts.path} is a Spark checkpoint location")
        return view_schema(opts.view), ViewPlan(
            storage.uri, opts.storage_options, opts.view, True
        )
    view = opts.view or "state"
    if view not in JOB_VIEWS:
        raise DataSourceError(
            f"view={view!r}: a statehold job directory has the views {'|'.join(JOB_VIEWS)} "
            f"({'|'.join(SPARK_VIEWS)} are for a Spark checkpoint location)"
        )
    if view == "history":
        opts.state_only("view=history lists every checkpoint")
        try:
            open_job(storage, opts.ha).close()  # a job directory, or one line saying not
        except StateholdError as e:
            raise DataSourceError(str(e)) from e
        history = parse_ddl(history_schema())
        assert isinstance(history, StructType)
        return history, ViewPlan(storage.uri, opts.storage_options, view, False)

    try:
        src = locate_state(opts.target, opts.operator, ha=opts.ha, **opts.storage_options)
    except StateholdError as e:
        raise DataSourceError(str(e)) from e
    state = CheckpointState.of(src, opts.storage_options)
    if schema is not None and len(schema.fields) > 0:
        if opts.state_var is not None:
            raise DataSourceError("give stateVar or a schema (.schema(...)), not both")
        from pyspark.sql.pandas.types import to_arrow_schema

        # exactly the schema's columns (Spark expects them): the key only where it names it
        return schema, StatePlan(state, None, wide=to_arrow_schema(schema))
    if opts.state_var is None:
        return StructType([
            StructField(KEY_COLUMN, StringType(), False),
            StructField(STATE_COLUMN, StringType(), False),
            StructField(VALUE_COLUMN, StringType(), True),
        ]), StatePlan(state, None)
    var = None if src.schemas is None else src.schemas.variables.get(opts.state_var)
    dtype = None if var is None else column_type(var)
    return StructType([
        StructField(KEY_COLUMN, StringType(), False),
        StructField(VALUE_COLUMN, dtype or StringType(), True),
    ]), StatePlan(state, opts.state_var, typed=dtype is not None)


__all__ = [
    "NAME",
    "DataSourceError",
    "DataSourceUnavailableError",
    "ReadOptions",
    "StateReadError",
    "data_sources_supported",
    "plan",
]
