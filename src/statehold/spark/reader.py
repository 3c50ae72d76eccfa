"""Read the keyed state of any checkpoint: as a Spark DataFrame, or in plain Python.

    df = read_state(spark, "/ckpt/running-totals")          # newest retained checkpoint
    df = read_state(spark, "/ckpt/running-totals/chk-7", schema="count long, sum long")
    for key, states in iter_state("s3://bucket/ckpt/job/savepoints/before-upgrade"): ...

One row per key: the key column, then one column per state name. Without a schema each
value is its JSON text (list state a JSON array, map state a JSON object); with a schema
the named states become typed columns. `read_state` reads distributed: one Spark task per
key-group range of the checkpoint, each restoring that range into a temporary RocksDB on
the executor and streaming its rows out with ``mapInArrow``. Nothing is written to the job
directory and nothing is ever unpickled (stored values are JSON).

A string key is returned as is; a bytes key (only possible through the backend API) as
its UTF-8 text with undecodable bytes escaped (``backslashreplace``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statehold.backend.keys import Key
from statehold.backend.rocks import StateBackendError, TaskStateBackend
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupState,
    MetadataError,
    OperatorSchemas,
)
from statehold.job.locate import TargetLike, ToolError, opened, read
from statehold.state.json_codec import EntryDecoders
from statehold.state.values import recorded_decoders
from statehold.storage import Storage, open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

KEY_COLUMN = "key"
_STATES = "__statehold_states"
_BATCH_ROWS = 10_000


class StateReadError(ToolError):
    """The checkpoint's state cannot be read as asked (no such operator, bad files...)."""


@dataclass(frozen=True)
class StateSource:
    """One checkpoint's state of one operator: where it is and its key-group ranges."""

    job: Storage
    metadata_key: str
    operator: str
    max_parallelism: int
    ranges: tuple[KeyGroupState, ...]
    #: the operator's recorded state schemas (typed variables), if any
    schemas: OperatorSchemas | None = None

    @property
    def decoders(self) -> dict[str, EntryDecoders]:
        return recorded_decoders(self.schemas)

    @property
    def uri(self) -> str:
        return f"{self.job.uri.rstrip('/')}/{self.metadata_key}"


def locate_state(
    checkpoint: TargetLike,
    operator: str | None = None,
    *,
    ha: str | None = None,
    **storage_options: Any,
) -> StateSource:
    """Resolve `checkpoint` (chk-N, savepoints/NAME, or a job directory = its newest
    retained checkpoint) and pick `operator` (may be omitted if there is only one)."""
    with opened(checkpoint, ha=ha, checkpoint=True, **storage_options) as target:
        assert target.metadata_key is not None
        meta = read(target)
    op = _pick_operator(meta, operator, target.uri)
    ranges = next(o.ranges for o in meta.operators if o.operator == op)
    schemas = None if meta.state_schemas is None else meta.state_schemas.get(op)
    return StateSource(
        target.storage, target.metadata_key, op, meta.max_parallelism, tuple(ranges), schemas
    )


def _pick_operator(meta: CheckpointMetadata, operator: str | None, where: str) -> str:
    names = [o.operator for o in meta.operators]
    if operator is not None:
        if operator not in names:
            raise StateReadError(f"{where}: no operator {operator!r} (it has {names})")
        return operator
    if len(names) != 1:
        raise StateReadError(
            f"{where}: {len(names)} operators {names}; name the one to read (operator=...)"
        )
    return names[0]


def key_text(key: Key) -> str:
    return key if isinstance(key, str) else key.decode("utf-8", "backslashreplace")


@contextmanager
def open_range(
    job: Storage, metadata_key: str, operator: str, max_parallelism: int, kgs: KeyGroupState
) -> Iterator[TaskStateBackend]:
    """One key-group range restored into a temporary local RocksDB (deleted after)."""
    with tempfile.TemporaryDirectory(prefix="statehold-read-") as tmp:
        try:
            backend = TaskStateBackend.open(
                Path(tmp), operator, kgs.key_groups, max_parallelism, [(job, metadata_key, kgs)]
            )
        except StateBackendError as e:
            raise StateReadError(f"{job.uri.rstrip('/')}/{metadata_key}: {e}") from e
        with backend:
            yield backend


def iter_state(
    checkpoint: TargetLike | StateSource,
    operator: str | None = None,
    **storage_options: Any,
) -> Iterator[tuple[Key, dict[str, Any]]]:
    """Every key of the checkpoint with all its state, ``(key, {state name: value})``, one
    key-group range after the other (no Spark). Values are decoded JSON: list state a
    list, map state a dict."""
    src = (
        checkpoint
        if isinstance(checkpoint, StateSource)
        else locate_state(checkpoint, operator, **storage_options)
    )
    decoders = src.decoders
    for kgs in src.ranges:
        with open_range(src.job, src.metadata_key, src.operator, src.max_parallelism, kgs) as b:
            yield from b.items(decoders)


@contextmanager
def open_all(src: StateSource) -> Iterator[list[TaskStateBackend]]:
    """Every range of `src` restored and open at once (for readers that need the state
    names of all ranges before writing the first row)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                open_range(src.job, src.metadata_key, src.operator, src.max_parallelism, kgs)
            )
            for kgs in src.ranges
        ]


def to_json(value: Any) -> str:
    """A decoded state value as compact JSON text (what untyped columns show)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class CheckpointState:
    """One checkpoint's state of one operator as plain data: what a Spark task needs to
    open the storage and restore a key-group range itself (nothing open is pickled)."""

    storage_uri: str
    storage_options: Mapping[str, Any]
    metadata_key: str
    operator: str
    max_parallelism: int
    #: the key-group ranges, each a `KeyGroupState` as JSON; a task reads one by index
    ranges: tuple[str, ...]
    #: the operator's recorded state schemas as JSON (typed variables), if any
    schemas_json: str | None = None

    @classmethod
    def of(cls, src: StateSource, storage_options: Mapping[str, Any]) -> CheckpointState:
        return cls(
            src.job.uri,
            dict(storage_options),
            src.metadata_key,
            src.operator,
            src.max_parallelism,
            tuple(r.model_dump_json() for r in src.ranges),
            None if src.schemas is None else src.schemas.model_dump_json(),
        )

    @property
    def schemas(self) -> OperatorSchemas | None:
        text = self.schemas_json
        return None if text is None else OperatorSchemas.model_validate_json(text)

    def rows(
        self, index: int, decoders: Mapping[str, EntryDecoders]
    ) -> Iterator[tuple[Key, dict[str, Any]]]:
        """Every key of range `index` with its state (the range restored into a temporary
        local RocksDB, deleted after)."""
        job = open_storage(self.storage_uri, **dict(self.storage_options))
        kgs = KeyGroupState.model_validate_json(self.ranges[index])
        with open_range(job, self.metadata_key, self.operator, self.max_parallelism, kgs) as b:
            yield from b.items(decoders)


def state_batches(
    rows: Iterable[tuple[Key, dict[str, Any]]], schema: pa.Schema | None, key_column: str
) -> Iterator[pa.RecordBatch]:
    """`rows` as Arrow batches of at most `_BATCH_ROWS`: with `schema`, exactly its
    columns (the key column, then the named states, typed); without, the key column and
    a map of every state's JSON text."""
    chunk: list[tuple[Key, dict[str, Any]]] = []
    for item in rows:
        chunk.append(item)
        if len(chunk) >= _BATCH_ROWS:
            yield _batch(chunk, schema, key_column)
            chunk = []
    if chunk:
        yield _batch(chunk, schema, key_column)


def _batch(
    rows: Sequence[tuple[Key, dict[str, Any]]], schema: pa.Schema | None, key_column: str
) -> pa.RecordBatch:
    keys = pa.array([key_text(k) for k, _ in rows], pa.string())
    if schema is None:
        states = pa.array(
            [[(n, to_json(v)) for n, v in sorted(s.items())] for _, s in rows],
            pa.map_(pa.string(), pa.string()),
        )
        return pa.RecordBatch.from_arrays([keys, states], names=[key_column, _STATES])
    arrays: list[pa.Array] = []
    for f in schema:
        if f.name == key_column:
            arrays.append(keys.cast(f.type))
        else:
            values = [s.get(f.name) for _, s in rows]
            try:
                arrays.append(pa.array(values, f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                raise StateReadError(
                    f"state {f.name!r} does not fit the column type {f.type}: {e}"
                ) from e
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True)
class _ReadTask:
    """The executor side of `read_state`: partition i reads range i (plain data only)."""

    state: CheckpointState
    #: None: emit key + a map of JSON strings; else emit exactly this schema.
    schema: pa.Schema | None
    key_column: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        indices = [i for b in batches for i in b.column(0).to_pylist()]
        decoders = recorded_decoders(self.state.schemas)
        for index in indices:
            yield from state_batches(
                self.state.rows(index, decoders), self.schema, self.key_column
            )


def read_state(
    spark: SparkSession,
    checkpoint: str,
    operator: str | None = None,
    *,
    schema: StructType | str | None = None,
    key_column: str = KEY_COLUMN,
    **storage_options: Any,
) -> DataFrame:
    """The keyed state of `checkpoint` as a DataFrame: `key_column`, then one column per
    state name (sorted) holding the value as JSON text. With `schema` (a StructType or DDL
    like ``"count long, last array<long>"``) exactly those states, typed (the key column
    is added first if the schema lacks it; a state a key lacks is null).

    Without a schema the state names are found by reading the state once; the rows are
    kept (``localCheckpoint``) so the state is not read twice."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StringType, StructField
    from pyspark.sql.types import StructType as Struct

    src = locate_state(checkpoint, operator, **storage_options)
    state = CheckpointState.of(src, storage_options)
    count = len(state.ranges)
    ids = spark.range(0, count, 1, numPartitions=max(1, count))
    ids = ids.select(ids["id"].cast("int").alias("i"))

    def task(arrow_schema: pa.Schema | None) -> _ReadTask:
        return _ReadTask(state, arrow_schema, key_column)

    if schema is not None:
        struct = schema if isinstance(schema, Struct) else _parse_ddl(spark, schema)
        if key_column not in struct.fieldNames():
            struct = Struct([StructField(key_column, StringType(), False), *struct.fields])
        return ids.mapInArrow(task(to_arrow_schema(struct)), struct)

    raw_schema = f"`{key_column}` string, `{_STATES}` map<string,string>"
    raw = ids.mapInArrow(task(None), raw_schema).localCheckpoint(eager=True)
    names = sorted(
        r[0] for r in raw.select(F.explode(F.map_keys(raw[_STATES]))).distinct().collect()
    )
    if key_column in names:
        raise StateReadError(
            f"{src.uri}: a state is named {key_column!r} like the key column; pass "
            "key_column=... with another name"
        )
    return raw.select(raw[key_column], *[raw[_STATES][n].alias(n) for n in names])


def _parse_ddl(spark: SparkSession, ddl: str) -> StructType:
    schema: StructType = spark.createDataFrame([], ddl).schema
    return schema


__all__ = [
    "KEY_COLUMN",
    "CheckpointState",
    "MetadataError",
    "StateReadError",
    "StateSource",
    "iter_state",
    "key_text",
    "locate_state",
    "open_all",
    "open_range",
    "read_state",
    "state_batches",
    "to_json",
]
