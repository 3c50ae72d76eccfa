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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from statehold.spark.api import BatchFunction, InputFormat, KeyFunction
from statehold.spark.routing import route_to_partitions
from statehold.spark.task import (
    ACK_COL,
    INTERNAL_COLS,
    KEY_COL,
    KG_COL,
    TASK_COL,
    KeyGroupStage,
    StateSpec,
    StateStage,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from statehold.processor.runner import ProcessorSpec
    from statehold.spark.job import StatefulJob


def state_spec(
    job: StatefulJob,
    df: DataFrame,
    batch_id: int,
    process: KeyFunction | BatchFunction,
    output_schema: StructType | str,
    keys: tuple[str, ...],
    order_by: Sequence[str],
    input_format: InputFormat,
    vectorized: bool,
    processing_time_ms: int | None = None,
    processor: ProcessorSpec | None = None,
) -> StateSpec:
    """What every task of batch `batch_id` needs: the checkpoint to restore its key groups
    from, the user's function and the output schema (refusing reserved columns)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    event_column = processor.event_time_column if processor is not None else None
    wanted = (*keys, *order_by, *([event_column] if event_column else []))
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the input ({df.columns})")
    clash = [c for c in df.columns if c in (*INTERNAL_COLS, ACK_COL)]
    if clash:
        raise ValueError(f"input columns {clash} are reserved by statehold")
    struct = job._struct(output_schema)
    if ACK_COL in struct.fieldNames():
        raise ValueError(f"output column {ACK_COL!r} is reserved by statehold")
    latest = job.coordinator.latest()
    restore_key: str | None = None
    ranges: tuple[str, ...] = ()
    if latest is not None:
        restore_key, meta = latest
        for op in meta.operators:
            if op.operator == job.operator:
                ranges = tuple(r.model_dump_json() for r in op.ranges)
    return StateSpec(
        storage_uri=job.storage.uri,
        storage_options=job.storage_options,
        job_id=job.job_id,
        operator=job.operator,
        epoch=job.coordinator.epoch,
        checkpoint_id=batch_id,
        max_parallelism=job.max_parallelism,
        parallelism=job.parallelism,
        restore_key=restore_key if ranges else None,
        restore_ranges=ranges,
        key_columns=keys,
        order_by=tuple(order_by),
        output_schema=to_arrow_schema(struct),
        input_format=input_format,
        function=process,
        vectorized=vectorized,
        local_dir=job.local_dir,
        backend_options=job.backend_options,
        processing_time_ms=processing_time_ms,
        processor=processor,
    )

def stage(
    job: StatefulJob, df: DataFrame, spec: StateSpec, output_schema: StructType | str
) -> DataFrame:
    """Key the rows, route each task's key groups to one partition, run the stateful
    task there, and persist the result (computed by the caller's first action; give it
    back with `release`). Releases the result the job handed out last."""
    from pyspark import StorageLevel
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    keyed_schema = StructType(
        [
            *df.schema.fields,
            StructField(KEY_COL, StringType(), False),
            StructField(KG_COL, IntegerType(), False),
            StructField(TASK_COL, IntegerType(), False),
        ]
    )
    user = job._struct(output_schema)
    out_schema = StructType(
        [StructField(f.name, f.dataType, True, f.metadata) for f in user.fields]
        + [StructField(ACK_COL, StringType(), True)]
    )
    keyed = df.mapInArrow(
        KeyGroupStage(spec.key_columns, spec.parallelism, spec.max_parallelism),
        keyed_schema,
    )
    staged = route_to_partitions(keyed, spec.parallelism, TASK_COL).mapInArrow(
        StateStage(spec), out_schema
    )
    release_kept(job)
    # Computed once, by the first action (the acks), then read from the cache by the sink;
    # a partition lost with its executor is recomputed from lineage (module docstring).
    return staged.persist(StorageLevel.MEMORY_AND_DISK)


#: Per job, the newest staged result handed to the caller as ``result.output`` (a batch
#: without a sink), with the finalizer that unpersists it.
_kept: weakref.WeakKeyDictionary[StatefulJob, weakref.finalize[[DataFrame], StatefulJob]] = (
    weakref.WeakKeyDictionary()
)


def release(job: StatefulJob, staged: DataFrame, *, keep: bool) -> None:
    """The batch is done with `staged`: unpersist it, so executors do not pile up blocks.
    With `keep` (the batch completed without a sink: ``result.output`` is the caller's to
    write) it stays cached until the job stages its next batch or is garbage-collected,
    since recomputing it after the checkpoint completed would restore from a checkpoint
    the job may have deleted meanwhile."""
    release_kept(job)
    if keep:
        kept = weakref.finalize(job, _unpersist, staged)
        kept.atexit = False
        _kept[job] = kept
    else:
        _unpersist(staged)


def release_kept(job: StatefulJob) -> None:
    """Unpersist the result `job` handed out last (`release`), if any."""
    kept = _kept.pop(job, None)
    if kept is not None:
        kept()


def _unpersist(staged: DataFrame) -> None:
    # A finalizer may run after the session stopped; its cache went with it.
    with contextlib.suppress(Exception):
        staged.unpersist()
