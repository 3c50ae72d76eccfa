"""One batch into one checkpoint, exactly once (the driver's part; `run_checkpoint`).

Per batch N, in this order:

1. If checkpoint N is already completed, this is a replay of a batch whose output was
   written and whose checkpoint completed before Spark committed it: skip it.
2. `begin(N)`; every task restores its key-group range from the newest completed
   checkpoint (< N), runs the user function, snapshots into the job directory and reports
   its `KeyGroupState`. Every task runs every batch (also with no input rows), so each
   checkpoint lists every range, also after a change of parallelism.
3. The result is persisted and computed once, by collecting the acks; the sink reads it
   from the cache and replaces the batch's output (idempotent). A partition lost with its
   executor is recomputed from lineage: its task runs again from N-1, emits the same rows
   and uploads files no checkpoint references (`statehold.spark.staging`), so executor
   loss at any phase costs a re-run of that task, not the batch.
4. `complete(N)`. Any failure before: `abort(N)` and re-raise, so Spark retries the batch,
   which restores from N-1 again. Either way the cached result is then unpersisted
   (without a sink it is ``result.output``, kept until the job's next batch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statehold.format import layout
from statehold.spark.batch import NOTED, BatchResult, batch_figures, check_acks
from statehold.spark.staging import release, stage, state_spec
from statehold.spark.task import ACK_COL

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from statehold.format.metadata import EventTime, OperatorSchemas
    from statehold.processor.runner import ProcessorSpec
    from statehold.spark.api import InputFormat, Sink
    from statehold.spark.job import StatefulJob

log = logging.getLogger("statehold.spark")


def now_ms() -> int:
    return int(time.time() * 1000)


def check_spark_batch(job: StatefulJob, batch_id: int, ours: int | None, what: str) -> None:
    """Spark may replay only its last batch (`ours`: the newest batch the checkpoints
    record, `what` names it). An older id means Spark's checkpoint (``_spark/``) is behind
    ours, e.g. it was deleted or belongs to another copy; skipping those batches would
    silently lose input."""
    if ours is not None and batch_id < ours:
        raise RuntimeError(
            f"Spark batch {batch_id} is older than {what.format(ours)} in {job.job_dir}: the "
            f"streaming checkpoint location is not the one these checkpoints were written "
            f"with (use {job.spark_checkpoint_location})"
        )


def run_checkpoint(
    job: StatefulJob,
    df: DataFrame,
    process: Any,
    output_schema: StructType | str,
    keys: tuple[str, ...],
    order_by: Sequence[str],
    input_format: InputFormat,
    vectorized: bool,
    processing_time_ms: int | None,
    batch_id: int | None,
    sink: Sink | None,
    source_position: Mapping[str, Any] | None,
    processor: ProcessorSpec | None = None,
    event_time: Callable[[dict[str, Any]], EventTime] | None = None,
    schemas: dict[str, OperatorSchemas] | None = None,
) -> BatchResult:
    """Batch `batch_id` (None: the latest checkpoint + 1) of `job` as one checkpoint: the
    tasks of `process` (`statehold.spark.staging.state_spec`; `processing_time_ms`
    default: now) over `df`, the sink, then ``complete`` with the source position, the
    event time made from the tasks' figures and the schemas."""
    if batch_id is None:
        latest_id = job.latest_checkpoint_id()
        batch_id = 0 if latest_id is None else latest_id + 1
    started = time.time()
    coord = job.coordinator
    latest = coord.latest()
    if latest is not None and latest[1].checkpoint_id >= batch_id:
        log.info(
            "job %s: batch %d already completed (checkpoint %d): skipped",
            job.job_id,
            batch_id,
            latest[1].checkpoint_id,
        )
        return BatchResult(batch_id, True, time.time() - started)
    spec = state_spec(
        job, df, batch_id, process, output_schema, keys, order_by, input_format, vectorized,
        now_ms() if processing_time_ms is None else processing_time_ms, processor,
    )
    coord.begin(batch_id)
    staged: DataFrame | None = None
    completed = False
    try:
        staged = stage(job, df, spec, output_schema)
        ack_rows = staged.where(staged[ACK_COL].isNotNull()).select(ACK_COL).collect()
        acks = [row[0] for row in ack_rows]
        handles = check_acks(acks, job.parallelism, job.max_parallelism)
        for state in handles:
            coord.acknowledge(batch_id, job.operator, state)
        figures = batch_figures(handles, acks)
        coord.history.note(batch_id, **{k: figures[k] for k in NOTED})
        job._phase("after-tasks", batch_id)
        output = staged.where(staged[ACK_COL].isNull()).drop(ACK_COL)
        if sink is not None:
            sink(output, batch_id)
            job._phase("after-sink", batch_id)
        position = {"spark_batch_id": batch_id, **dict(source_position or {})}
        clock = None if event_time is None else event_time(figures)
        complete_started = time.perf_counter()
        coord.complete(batch_id, position, clock, schemas)
        completed = True
        complete_seconds = time.perf_counter() - complete_started
    except BaseException as e:
        coord.abort(batch_id, f"{type(e).__name__}: {e}"[:500])
        job._observe(coord)
        raise
    finally:
        if staged is not None:
            release(job, staged, keep=completed and sink is None)
    job._observe(coord)
    job._phase("after-complete", batch_id)
    return BatchResult(
        checkpoint_id=batch_id,
        skipped=False,
        duration=time.time() - started,
        checkpoint_uri=f"{job.job_dir}/{layout.checkpoint_metadata_key(batch_id)}",
        output=output,
        complete_seconds=complete_seconds,
        watermark_ms=None if clock is None else clock.watermark_ms,
        **{k: v for k, v in figures.items() if k not in ("rows", "max_event_ms")},
    )
