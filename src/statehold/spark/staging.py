"""Turning one micro-batch into the Spark plan that runs statehold's tasks: the tasks'
spec (what to restore, which function, which schema) and the staged DataFrame (keyed,
routed by task, stateful, materialised once)."""

from __future__ import annotations

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
    task there, and materialise the result once."""
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
    # Materialise once: the acks and the sink must see the same, single run of state.
    return staged.localCheckpoint(eager=True)
