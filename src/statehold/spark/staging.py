"""Turning one micro-batch into the Spark plan that runs statehold's tasks: the tasks'
spec (what to restore, which function, which schema) and the staged DataFrame (keyed,
routed by task, stateful, materialised once)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError
from statehold.spark.batch import BatchRequest
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
    out_schema = StructType(
        [StructField(f.name, f.dataType, True, f.metadata) for f in output_schema.fields]
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
