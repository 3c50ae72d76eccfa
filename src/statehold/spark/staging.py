"""Turning one micro-batch into the Spark plan that runs statehold's tasks: the tasks'
spec (what to restore, which function, which schema) and the staged DataFrame (keyed,
routed by task, stateful, kept once computed).

The staged result is persisted (memory, spilling to disk), not `localCheckpoint`-ed: a
local checkpoint truncates the lineage, so a block lost with its executor can never be
computed again and the batch fails. A persisted block lost with its executor is
recomputed from lineage: that partition's task runs again, restores from the same
checkpoint N-1 and, given the same rows and the spec's fixed processing time, emits the
same rows. Its uploads are never acknowledged (the driver took the first run's handle
from the acks), so they are unreferenced files of checkpoint N, which the reconcile and
the job end delete.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyHash
from statehold.spark.batch import BatchRequest
from statehold.spark.keying import keyed
from statehold.spark.routing import route_to_partitions
from statehold.spark.task import (
    ACK_COL,
    INIT_COL,
    INTERNAL_COLS,
    KEY_COL,
    KG_COL,
    MARKER_KG,
    TASK_COL,
    StateSpec,
    StateStage,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from statehold.format.metadata import CheckpointMetadata


@dataclass(frozen=True)
class JobSettings:
    """What every task of a job is told, whatever the batch: where the job directory is,
    the operator, how key groups are split, and where and how RocksDB runs."""

    storage_uri: str
    storage_options: Mapping[str, Any]
    job_id: str
    operator: str
    max_parallelism: int
    parallelism: int
    local_dir: str | None
    backend_options: Mapping[str, Any]
    #: rows per chunk a task hands over or buffers as output (`StateSpec.task_batch_rows`)
    task_batch_rows: int = 10_000
    #: how keys map to key groups (the coordinator's: the job's own, or a new job's)
    key_hash: KeyHash = NEW_JOB_KEY_HASH


def state_spec(
    settings: JobSettings,
    restore_from: tuple[str, CheckpointMetadata] | None,
    epoch: int,
    batch: BatchRequest,
    batch_id: int,
    processing_time_ms: int,
) -> StateSpec:
    """What every task of batch `batch_id` (of attempt `epoch`) needs: the checkpoint to
    restore its key groups from (`restore_from`: the newest completed one), the user's
    function and the output schema (refusing reserved columns)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    _check_columns(batch)
    ranges: tuple[str, ...] = ()
    if restore_from is not None:
        for op in restore_from[1].operators:
            if op.operator == settings.operator:
                ranges = tuple(r.model_dump_json() for r in op.ranges)
    return StateSpec(
        storage_uri=settings.storage_uri,
        storage_options=settings.storage_options,
        job_id=settings.job_id,
        operator=settings.operator,
        epoch=epoch,
        checkpoint_id=batch_id,
        max_parallelism=settings.max_parallelism,
        parallelism=settings.parallelism,
        restore_key=restore_from[0] if restore_from is not None and ranges else None,
        restore_ranges=ranges,
        key_columns=batch.keys,
        order_by=batch.order_by,
        output_schema=to_arrow_schema(batch.output_schema),
        input_format=batch.input_format,
        function=batch.function,
        vectorized=batch.vectorized,
        local_dir=settings.local_dir,
        backend_options=settings.backend_options,
        processing_time_ms=processing_time_ms,
        processor=batch.processor,
        task_batch_rows=settings.task_batch_rows,
        key_hash=settings.key_hash,
    )


def _check_columns(batch: BatchRequest) -> None:
    """The columns the batch names are in its input; statehold's own are in neither the
    input nor the output."""
    columns = batch.df.columns
    event_column = batch.processor.event_time_column if batch.processor is not None else None
    wanted = (*batch.keys, *batch.order_by, *([event_column] if event_column else []))
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise InvalidArgumentError(f"columns {missing} not in the input ({columns})")
    clash = [c for c in columns if c in (*INTERNAL_COLS, ACK_COL)]
    if clash:
        raise InvalidArgumentError(f"input columns {clash} are reserved by statehold")
    if ACK_COL in batch.output_schema.fieldNames():
        raise InvalidArgumentError(f"output column {ACK_COL!r} is reserved by statehold")


def stage(df: DataFrame, spec: StateSpec, output_schema: StructType) -> DataFrame:
    """Key the rows, route each task's key groups to one partition, run the stateful
    task there, and persist the result (computed by the caller's first action; give it
    back with `KeptOutput.release`)."""
    from pyspark import StorageLevel
    from pyspark.sql.types import StringType, StructField, StructType

    fields = df.schema.fields
    out_schema = StructType(
        [StructField(f.name, f.dataType, True, f.metadata) for f in output_schema.fields]
        + [StructField(ACK_COL, StringType(), True)]
    )
    routed = route_to_partitions(with_markers(keyed(df, spec), spec.parallelism),
                                 spec.parallelism, TASK_COL)
    initial = any(f.name == INIT_COL for f in fields)
    staged = sort_for_tasks(routed, spec.order_by, initial).mapInArrow(StateStage(spec),
                                                                       out_schema)
    # Computed once, by the first action (the acks), then read from the cache by the sink;
    # a partition lost with its executor is recomputed from lineage (module docstring).
    with _adaptive_execution_off(staged.sparkSession):
        return staged.persist(StorageLevel.MEMORY_AND_DISK)


#: Spark's switch for adaptive query execution (AQE)
ADAPTIVE = "spark.sql.adaptive.enabled"


@contextlib.contextmanager
def _adaptive_execution_off(session: Any) -> Iterator[None]:
    """Adaptive execution off while the staged result's cached plan is made (`persist`
    plans it), then the session's setting back as it was.

    Adaptive execution gains nothing on this plan (the tasks' partitioning is fixed, and
    the plan has one exchange) but costs a Spark job and a re-planning per batch: it runs
    the routing shuffle as a job of its own, then the cached stage as another, before the
    acks' job reads the cache. Without it the acks' first action is one job of two stages
    (two jobs on Spark 3.5, whose adaptive execution of the acks' own query reads a cached
    table in a job of its own), about a tenth of a small batch's time (docs/benchmarks.md).
    Only the cached plan is made without it; the sink's and the user's own queries are
    planned as configured.
    In a ``foreachBatch`` the session is the streaming query's own; in `run_batch` it may
    be shared, and another thread's query planned in these few milliseconds runs without
    adaptive execution, with the same result."""
    conf = session.conf
    before = conf.get(ADAPTIVE)
    conf.set(ADAPTIVE, "false")
    try:
        yield
    finally:
        conf.set(ADAPTIVE, before)


def with_markers(keyed: DataFrame, parallelism: int) -> DataFrame:
    """`keyed` plus one marker row per task (key group `MARKER_KG`, sorted first, skipped
    by the task). Without them an empty batch leaves the shuffle empty, and Spark's
    adaptive execution turns the sort over it into an empty relation: no task would run
    and no task would snapshot its key groups.

    The markers and the sort keys are SQL expressions, not `functions` calls: on a classic
    session each of those is a few py4j round trips, and this runs once per batch (a third
    of the driver's time planning a batch went to building the markers that way)."""
    markers = keyed.sparkSession.range(parallelism).selectExpr(
        f"'' AS {KEY_COL}", f"CAST({MARKER_KG} AS INT) AS {KG_COL}",
        f"CAST(id AS INT) AS {TASK_COL}",
    )
    return keyed.unionByName(markers, allowMissingColumns=True)


def sort_for_tasks(routed: DataFrame, order_by: tuple[str, ...], initial: bool) -> DataFrame:
    """Each task's rows clustered for streaming: by key group, key, initial-state rows
    first (`INIT_COL`, if `initial`: the input has initial-state rows), then `order_by`
    (nulls last). A sort within partitions keeps the routing's partitioning (no new
    exchange) and is Spark's external sort, which spills to disk, so the task never needs
    its partition in memory to group it."""
    from pyspark.sql import functions as F

    columns = [F.expr(KG_COL), F.expr(KEY_COL)]
    if initial:
        columns.append(F.expr(f"{INIT_COL} IS NULL"))
    columns += [F.asc_nulls_last(c) for c in order_by]  # the user's names: `col` semantics
    return routed.sortWithinPartitions(*columns)


class KeptOutput:
    """A job's staged results once their batch is done: unpersisted at once, so executors
    do not pile up blocks, except the newest batch's without a sink (``result.output`` is
    the caller's to write). That one stays cached until the job stages its next batch or
    is garbage-collected: recomputing it after its checkpoint completed would restore from
    a checkpoint the job may have deleted meanwhile."""

    def __init__(self) -> None:
        self._kept: weakref.finalize[[DataFrame], KeptOutput] | None = None

    def release(self, staged: DataFrame | None = None, *, keep: bool = False) -> None:
        """Unpersist the result kept last; then `staged` too, unless `keep`."""
        if self._kept is not None:
            self._kept()
            self._kept = None
        if staged is None:
            return
        if keep:
            self._kept = weakref.finalize(self, _unpersist, staged)
            self._kept.atexit = False
        else:
            _unpersist(staged)


def _unpersist(staged: DataFrame) -> None:
    # A finalizer may run after the session stopped; its cache went with it.
    with contextlib.suppress(Exception):
        staged.unpersist()
