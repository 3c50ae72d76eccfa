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

The job is a collaborator here (`Checkpointing`: its coordinator, its tasks' settings
and its hooks), not an import, so `statehold.spark.job` builds on this module alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehold.errors import StateholdError
from statehold.format import layout
from statehold.spark.batch import NOTED, BatchRequest, BatchResult, batch_figures, check_acks
from statehold.spark.staging import JobSettings, KeptOutput, stage, state_spec
from statehold.spark.task import ACK_COL

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from statehold.checkpoint.coordinator import CheckpointCoordinator
    from statehold.format.metadata import EventTime
    from statehold.job.history import HistoryRecord
    from statehold.spark.api import PhaseHook

log = logging.getLogger("statehold.spark")


def now_ms() -> int:
    return int(time.time() * 1000)


class SparkCheckpointMismatchError(StateholdError, RuntimeError):
    """Spark's streaming checkpoint is behind statehold's: it is not the one these
    checkpoints were written with."""


@dataclass(frozen=True)
class ReplayCheck:
    """Refuses a Spark batch older than the newest one the checkpoints record."""

    job_dir: str
    spark_checkpoint_location: str

    def check(self, batch_id: int, ours: int | None, what: str) -> None:
        """Spark may replay only its last batch (`ours`: the newest batch the checkpoints
        record, `what` names it). An older id means Spark's checkpoint (``_spark/``) is
        behind ours, e.g. it was deleted or belongs to another copy; skipping those
        batches would silently lose input."""
        if ours is not None and batch_id < ours:
            raise SparkCheckpointMismatchError(
                f"Spark batch {batch_id} is older than {what.format(ours)} in {self.job_dir}: "
                f"the streaming checkpoint location is not the one these checkpoints were "
                f"written with (use {self.spark_checkpoint_location})"
            )


@dataclass(frozen=True)
class Checkpointing:
    """The job's side of a batch: its attempt's coordinator, what its tasks are told,
    where it lives, and who hears of the batch (`phase`: see `PhaseHook`; `observe`: the
    checkpoint's history record once it completed or aborted)."""

    coordinator: CheckpointCoordinator
    settings: JobSettings
    job_dir: str
    phase: PhaseHook
    observe: Callable[[HistoryRecord | None], None]
    #: The job's staged results, unpersisted once their batch is done.
    kept: KeptOutput


@dataclass(frozen=True)
class _Tasks:
    """What the tasks of a batch gave: its output and its figures."""

    output: DataFrame
    figures: dict[str, Any]


def run_checkpoint(job: Checkpointing, batch: BatchRequest) -> BatchResult:
    """`batch` as one checkpoint of `job` (id: `batch.batch_id`, default the latest + 1):
    its tasks (`statehold.spark.staging.state_spec`), the sink, then ``complete`` with
    the source position, the event time made from the tasks' figures and the schemas."""
    coord = job.coordinator
    started = time.time()
    latest = coord.latest()
    batch_id = batch.batch_id
    if batch_id is None:
        batch_id = 0 if latest is None else latest[1].checkpoint_id + 1
    if latest is not None and latest[1].checkpoint_id >= batch_id:
        log.info("job %s: batch %d already completed (checkpoint %d): skipped",
                 job.settings.job_id, batch_id, latest[1].checkpoint_id)
        return BatchResult(batch_id, True, time.time() - started)
    processing_time_ms = now_ms() if batch.processing_time_ms is None else batch.processing_time_ms
    spec = state_spec(job.settings, latest, coord.epoch, batch, batch_id, processing_time_ms)
    coord.begin(batch_id)
    job.kept.release()  # the previous batch's output, kept until this batch
    staged: DataFrame | None = None
    completed = False
    try:
        staged = stage(batch.df, spec, batch.output_schema)
        tasks = _run_tasks(job, batch, staged, batch_id)
        clock, complete_seconds = _complete(job, batch, batch_id, tasks.figures)
        completed = True
    except BaseException as e:
        coord.abort(batch_id, f"{type(e).__name__}: {e}"[:500])
        job.observe(coord.history.last)
        raise
    finally:
        job.kept.release(staged, keep=completed and batch.sink is None)
    job.observe(coord.history.last)
    job.phase("after-complete", batch_id)
    return BatchResult(
        checkpoint_id=batch_id,
        skipped=False,
        duration=time.time() - started,
        checkpoint_uri=f"{job.job_dir}/{layout.checkpoint_metadata_key(batch_id)}",
        output=tasks.output,
        complete_seconds=complete_seconds,
        watermark_ms=None if clock is None else clock.watermark_ms,
        **{k: v for k, v in tasks.figures.items() if k not in ("rows", "max_event_ms")},
    )


def _run_tasks(
    job: Checkpointing, batch: BatchRequest, staged: DataFrame, batch_id: int
) -> _Tasks:
    """The tasks' acknowledgements to the coordinator and their figures to the history;
    then the output to the sink, if there is one."""
    coord, settings = job.coordinator, job.settings
    acks = [row[0] for row in staged.where(f"{ACK_COL} IS NOT NULL").select(ACK_COL).collect()]
    handles = check_acks(acks, settings.parallelism, settings.max_parallelism)
    for state in handles:
        coord.acknowledge(batch_id, settings.operator, state)
    figures = batch_figures(handles, acks)
    coord.history.note(batch_id, **{k: figures[k] for k in NOTED})
    job.phase("after-tasks", batch_id)
    output = staged.where(f"{ACK_COL} IS NULL").drop(ACK_COL)
    if batch.sink is not None:
        batch.sink(output, batch_id)
        job.phase("after-sink", batch_id)
    return _Tasks(output, figures)


def _complete(
    job: Checkpointing, batch: BatchRequest, batch_id: int, figures: dict[str, Any]
) -> tuple[EventTime | None, float]:
    """``complete(N)`` with the source position, the event time and the schemas: the
    event time recorded, and the seconds the driver's part took."""
    position = {"spark_batch_id": batch_id, **dict(batch.source_position)}
    clock = None if batch.event_time is None else batch.event_time(figures)
    complete_started = time.perf_counter()
    job.coordinator.complete(batch_id, position, clock, batch.schemas)
    return clock, time.perf_counter() - complete_started
