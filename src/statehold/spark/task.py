"""The executor side: what runs inside a Spark task.

1. The keying stage (`statehold.spark.keying`) adds each row's state key, key group and
   owning task index (the job's stable hash from `backend.keys`, never Python's salted
   ``hash``): on the JVM, or in Python for keys Spark SQL cannot hash the same way.
2. After routing by task (`statehold.spark.routing`) partition *i* holds exactly the rows of
   task *i* (and runs even when empty), sorted by key group and key on the JVM side.
   `StateStage`, a ``mapInArrow``, opens the task's RocksDB backend for its key-group range
   (restoring from the previous checkpoint's handles), checks each key's group against the
   job's hash, streams the rows through the user function key by key, emitting its output
   as it goes, snapshots to the job directory and emits, last, one acknowledgement row:
   the `KeyGroupState` handle as JSON, for the driver.

Only plain data crosses into the closure: URIs, option dicts, JSON handles, schemas. State
itself never leaves the task except as files in the job directory.
"""

from __future__ import annotations

import hashlib
import itertools
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
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyGroupState, KeyHash
from statehold.processor.chunks import Chunk, InputBatch
from statehold.processor.compat import whole
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
#: the key group of the one marker row each task gets (`staging.with_markers`)
MARKER_KG = -1


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


def describe_row(batch: pa.RecordBatch | pa.Table, i: int) -> str:
    row = {name: batch.column(j)[i].as_py() for j, name in enumerate(batch.schema.names)}
    return json.dumps(row, default=str)[:500]


def null_key_error(column: str, batch: pa.RecordBatch | pa.Table, row: int) -> MalformedInputError:
    return MalformedInputError(
        f"null in key column {column!r}; statehold refuses rows without a key (filter or "
        f"fill them before the stateful step). Row: {describe_row(batch, row)}"
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
    #: the most rows a task hands over at once (a chunk of one key's rows) or buffers
    #: as output before emitting it (`StatefulJob(task_batch_rows=...)`)
    task_batch_rows: int = 10_000
    #: how keys map to key groups: the job's (its checkpoints record it)
    key_hash: KeyHash = NEW_JOB_KEY_HASH


class _States:
    """`TaskStates` over one open backend; checks every key belongs to this task."""

    def __init__(self, backend: Any, spec: StateSpec, task: int) -> None:
        self._backend = backend
        self._spec = spec
        self._task = task

    def for_key(self, key: Any) -> KeyedState:
        values = key if isinstance(key, tuple) else (key,)
        skey = state_key(values)
        kg = key_group_of(skey, self._spec.max_parallelism, self._spec.key_hash)
        if task_of(kg, self._spec.parallelism, self._spec.max_parallelism) != self._task:
            raise KeyNotInTaskError(f"key {key!r} is not in this task's key groups")
        state: KeyedState = self._backend.for_key(skey, kg)
        return state

    def routed(self, segment: _Segment) -> KeyedState:
        """The state of the key whose rows `segment` starts (its key group checked)."""
        state: KeyedState = self._backend.for_key(segment.skey, segment.kg)
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
    """Stage 2: one task's keyed state step for one micro-batch, streamed.

    Rows arrive sorted by key group, key and ``order_by`` (`staging.stage` sorts them on
    the JVM side, which spills to disk), so the task reads one Arrow batch at a time,
    carries a key whose rows span batches into the next, calls the function key by key
    and emits its output every `StateSpec.task_batch_rows` rows. It holds one input batch,
    one output buffer and, for a per-key function, the current key's rows: not the
    partition. The acknowledgement row comes last, after the snapshot."""

    spec: StateSpec

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from statehold.storage import open_storage

        spec = self.spec
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else 0
        started = time.time()
        storage = open_storage(spec.storage_uri, **dict(spec.storage_options))
        backend = self._open_backend(storage, task)
        schema = internal_output_schema(spec.output_schema)
        output = Output(spec.output_schema, limit=spec.task_batch_rows)
        counts = _Counts()
        try:
            late = _Late(spec.processor) if spec.processor is not None else None
            keys = _Keys(_segments(batches, task, spec, counts, late))
            for table in self._process(backend, keys, output, task, counts, late):
                yield from _with_ack_column(table, schema)
            for table in output.drain():
                yield from _with_ack_column(table, schema)
            report = counts.report
            if spec.processing_time_ms is not None:
                report.update(_expire(backend, spec.processing_time_ms))
            snapshot_started = time.perf_counter()
            handle: KeyGroupState = backend.snapshot(
                storage, spec.epoch, spec.checkpoint_id, _metadata_key(spec.checkpoint_id)
            )
            report["snapshot_seconds"] = round(time.perf_counter() - snapshot_started, 4)
        except BaseException:
            backend.close()
            raise
        # a compaction the snapshot left running finishes after the task (engine.py)
        backend.close_after_compactions()
        ack = {
            "task": task,
            "state": handle.model_dump(mode="json"),
            "rows_in": counts.rows_in,
            "keys": counts.keys,
            "seconds": round(time.time() - started, 3),
            "bytes_downloaded": backend.restore_stats.bytes_downloaded,
            "files_downloaded": backend.restore_stats.files_downloaded,
            "compacted_restores": int(backend.restore_stats.compacted),
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
            key_hash=spec.key_hash, **dict(spec.backend_options),
        )
        backend.now_ms = spec.processing_time_ms
        return backend

    def _process(
        self, backend: Any, keys: _Keys, output: Output, task: int, counts: _Counts,
        late: _Late | None,
    ) -> Iterator[pa.Table]:
        """The user's function (or processor) over the task's rows, key by key: yields
        the output as the buffer fills; the figures go to `counts`."""
        spec = self.spec
        if late is not None:
            yield from _run_processor(spec, backend, keys, output, counts, late)
            return
        states = _States(backend, spec, task)
        if spec.vectorized:
            # one call over every key of the task: the keys are held together
            fn_batch: BatchFunction = spec.function  # type: ignore[assignment]
            every = [(first.key, whole(chunks, spec.input_format)) for first, chunks in keys]
            counts.keys = len(every)
            yield from output.stream(fn_batch(every, states))
            return
        fn_key: KeyFunction = spec.function  # type: ignore[assignment]
        for first, chunks in keys:
            counts.keys += 1
            rows = whole(chunks, spec.input_format)
            yield from output.stream(fn_key(first.key, rows, states.routed(first)))


@dataclass
class _Counts:
    """What a task counts while its rows stream by, for its acknowledgement."""

    rows_in: int = 0
    keys: int = 0
    report: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Segment:
    """Rows of one key from one input batch (at most `task_batch_rows` of them)."""

    skey: str
    key: Any
    rows: Chunk
    #: the key group the rows were routed by (checked against the job's hash)
    kg: int


class UnsortedInputError(StateholdError, RuntimeError):
    """A task's rows were not clustered by key group and key."""


def _segments(
    batches: Iterator[pa.RecordBatch], task: int, spec: StateSpec, counts: _Counts,
    late: _Late | None = None,
) -> Iterator[_Segment]:
    """The task's rows, batch by batch (a processor's late rows handled by `late`), cut
    where the key changes into slices of the batch's user columns (`INIT_COL` kept);
    refused if a key is null, belongs to another task, is not in the key group the job's
    hash gives it, or comes back after a later key (unsorted input)."""
    last: tuple[int, str] | None = None
    limit = max(1, spec.task_batch_rows)
    max_parallelism, key_hash = spec.max_parallelism, spec.key_hash
    for batch in batches:
        if batch.num_rows and batch.column(KG_COL)[0].as_py() == MARKER_KG:
            batch = batch.filter(pc.not_equal(batch.column(KG_COL), MARKER_KG))
        n = batch.num_rows
        if not n:
            continue
        counts.rows_in += n
        tasks = pc.unique(batch.column(TASK_COL)).to_pylist()
        if tasks != [task]:
            raise RoutingError(
                f"partition {task} received rows of tasks {sorted(tasks)}: the rows were "
                "not routed by key group (is the parallelism consistent?)"
            )
        table = pa.Table.from_batches([batch])
        if table.column(KEY_COL).null_count:  # keyed on the JVM, which leaves nulls be
            first_null = pc.index(pc.is_null(table.column(KEY_COL)), True).as_py()
            raise null_key_error(spec.key_columns[0], table.drop_columns(
                list(INTERNAL_COLS)), first_null)
        if late is not None:
            table = late.filter(table)
            n = table.num_rows
            if not n:
                continue
        skey_col = table.column(KEY_COL)
        starts = [0]
        if n > 1:
            changed = pc.not_equal(skey_col.slice(1), skey_col.slice(0, n - 1))
            starts += [i + 1 for i in pc.indices_nonzero(changed).to_pylist()]
        at = pa.array(starts, pa.int64())
        skeys = skey_col.take(at).to_pylist()
        kgs = table.column(KG_COL).take(at).to_pylist()
        key_values = [table.column(c).take(at).to_pylist() for c in spec.key_columns]
        user = InputBatch(table.drop_columns(list(INTERNAL_COLS)))
        ends = [*starts[1:], n]
        for j, (start, end) in enumerate(zip(starts, ends, strict=True)):
            here = (kgs[j], skeys[j])
            hashed = key_group_of(skeys[j], max_parallelism, key_hash)
            if hashed != kgs[j]:
                raise RoutingError(
                    f"key {skeys[j]!r} came keyed to key group {kgs[j]}, but the job's "
                    f"{key_hash} hash puts it in {hashed}"
                )
            if last is not None and here < last:
                raise UnsortedInputError(
                    f"partition {task} received key {skeys[j]!r} (key group {kgs[j]}) after "
                    f"{last[1]!r} (key group {last[0]}): its rows are not sorted by key"
                )
            last = here
            values = tuple(c[j] for c in key_values)
            key = values[0] if len(values) == 1 else values
            for off in range(start, end, limit):
                yield _Segment(skeys[j], key, user.chunk(off, min(off + limit, end)), kgs[j])


class _Keys:
    """Segments grouped by key, one segment read ahead: per key its first segment and an
    iterator of its rows (all columns) that reads further input batches as it goes; what
    a caller leaves unread is skipped before the next key."""

    def __init__(self, segments: Iterator[_Segment]) -> None:
        self._segments = segments
        self._next = next(segments, None)

    def __iter__(self) -> Iterator[tuple[_Segment, Iterator[Chunk]]]:
        while self._next is not None:
            first = self._next
            chunks = self._chunks(first.skey)
            yield first, chunks
            for _ in chunks:
                pass

    def _chunks(self, skey: str) -> Iterator[Chunk]:
        while self._next is not None and self._next.skey == skey:
            rows = self._next.rows
            self._next = next(self._segments, None)
            yield rows


def _with_ack_column(table: pa.Table, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for rb in table.to_batches(max_chunksize=10_000):
        arrays = [*rb.columns, pa.nulls(rb.num_rows, pa.string())]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


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
    spec: StateSpec, backend: Any, keys: _Keys, output: Output, counts: _Counts, late: _Late
) -> Iterator[pa.Table]:
    """The processor's batch in this task (statehold.processor.runner), key by key as
    the rows stream in: initial-state rows (sorted first within their key) and input rows
    (`_segments` counted the late ones, and dropped them with ``late_rows="drop"``) as an
    iterator of chunks."""
    from statehold.processor.runner import ProcessorRun

    pspec = spec.processor
    assert pspec is not None
    run = ProcessorRun(pspec, backend, len(spec.key_columns), spec.input_format)
    run.start()
    for first, chunks in keys:
        initial: list[pa.Table] = []
        inputs = _inputs(chunks, initial)
        head = next(inputs, None)  # reads the key's initial-state rows, if any
        state_rows = whole(map(Chunk.of, initial), spec.input_format) if initial else None
        rows = None if head is None else itertools.chain([head], inputs)
        if rows is not None:
            counts.keys += 1
        yield from output.stream(run.key(first.skey, first.key, state_rows, rows, first.kg))
    for out in run.timers():
        yield from output.stream(out)
    counts.report.update(run.finish())
    counts.report.update(late_rows=late.late_rows, max_event_ms=late.max_event_ms)


@dataclass
class _Late:
    """The batch's late rows and newest event time, over every input batch (its
    initial-state rows are neither)."""

    spec: ProcessorSpec
    late_rows: int = 0
    max_event_ms: int | None = None

    def filter(self, table: pa.Table) -> pa.Table:
        from statehold.processor.runner import filter_late

        initial = table.column(INIT_COL).is_valid() if INIT_COL in table.column_names else None
        filtered = filter_late(table, self.spec, exempt=initial)
        self.late_rows += filtered.late_rows
        newest = filtered.max_event_ms
        if newest is not None:
            self.max_event_ms = newest if self.max_event_ms is None else max(
                self.max_event_ms, newest
            )
        assert filtered.table is not None
        return filtered.table


def _inputs(chunks: Iterator[Chunk], initial: list[pa.Table]) -> Iterator[Chunk]:
    """One key's input rows (user columns), chunk by chunk; its initial-state rows (the
    `INIT_COL` struct, flattened) go to `initial`, and must all come before its first
    input row."""
    seen_input = False
    for chunk in chunks:
        if INIT_COL in chunk.batch.columns:
            t = chunk.table
            is_initial = t.column(INIT_COL).is_valid()
            states = t.filter(is_initial)
            if states.num_rows:
                if seen_input:
                    raise UnsortedInputError(
                        "initial-state rows of a key came after its input rows"
                    )
                struct = states.column(INIT_COL).combine_chunks()
                initial.append(
                    pa.Table.from_arrays(struct.flatten(), names=[f.name for f in struct.type])
                )
            t = t.filter(pc.invert(is_initial)).drop_columns([INIT_COL])
            if not t.num_rows:
                continue
            chunk = Chunk.of(t)
        seen_input = True
        yield chunk
