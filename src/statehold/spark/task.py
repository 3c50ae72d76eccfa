"""The executor side: what runs inside a Spark task.

Two Python stages, both `mapInArrow`:

1. `KeyGroupStage` adds each row's state key, key group and owning task index (stable
   BLAKE2b hash from `backend.keys`, never Python's salted ``hash``), refusing null keys.
2. After routing by task (`statehold.spark.routing`) partition *i* holds exactly the rows of
   task *i* (and runs even when empty). `StateStage` opens the task's RocksDB backend for
   its key-group range (restoring from the previous checkpoint's handles), runs the user
   function per key, snapshots to the job directory and emits the user's rows plus one
   acknowledgement row: the `KeyGroupState` handle as JSON, for the driver.

Only plain data crosses into the closure: URIs, option dicts, JSON handles, schemas. State
itself never leaves the task except as files in the job directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from statehold.backend.keys import key_group_of, task_of, task_range
from statehold.errors import StateholdError
from statehold.format.metadata import KeyGroupState
from statehold.processor.output import Output
from statehold.spark.api import BatchFunction, InputFormat, KeyedState, KeyFunction

if TYPE_CHECKING:
    from statehold.processor.runner import ProcessorSpec
    from statehold.storage import Storage

KEY_COL = "__statehold_key"
KG_COL = "__statehold_kg"
TASK_COL = "__statehold_task"
ACK_COL = "__statehold_ack"
#: a struct of the initial state's row on initial-state rows, null on input rows
INIT_COL = "__statehold_init"
INTERNAL_COLS = (KEY_COL, KG_COL, TASK_COL)


class MalformedInputError(StateholdError, ValueError):
    """An input row cannot be keyed (a null key, an unsupported key type)."""


def state_key(values: Sequence[Any]) -> str:
    """The string a row's key is stored and hashed under: a single string key as itself,
    anything else (numbers, several key columns) as compact canonical JSON."""
    if len(values) == 1:
        v = values[0]
        if isinstance(v, str):
            return v
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False, default=str)


def _describe_row(batch: pa.RecordBatch, i: int) -> str:
    row = {name: batch.column(j)[i].as_py() for j, name in enumerate(batch.schema.names)}
    return json.dumps(row, default=str)[:500]


@dataclass(frozen=True)
class KeyGroupStage:
    """Stage 1: add key, key group and task index columns."""

    key_columns: tuple[str, ...]
    parallelism: int
    max_parallelism: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = [batch.column(c) for c in self.key_columns]
            for name, col in zip(self.key_columns, columns, strict=True):
                if col.null_count:
                    first = next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
                    raise MalformedInputError(
                        f"null in key column {name!r}; statehold refuses rows without a key "
                        f"(filter or fill them before the stateful step). Row: "
                        f"{_describe_row(batch, first)}"
                    )
            values = [c.to_pylist() for c in columns]
            keys = [state_key(vs) for vs in zip(*values, strict=True)]
            groups = [key_group_of(k, self.max_parallelism) for k in keys]
            tasks = [task_of(g, self.parallelism, self.max_parallelism) for g in groups]
            yield (
                batch.append_column(KEY_COL, pa.array(keys, pa.string()))
                .append_column(KG_COL, pa.array(groups, pa.int32()))
                .append_column(TASK_COL, pa.array(tasks, pa.int32()))
            )


@dataclass(frozen=True)
class StateSpec:
    """Everything a task needs, as plain picklable data (no state, no connections)."""

    storage_uri: str
    storage_options: Mapping[str, Any]
    job_id: str
    operator: str
    epoch: int
    checkpoint_id: int
    max_parallelism: int
    parallelism: int
    #: metadata key of the checkpoint to restore from, and its ranges as JSON
    restore_key: str | None
    restore_ranges: tuple[str, ...]
    key_columns: tuple[str, ...]
    order_by: tuple[str, ...]
    output_schema: pa.Schema
    input_format: InputFormat
    function: KeyFunction | BatchFunction
    vectorized: bool
    local_dir: str | None = None
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    #: the batch's processing time (ms): state TTLs are measured on it
    processing_time_ms: int | None = None
    #: set when the function is a stateful processor (`transform_with_state`)
    processor: ProcessorSpec | None = None


class _States:
    """`TaskStates` over one open backend; checks every key belongs to this task."""

    def __init__(self, backend: Any, spec: StateSpec, task: int) -> None:
        self._backend = backend
        self._spec = spec
        self._task = task

    def for_key(self, key: Any) -> KeyedState:
        values = key if isinstance(key, tuple) else (key,)
        skey = state_key(values)
        kg = key_group_of(skey, self._spec.max_parallelism)
        if task_of(kg, self._spec.parallelism, self._spec.max_parallelism) != self._task:
            raise KeyNotInTaskError(f"key {key!r} is not in this task's key groups")
        state: KeyedState = self._backend.for_key(skey)
        return state


def internal_output_schema(user: pa.Schema) -> pa.Schema:
    """The user's columns (nullable: the ack row leaves them empty) plus the ack column."""
    fields = [f.with_nullable(True) for f in user]
    return pa.schema([*fields, pa.field(ACK_COL, pa.string())])


def local_root(spec: StateSpec) -> str:
    """Where tasks keep RocksDB between micro-batches on this executor: one directory per
    job directory (named by job id plus a hash of the job directory's URI), under
    `local_dir`, ``STATEHOLD_LOCAL_DIR`` or the executor's scratch directory."""
    from statehold.backend.local_snapshots import executor_scratch_dir

    base = spec.local_dir or os.environ.get("STATEHOLD_LOCAL_DIR") or executor_scratch_dir()
    digest = hashlib.blake2b(spec.storage_uri.encode(), digest_size=6).hexdigest()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", spec.job_id)[:60]
    return os.path.join(base, "statehold-state", f"{safe}-{digest}")


class RoutingError(StateholdError, RuntimeError):
    """A task received rows of another task's key groups."""


class KeyNotInTaskError(StateholdError, KeyError):
    """A function asked for the state of a key this task does not own."""


@dataclass(frozen=True)
class StateStage:
    """Stage 2: one task's keyed state step for one micro-batch."""

    spec: StateSpec

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from statehold.storage import open_storage

        spec = self.spec
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else 0
        started = time.time()
        table = _rows_of_task(list(batches), task, spec.order_by)
        storage = open_storage(spec.storage_uri, **dict(spec.storage_options))
        backend = self._open_backend(storage, task)
        output = Output(spec.output_schema)
        try:
            report, n_keys = self._process(backend, table, output, task)
            snapshot_started = time.perf_counter()
            handle: KeyGroupState = backend.snapshot(
                storage, spec.epoch, spec.checkpoint_id, _metadata_key(spec.checkpoint_id)
            )
            report["snapshot_seconds"] = round(time.perf_counter() - snapshot_started, 4)
        finally:
            backend.close()
        schema = internal_output_schema(spec.output_schema)
        for res in output.tables():
            for rb in res.to_batches(max_chunksize=10_000):
                arrays = [*rb.columns, pa.nulls(rb.num_rows, pa.string())]
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        ack = {
            "task": task,
            "state": handle.model_dump(mode="json"),
            "rows_in": 0 if table is None else table.num_rows,
            "keys": n_keys,
            "seconds": round(time.time() - started, 3),
            "bytes_downloaded": backend.restore_stats.bytes_downloaded,
            "files_downloaded": backend.restore_stats.files_downloaded,
            **report,
        }
        nulls = [pa.nulls(1, f.type) for f in spec.output_schema]
        acks = pa.array([json.dumps(ack)], pa.string())
        yield pa.RecordBatch.from_arrays([*nulls, acks], schema=schema)

    def _open_backend(self, storage: Storage, task: int) -> Any:
        """The task's RocksDB backend for its key-group range, restored from the ranges
        of the previous checkpoint that overlap it."""
        from statehold.backend.rocks import TaskStateBackend

        spec = self.spec
        key_groups = task_range(task, spec.parallelism, spec.max_parallelism)
        restore = []
        if spec.restore_key is not None:
            for text in spec.restore_ranges:
                kgs = KeyGroupState.model_validate_json(text)
                if kgs.key_groups.overlaps(key_groups):
                    restore.append((storage, spec.restore_key, kgs))
        backend = TaskStateBackend.open(
            Path(local_root(spec)), spec.operator, key_groups, spec.max_parallelism, restore,
            **dict(spec.backend_options),
        )
        backend.now_ms = spec.processing_time_ms
        return backend

    def _process(
        self, backend: Any, table: pa.Table | None, output: Output, task: int
    ) -> tuple[dict[str, Any], int]:
        """The user's function (or processor) over the task's rows, then the TTL sweep:
        the task's report and the number of keys with rows."""
        spec = self.spec
        report: dict[str, Any] = {}
        n_keys = 0
        if spec.processor is not None:
            report, n_keys = _run_processor(spec, backend, table, output)
        elif table is not None and table.num_rows:
            groups = [(k, rows) for _, k, rows in _split_by_key(table, spec)]
            n_keys = len(groups)
            _run_function(spec, groups, _States(backend, spec, task), output)
        if spec.processing_time_ms is not None:
            report.update(_expire(backend, spec.processing_time_ms))
        return report, n_keys


def _rows_of_task(
    received: list[pa.RecordBatch], task: int, order_by: Sequence[str]
) -> pa.Table | None:
    """The task's rows, sorted by key group, key and `order_by` (None: no batch came);
    refused if any belongs to another task."""
    table = pa.Table.from_batches(received) if received else None
    if table is None or not table.num_rows:
        return table
    tasks = set(table.column(TASK_COL).unique().to_pylist())
    if tasks != {task}:
        raise RoutingError(
            f"partition {task} received rows of tasks {sorted(tasks)}: the rows were "
            "not routed by key group (is the parallelism consistent?)"
        )
    sort = [(KG_COL, "ascending"), (KEY_COL, "ascending")]
    sort += [(c, "ascending") for c in order_by]
    return table.sort_by(sort)


def _run_function(
    spec: StateSpec, groups: list[tuple[Any, Any]], states: _States, output: Output
) -> None:
    """The user's function: once per key, or once over every key (`vectorized`)."""
    if spec.vectorized:
        fn_batch: BatchFunction = spec.function  # type: ignore[assignment]
        output.add(fn_batch(groups, states))
        return
    fn_key: KeyFunction = spec.function  # type: ignore[assignment]
    for key, rows in groups:
        output.add(fn_key(key, rows, states.for_key(key)))


def _metadata_key(checkpoint_id: int) -> str:
    from statehold.format.layout import checkpoint_metadata_key

    return checkpoint_metadata_key(checkpoint_id)


def _expire(backend: Any, now_ms: int) -> dict[str, Any]:
    """Sweep the task's expired TTL state; compact if deletions (the sweep's, timers
    fired, state cleared) left much garbage."""
    from statehold.backend.ttl import expire_and_compact

    expired, compacted = expire_and_compact(
        backend._require_kv(), backend._require_db(), backend.key_groups, now_ms,
        backend.max_garbage,
    )
    return {"ttl_expired": expired, "ttl_compactions": int(compacted)}


def _run_processor(
    spec: StateSpec, backend: Any, table: pa.Table | None, output: Output
) -> tuple[dict[str, Any], int]:
    """The processor's batch in this task (statehold.processor.runner): its report and
    the number of keys with rows."""
    from statehold.processor.runner import filter_late, run_processor

    assert spec.processor is not None
    initial: list[tuple[str, Any, Any]] = []
    if table is not None and INIT_COL in table.column_names:
        is_initial = table.column(INIT_COL).is_valid()
        states = table.filter(is_initial)
        if states.num_rows:
            struct = states.column(INIT_COL).combine_chunks()
            user = pa.Table.from_arrays(struct.flatten(), names=[f.name for f in struct.type])
            initial = _split_by_key(states, spec, user)
        table = table.filter(pc.invert(is_initial)).drop_columns([INIT_COL])
    filtered = filter_late(table, spec.processor)
    rows = filtered.table
    groups = _split_by_key(rows, spec) if rows is not None and rows.num_rows else []
    report = run_processor(
        spec.processor, backend, groups, output, len(spec.key_columns), spec.input_format,
        initial,
    )
    report.update(late_rows=filtered.late_rows, max_event_ms=filtered.max_event_ms)
    return report, len(groups)


def _split_by_key(
    table: pa.Table, spec: StateSpec, user: pa.Table | None = None
) -> list[tuple[str, Any, Any]]:
    """Consecutive runs of equal keys in a table sorted by key (stable within a key), each
    as (state key, key value(s), rows in the function's input format; the rows of `user`
    if given, else the table's own columns). Rows are converted to Python once for the
    whole table, not once per key."""
    skeys = table.column(KEY_COL).to_pylist()
    key_cols = [table.column(c).to_pylist() for c in spec.key_columns]
    if user is None:
        user = table.drop_columns(list(INTERNAL_COLS))
    as_rows = user.to_pylist() if spec.input_format == "rows" else None
    groups: list[tuple[str, Any, Any]] = []
    start = 0
    for i in range(1, len(skeys) + 1):
        if i == len(skeys) or skeys[i] != skeys[start]:
            values = tuple(c[start] for c in key_cols)
            key = values[0] if len(values) == 1 else values
            if as_rows is not None:
                rows: Any = as_rows[start:i]
            elif spec.input_format == "pandas":
                rows = user.slice(start, i - start).to_pandas()
            else:
                rows = user.slice(start, i - start)
            groups.append((skeys[start], key, rows))
            start = i
    return groups
