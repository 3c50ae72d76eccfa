"""The driver side: `StatefulJob` runs one keyed stateful step per micro-batch and turns
every batch into checkpoint N (N = the Spark batch id, except for stateful processors in
Structured Streaming: `statehold.spark.streaming`). How one batch becomes one checkpoint,
exactly once: `statehold.spark.checkpoint_run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from statehold import clock
from statehold.backend.keys import check_max_parallelism
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.checkpoint.requests import Inbox
from statehold.errors import (
    InvalidArgumentError,
    StateholdError,
    is_missing_extra,
    missing_extra,
)
from statehold.format import layout
from statehold.format.metadata import CheckpointMetadata, EventTime, RestoreMode
from statehold.format.requests import Action, OperatorRequest, Outcome, RequestAnswer
from statehold.ha.base import HAStore
from statehold.job.directory import open_job
from statehold.job.history import DEFAULT_KEEP, HistoryRecord
from statehold.job.locate import opened
from statehold.job.result import JobOutcome, RetentionPolicy
from statehold.spark.api import (
    BatchFunction,
    InputFormat,
    KeyFunction,
    OptionsError,
    PhaseHook,
    Sink,
    millis,
    replace_output,
)
from statehold.spark.batch import BatchRequest, BatchResult
from statehold.spark.checkpoint_run import Checkpointing, ReplayCheck, now_ms, run_checkpoint
from statehold.spark.connect import (
    JobConfig,
    RemoteBatches,
    default_parallelism,
    is_connect,
    refuse,
)
from statehold.spark.progress import ProgressCallback, RecentRecords, StateholdProgressListener
from statehold.spark.registration import register_if_supported
from statehold.spark.session import SchemaParser, spark_checkpoint_location
from statehold.spark.staging import JobSettings, KeptOutput
from statehold.spark.streaming import (
    STOP_WAIT_SECONDS,
    ProcessorBatches,
    ProcessorJob,
    await_interruption,
    idle_query,
    is_processor,
    query_of_this_thread,
    stop_query,
    stop_this_query,
)
from statehold.storage import Storage, check_key, open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from statehold.processor.runner import LateRows
    from statehold.spark.metrics import JobMetrics


log = logging.getLogger("statehold.spark")

#: How often a streaming driver with no batch running serves requests (`StatefulJob`):
#: one listing of ``_job/requests/`` each time (on an object store one LIST request).
IDLE_REQUESTS_SECONDS = 2.0


class JobStoppedError(StateholdError):
    """The job was stopped from outside (``statehold stop``); a new StatefulJob resumes it."""


def _seconds(retain_for: timedelta | float | None) -> float | None:
    if retain_for is None:
        return None
    seconds = retain_for.total_seconds() if isinstance(retain_for, timedelta) else retain_for
    if not seconds >= 0:
        raise InvalidArgumentError(f"retain_for must be a positive duration, not {retain_for}")
    return float(seconds)


@dataclasses.dataclass(frozen=True)
class StreamBatches:
    """The ``foreachBatch`` function of `StatefulJob.stream_batches` (and of
    `StatefulJob.foreach_batch` with a plain function)."""

    job: StatefulJob
    #: runs the micro-batch (calling `StatefulJob.run_batch`)
    func: Callable[[DataFrame, int], None]
    #: told after `func`, before requests are served (`foreach_batch`'s ``on_batch``)
    after: Callable[[], None] | None = None

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self.job._streaming():
            self.func(batch_df, batch_id)
        if self.after is not None:
            self.after()
        self.job.serve_requests(stream=True)


class StatefulJob:
    """Keyed state for a PySpark pipeline, checkpointed into one job directory.

    ``checkpoints`` is the checkpoint root (a local path, ``file://`` or ``s3://`` URI);
    the job directory is ``<checkpoints>/<job_id>``. ``max_parallelism`` (the number of key
    groups) is fixed when the job is created; ``parallelism`` (the number of Spark tasks
    owning state) may change between runs. The newest ``retain`` completed checkpoints
    are kept and, with ``retain_for`` (a timedelta or seconds), every one completed within
    it as well (``retain`` is the minimum; at most
    `statehold.cleanup.policy.MAX_RETAINED`). After each batch, and while it waits for
    input, the driver serves the savepoints and stops asked from outside (``statehold
    savepoint JOB NAME``, ``statehold stop JOB``; `serve_requests`, `stream_batches`).
    ``on_phase`` is told each batch's progress (see `PhaseHook`). The newest `history`
    checkpoints leave a record in ``_job/history/`` (`statehold.job.history`). With
    `metrics_port`, the driver serves Prometheus metrics there (`statehold.spark.metrics`; 0:
    any free port, see ``job.metrics.port``) on `metrics_host`: 127.0.0.1 unless told
    another address (``"0.0.0.0"``: every interface).

    Tasks stream their rows (sorted by key on the JVM side) and emit output every
    `task_batch_rows` rows, so a task's memory does not grow with the batch: it holds one
    input Arrow batch (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``), one
    output buffer of `task_batch_rows` rows, and the current key's rows for a per-key
    function (a list: a hot key is held whole; a processor with ``input_chunks`` gets
    chunks of at most `task_batch_rows` rows instead). A vectorized function gets every
    key of the task at once.
    """

    def __init__(
        self,
        spark: SparkSession,
        checkpoints: str,
        job_id: str,
        *,
        max_parallelism: int = 128,
        parallelism: int | None = None,
        retain: int = 3,
        storage_options: Mapping[str, Any] | None = None,
        operator: str = "state",
        local_dir: str | None = None,
        ha: HAStore | str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        restore_from: str | None = None,
        restore_mode: RestoreMode | str = RestoreMode.NO_CLAIM,
        on_phase: PhaseHook | None = None,
        history: int = DEFAULT_KEEP,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        retain_for: timedelta | float | None = None,
        task_batch_rows: int = 10_000,
    ) -> None:
        check_max_parallelism(max_parallelism)
        if task_batch_rows < 1:
            raise InvalidArgumentError("task_batch_rows must be at least 1")
        self.task_batch_rows = task_batch_rows
        self.spark = spark
        self.job_id = job_id
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism or min(default_parallelism(spark), max_parallelism)
        if not 1 <= self.parallelism <= max_parallelism:
            raise InvalidArgumentError(f"parallelism must be in 1..{max_parallelism}")
        self.retain = retain
        self.retain_for = _seconds(retain_for)
        self.operator = operator
        self.local_dir = local_dir
        self.storage_options = dict(storage_options or {})
        self.backend_options = dict(backend_options or {})
        check_key(job_id)
        if "/" in job_id:
            raise InvalidArgumentError(f"job id must be one path segment: {job_id!r}")
        root = open_storage(checkpoints, **self.storage_options)
        self.storage: Storage = root.child(job_id)
        self._ha = ha
        self._coordinator: CheckpointCoordinator | None = None
        #: Spark Connect: set once `foreach_batch` handed the batches to the server's
        #: foreachBatch process (statehold.spark.connect); set there on the job it opens.
        self._batches_remote = False
        self._batches_here = False
        self._checkpoints = checkpoints
        self._kept = KeptOutput()
        self._schemas = SchemaParser(spark)
        #: A checkpoint, savepoint or job directory of another job to start from (used
        #: only while this job has no checkpoint of its own; see statehold.checkpoint.restore).
        self.restore_from = restore_from
        self.restore_mode = RestoreMode(restore_mode)
        self.on_phase = on_phase
        self.history = history
        self.metrics: JobMetrics | None = None
        self._inbox: Inbox | None = None
        self._stopped: RequestAnswer | None = None
        #: Inside a Structured Streaming batch: requests wait for its end.
        self._in_stream = False
        #: Held by every batch; a request served while idle takes it (`_serve_when_idle`).
        self._batch_lock = threading.RLock()
        #: How often a streaming driver with no batch running serves requests (a query
        #: without new input runs no batch); None: at batch boundaries only.
        self.idle_requests_every: float | None = IDLE_REQUESTS_SECONDS
        self._idle: threading.Thread | None = None
        self._idle_done = threading.Event()
        #: The streaming query whose micro-batches this job runs (seen in its batches).
        self._query_id: str | None = None
        #: Set (under the batch lock) once a stop served while idle is stopping the query:
        #: a micro-batch starting now must not run (`_refuse_batch`).
        self._closing = False
        #: Set once that stop has ended the job (or failed to), by this thread.
        self._closed = threading.Event()
        self._stopper: threading.Thread | None = None
        self._idle_query: Any = None
        self._observed: HistoryRecord | None = None
        #: The newest batches' history records, for `progress_listener`.
        self.recent = RecentRecords()
        if metrics_port is not None:
            try:
                from statehold.spark.metrics import JobMetrics
            except ModuleNotFoundError as exc:
                if not is_missing_extra(exc, "metrics"):
                    raise
                raise missing_extra(exc, "metrics", "metrics_port (Prometheus)") from exc

            self.metrics = JobMetrics(job_id, metrics_port, metrics_host)

    # -- where things are ----------------------------------------------------------------
    @property
    def job_dir(self) -> str:
        """URI of the job directory (everything needed to resume lives in it)."""
        return self.storage.uri

    @property
    def spark_checkpoint_location(self) -> str:
        """Where Spark's streaming checkpoint (source offsets, commits) must go: ``_spark/``
        inside the job directory, so copying the job directory copies a complete restore
        point. (On S3 Spark needs the hadoop-aws connector for the ``s3a://`` URI, on
        Azure hadoop-azure for the ``abfss://`` one: `s3a_conf`, `abfs_conf`.)"""
        return spark_checkpoint_location(self.storage)

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """The attempt's coordinator, started on first use (claims a new epoch)."""
        if self._stopped is not None:
            raise JobStoppedError(
                f"job {self.job_id} was stopped from outside (request {self._stopped.id}): "
                "start a new StatefulJob to resume it"
            )
        if self._coordinator is None:
            if self._batches_remote:
                raise refuse(
                    f"job {self.job_id}'s own attempt on the client after foreach_batch",
                    "its batches run in the Connect server's foreachBatch process, and a "
                    "second attempt would fence them; stop the query, then open a new "
                    "StatefulJob (or use the statehold CLI)",
                )
            # `ha`: a store, a URI ("embedded", "zookeeper://host:port/path"), or None: the
            # one the job directory records (embedded for a new job).
            # spark.read.format("statehold") reads job directories in this session from
            # the job's start (PySpark 4; under Spark Connect only when asked, by
            # register_data_source: one call to the server)
            if not is_connect(self.spark):
                register_if_supported(self.spark)
            job = open_job(self.storage, self._ha, job_id=self.job_id, create=True)
            if self.restore_from is not None and self.restore_mode is not RestoreMode.RESUME:
                from statehold.checkpoint.restore import restore_into

                with opened(
                    self.restore_from, checkpoint=True, **self.storage_options
                ) as source:
                    assert source.metadata_key is not None
                    restore_into(source.storage, source.metadata_key, job.storage, job.ha,
                                 job_id=self.job_id, mode=self.restore_mode)
            self._coordinator = CheckpointCoordinator.start(
                job,
                max_parallelism=self.max_parallelism,
                retain=self.retain,
                retain_for=self.retain_for,
            )
            coord = self._coordinator
            self._inbox = Inbox(coord.storage, coord.epoch, coord.check_epoch, coord.discard)
            self._coordinator.history.keep = self.history
            if self.metrics is not None:
                self.metrics.attach(self._coordinator.epoch, self._coordinator.cleaner.status)
        return self._coordinator

    def latest_checkpoint_id(self) -> int | None:
        latest = self.coordinator.latest()
        return None if latest is None else latest[1].checkpoint_id

    # -- running -------------------------------------------------------------------------
    def run_batch(
        self,
        df: DataFrame,
        process: KeyFunction | BatchFunction,
        output_schema: StructType | str,
        *,
        key: str | Sequence[str] = "key",
        batch_id: int | None = None,
        sink: Sink | None = None,
        order_by: Sequence[str] = (),
        input_format: InputFormat = "rows",
        vectorized: bool = False,
        source_position: Mapping[str, Any] | None = None,
        processing_time_ms: int | None = None,
    ) -> BatchResult:
        """Process one batch `df` into checkpoint `batch_id` (default: the latest + 1).

        With a `sink`, it writes the output before the checkpoint completes (exactly
        once); without one, the checkpoint completes first and ``result.output`` is yours
        to write. `order_by` orders the rows of a key within the batch (else Spark's
        shuffle order, which is not deterministic across runs). `processing_time_ms`: the
        batch's processing time for state TTLs (default: now)."""
        keys = (key,) if isinstance(key, str) else tuple(key)
        batch = BatchRequest(
            df, process, self._struct(output_schema), keys, tuple(order_by), input_format,
            vectorized, processing_time_ms, batch_id, sink, source_position or {},
        )
        with self._batch_lock:
            return self._at_boundary(run_checkpoint(self._checkpointing(), batch))

    def transform_with_state(
        self,
        df: DataFrame,
        processor: Any,
        output_schema: StructType | str,
        *,
        key: str | Sequence[str] = "key",
        time_mode: str = "None",
        event_time_column: str | None = None,
        watermark_delay: int | timedelta = 0,
        late_rows: LateRows = "drop",
        batch_id: int | None = None,
        sink: Sink | None = None,
        order_by: Sequence[str] = (),
        input_format: InputFormat | None = None,
        source_position: Mapping[str, Any] | None = None,
        processing_time_ms: int | None = None,
        initial_state: DataFrame | None = None,
        initial_state_key: str | Sequence[str] | None = None,
    ) -> BatchResult:
        """Run a `statehold.processor.StatefulProcessor` (or a class written for Spark's
        ``transformWithStateInPandas``) over one batch `df` into checkpoint `batch_id`.

        ``time_mode``: None, ProcessingTime or EventTime (timers' clock). With
        ``event_time_column`` (a timestamp, or integer milliseconds) the watermark after
        the batch is the newest event time seen minus ``watermark_delay`` (ms or a
        timedelta), never moving back; it is kept in the checkpoint and the next batch runs
        with it: its rows at or before it are late (``late_rows``: "drop", counted, or
        "process") and its event-time timers at or before it fire. `df` may be empty: a
        batch then only fires timers (see `timers_due`). ``processing_time_ms``: the
        batch's processing time (default: now), for TTLs and processing-time timers.
        ``input_format``: as in `run_batch` (default "rows"; "pandas" for a Spark class).
        ``initial_state``: a DataFrame whose rows go, per key (``initial_state_key``
        columns, default `key`'s names), to ``handle_initial_state`` in the job's first
        batch only: ignored once the job has a checkpoint (statehold.spark.initial_state)."""
        from statehold.spark.processing import event_time_after, processor_spec

        keys = (key,) if isinstance(key, str) else tuple(key)
        delay_ms = millis(watermark_delay)
        pspec, fmt = processor_spec(
            self._newest_clock, df, processor, keys, time_mode, event_time_column, late_rows,
            now_ms() if processing_time_ms is None else processing_time_ms, input_format,
        )
        from statehold.processor.record import for_batch

        schemas = for_batch(self, df, processor, keys, fmt)  # refuses what cannot be read
        if initial_state is not None and self.coordinator.latest() is None:
            from statehold.spark.initial_state import initial_keys, with_initial_state

            state_keys = initial_keys(keys, initial_state_key)
            df = with_initial_state(df, initial_state, keys, state_keys)
            pspec = dataclasses.replace(pspec, initial_state=True)
        batch = BatchRequest(
            df, processor, self._struct(output_schema), keys, tuple(order_by), fmt,
            processing_time_ms=pspec.processing_time_ms, batch_id=batch_id, sink=sink,
            source_position=source_position or {}, processor=pspec,
            event_time=lambda figures: event_time_after(pspec, delay_ms, figures),
            schemas=schemas,
        )
        with self._batch_lock:
            return self._at_boundary(run_checkpoint(self._checkpointing(), batch))

    def timers_due(self, processing_time_ms: int | None = None) -> bool:
        """Whether the newest checkpoint has a timer due in the next batch: at or before
        its watermark (event time) or `processing_time_ms` (default now; processing
        time). A driver runs a batch without input while this holds."""
        latest = self.coordinator.latest()
        clock = None if latest is None else latest[1].event_time
        if clock is None or clock.next_timer_ms is None:
            return False
        if clock.time_mode == "eventtime":
            return clock.watermark_ms is not None and clock.next_timer_ms <= clock.watermark_ms
        if clock.time_mode == "processingtime":
            now = now_ms() if processing_time_ms is None else processing_time_ms
            return clock.next_timer_ms <= now
        return False

    def foreach_batch(
        self,
        process: KeyFunction | BatchFunction | Any,
        output_schema: StructType | str,
        *,
        sink: Sink,
        key: str | Sequence[str] = "key",
        order_by: Sequence[str] = (),
        input_format: InputFormat | None = None,
        vectorized: bool = False,
        on_batch: Callable[[BatchResult], None] | None = None,
        **processor_options: Any,
    ) -> Callable[[DataFrame, int], None]:
        """A function for ``writeStream.foreachBatch``: checkpoint id = Spark batch id.

        Use with ``.option("checkpointLocation", job.spark_checkpoint_location)``.

        `process` may be a stateful processor: then `processor_options` are those of
        `transform_with_state` (``time_mode``, ``event_time_column``, ``watermark_delay``,
        ``late_rows``, ``initial_state``, ``initial_state_key``) and of
        `statehold.spark.streaming.ProcessorBatches` (``no_data_batches``,
        ``input_schema``); batches that only fire timers take checkpoint ids too, so
        checkpoint ids are no longer Spark's batch ids (see that module).

        Under Spark Connect it returns a `statehold.spark.connect.RemoteBatches`: the
        batches run in a Python process beside the server, which opens the job itself;
        `process`, `sink`, `on_batch` and ``on_phase`` are pickled and run there."""
        if is_connect(self.spark) and not self._batches_here:
            return self._remote_batches(
                process, output_schema,
                dict(sink=sink, key=key, order_by=order_by, input_format=input_format,
                     vectorized=vectorized, on_batch=on_batch, **processor_options),
            )
        if is_processor(process):
            return self._processor_batches(
                process, output_schema, on_batch,
                dict(sink=sink, key=key, order_by=order_by, input_format=input_format,
                     **processor_options),
            )
        if processor_options:
            raise OptionsError(f"options {sorted(processor_options)} are for stateful processors")
        fmt: InputFormat = input_format or "rows"
        results: list[BatchResult] = []

        def run(batch_df: DataFrame, batch_id: int) -> None:
            self.check_replay(batch_id)
            results[:] = [self.run_batch(batch_df, process, output_schema, key=key,
                                         batch_id=batch_id, sink=sink, order_by=order_by,
                                         input_format=fmt, vectorized=vectorized)]

        self._serve_idle()
        return StreamBatches(self, run, None if on_batch is None else
                             lambda: on_batch(results[0]))

    def stream_batches(self, func: Callable[[DataFrame, int], None]) -> StreamBatches:
        """A ``writeStream.foreachBatch`` function running your own `func` (which calls
        `run_batch` or `transform_with_state` for the micro-batch, say after checking its
        rows) as this job's micro-batch, the way `foreach_batch` runs its own: the job's
        attempt starts now, requests from outside are served at the end of each micro-batch
        and while the query is idle, and a stop stops the query (its
        ``awaitTermination()`` returns; `stop_requested` says why)."""
        if is_connect(self.spark):
            raise refuse("stream_batches under Spark Connect",
                         "use foreach_batch, whose batches run in the server's process")
        self._serve_idle()
        return StreamBatches(self, func)

    def check_replay(self, batch_id: int) -> None:
        """Spark may replay only its last batch (id == our latest checkpoint). An older id
        means Spark's checkpoint (``_spark/``) is behind ours, e.g. it was deleted or
        belongs to another copy; skipping those batches would silently lose input."""
        self._replays.check(batch_id, self.latest_checkpoint_id(),
                            "statehold's latest checkpoint {}")

    def progress_listener(self, callback: ProgressCallback) -> StateholdProgressListener:
        """A Spark `StreamingQueryListener` calling ``callback(progress, record)`` with
        Spark's progress of each micro-batch and statehold's history record of it
        (statehold.spark.progress says why not inside Spark's progress itself)."""
        if is_connect(self.spark):
            raise refuse(
                "progress_listener",
                "the batches' records are made in the server's foreachBatch process, not "
                "in the client; read them from the job's history (statehold history)",
            )
        return StateholdProgressListener(self.recent, callback)

    @property
    def stopped(self) -> RequestAnswer | None:
        """The answer to the stop request that ended this job (None: not stopped). A stop
        served while the query was idle stops the query before it ends the job: asked
        meanwhile (say right after ``awaitTermination()`` returned), this waits for it."""
        if self._closing and threading.current_thread() is not self._stopper:
            self._closed.wait(2 * STOP_WAIT_SECONDS)
        return self._stopped

    @property
    def stop_requested(self) -> bool:
        """Whether a stop asked from outside ended this job (``statehold stop JOB``):
        a driver looping over `run_batch` itself leaves its loop (`run_batch` refuses
        from now on); `foreach_batch` stops its streaming query by itself."""
        return self.stopped is not None

    def serve_requests(self, *, stream: bool = False) -> None:
        """Act on the savepoints and stops asked from outside (`statehold.checkpoint.
        requests`): one listing of ``_job/requests/``. `run_batch`, `transform_with_state`
        and `foreach_batch` call it after each batch; a loop of your own over `run_batch`
        calls it while it waits for input (neither needs a batch: a savepoint keeps the
        newest checkpoint), then leaves on `stop_requested`. A stop ends the job (``end``:
        keep the newest checkpoint) and, with `stream`, stops the streaming query whose
        ``foreachBatch`` is running (`statehold.spark.streaming.stop_this_query`)."""
        with self._batch_lock:
            self._serve(stream=stream)

    def _serve(
        self, *, stream: bool, idle: bool = False, stoppable: Callable[[], Any] | None = None
    ) -> OperatorRequest | None:
        """`serve_requests` under the batch lock. `idle`: served outside the query's
        micro-batches: a stop is accepted only when ``stoppable()`` gives the query to stop
        (its savepoint taken, `_closing` set), and returned for `_stop_idle_query`, which
        stops the query before the job ends; else it waits for a batch boundary."""
        if self._coordinator is None or self._inbox is None or self._stopped is not None:
            return None
        inbox, coord = self._inbox, self._coordinator
        for request in inbox.poll():
            if idle and request.action is Action.STOP:
                self._idle_query = None if stoppable is None else stoppable()
                if self._idle_query is None:
                    continue
            if not inbox.accept(request):
                continue
            if request.savepoint is not None:
                try:
                    meta = coord.savepoint(request.savepoint)
                except StateholdError as e:
                    inbox.answer(request, Outcome.FAILED, f"savepoint not taken: {e}")
                    continue  # a failed stop-with-savepoint leaves the job running
                saved = layout.savepoint_dir(request.savepoint)
                if request.action is Action.SAVEPOINT:
                    inbox.answer(request, Outcome.DONE,
                                 f"savepoint {saved} of checkpoint {meta.checkpoint_id}",
                                 savepoint_key=saved, checkpoint_id=meta.checkpoint_id)
                    continue
            if request.action is Action.STOP:
                if idle:
                    self._stopper = threading.current_thread()
                    self._closing = True  # from now on a starting micro-batch is refused
                    return request
                self._stop(request, stream)
                return None
        return None

    def savepoint(self, name: str) -> CheckpointMetadata:
        """Keep the newest checkpoint as savepoint `name` (``savepoints/<name>/``): never
        subsumed, never deleted by any cleanup, only by ``statehold dispose``."""
        return self.coordinator.savepoint(name)

    def end(
        self,
        outcome: JobOutcome | str = JobOutcome.FINISHED,
        policy: RetentionPolicy | str = RetentionPolicy.KEEP_LATEST,
        *,
        savepoint: str | None = None,
    ) -> bool:
        """The job is over for good: record it, clean up per `policy` (keep the newest
        checkpoint, or delete all checkpoints), optionally keeping a savepoint first.
        False if the cleanup could not finish (the next driver finishes it). After a stop
        asked from outside (`stopped`) it only says whether that end finished."""
        if self.stopped is not None:
            return self.stopped.outcome is Outcome.DONE
        done = self.coordinator.end(
            JobOutcome(outcome), RetentionPolicy(policy), savepoint=savepoint
        )
        self.close()
        return done

    def close(self) -> None:
        self._idle_done.set()
        idle = self._idle  # a stop served while idle closes the job from that thread too
        if idle is not None and idle is not threading.current_thread():
            idle.join(timeout=2 * STOP_WAIT_SECONDS)
        self._idle = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator.job.close()
            self._coordinator = None

    def __enter__(self) -> StatefulJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def use_session(self, spark: SparkSession) -> None:
        """Run the next batches with `spark` (under Connect, the server's foreachBatch
        process may be handed a new session per batch)."""
        self.spark = spark
        self._schemas.spark = spark

    # -- internals -------------------------------------------------------------------------
    def _remote_batches(
        self, process: Any, output_schema: StructType | str, options: dict[str, Any]
    ) -> RemoteBatches:
        """`foreach_batch` under Spark Connect (statehold.spark.connect): this job's
        settings, refusing what cannot travel to the server's process."""
        if self._coordinator is not None:
            raise refuse(
                "foreach_batch on a job that already started its attempt in the client",
                "the server's foreachBatch process starts its own; use a new StatefulJob",
            )
        if self.metrics is not None:
            raise refuse(
                "metrics_port with foreach_batch",
                "the batches run in the server's foreachBatch process, not in the client",
            )
        if self._ha is not None and not isinstance(self._ha, str):
            raise refuse(
                "an HA store object with foreach_batch",
                "it cannot travel to the server's foreachBatch process; pass ha as a URI",
            )
        config = JobConfig(
            checkpoints=self._checkpoints, job_id=self.job_id,
            max_parallelism=self.max_parallelism, parallelism=self.parallelism,
            retain=self.retain, storage_options=self.storage_options,
            operator=self.operator, local_dir=self.local_dir, ha=self._ha,
            backend_options=self.backend_options, restore_from=self.restore_from,
            restore_mode=self.restore_mode.value, on_phase=self.on_phase,
            history=self.history, retain_for=self.retain_for,
            task_batch_rows=self.task_batch_rows,
        )
        self._batches_remote = True
        return RemoteBatches(config, type(self), process, output_schema, options)

    def _at_boundary(self, result: BatchResult) -> BatchResult:
        """After `run_batch` or `transform_with_state` (not inside a micro-batch of
        `foreach_batch` or `stream_batches`, which serves them at its end): requests are
        served; a stop inside some other ``foreachBatch`` function stops its query too,
        and one reaching a streaming job outside its query (``fire_due_timers``) is left
        to the idle thread, which stops the query before the job ends."""
        if self._in_stream:
            return result
        if query_of_this_thread(self.spark) is not None:
            self.serve_requests(stream=True)
        elif self._idle is not None:  # a streaming job's call outside its query (timers)
            with self._batch_lock:  # its stops are the idle thread's: it stops the query
                self._serve(stream=False, idle=True)
        else:
            self.serve_requests()
        return result

    @contextlib.contextmanager
    def _streaming(self) -> Iterator[None]:
        """A Spark micro-batch: requests wait for its end (a processor's batch may be
        several checkpoints: its input, then timers). One that starts while a stop served
        while idle is stopping its query does not run (`_refuse_batch`)."""
        with self._batch_lock:
            self._query_id = query_of_this_thread(self.spark) or self._query_id
            closing = self._closing
            if not closing:
                self._in_stream = True
                try:
                    yield
                finally:
                    self._in_stream = False
        if closing:
            self._refuse_batch()

    def _refuse_batch(self) -> NoReturn:
        """A micro-batch Spark began while an idle stop was stopping its query. It must
        not run (the job is ending) and must not return either: Spark would then commit
        its input as processed. It fails, after waiting for the stop to interrupt it as
        Spark interrupts any micro-batch it stops (which Spark takes for a clean stop):
        Spark does not commit it, and the next start of the job runs it."""
        await_interruption(self.spark, self._query_id)
        raise JobStoppedError(
            f"job {self.job_id} was stopped from outside while this micro-batch began: "
            "not run (the next start of the job runs it)"
        )

    def _serve_idle(self) -> None:
        """Start the attempt (so a driver waiting for its query's first micro-batch is a
        running attempt to ask) and the idle thread serving requests while no batch runs
        (`idle_requests_every`)."""
        if not is_connect(self.spark):
            self.coordinator  # noqa: B018 - starts the attempt
        if self.idle_requests_every is None or self._idle is not None:
            return
        self._idle_done.clear()
        self._idle = threading.Thread(target=self._serve_when_idle, daemon=True,
                                      name=f"statehold-requests-{self.job_id}")
        self._idle.start()

    def _serve_when_idle(self) -> None:
        """A streaming query without new input runs no batch, so no boundary: every
        `idle_requests_every` seconds, if no batch holds the lock, requests are served
        here. A savepoint keeps the newest checkpoint, as at a boundary; a stop stops the
        query (when no trigger of it is active) before it ends the job (`_stop_idle_query`)."""
        every = self.idle_requests_every or IDLE_REQUESTS_SECONDS
        while not self._idle_done.wait(every):
            if not self._batch_lock.acquire(blocking=False):
                continue  # a batch runs: it serves them at its end
            stop: OperatorRequest | None = None
            try:
                stop = self._serve(stream=False, idle=True, stoppable=self._stoppable)
            except StateholdError as e:  # fenced, storage down: the next batch says so
                log.warning("job %s: serving requests while idle: %s", self.job_id, e)
            finally:
                self._batch_lock.release()
            if stop is not None:
                self._stop_idle_query(stop, self._idle_query)
                return

    def _stoppable(self) -> Any:
        """The query a stop served while idle may stop now (`idle_query`), None: none."""
        if is_connect(self.spark):
            return None
        query = idle_query(self.spark, self._query_id, self.spark_checkpoint_location)
        if query is not None:
            self._query_id = str(query.id)
        return query

    def _stop_idle_query(self, request: OperatorRequest, query: Any) -> None:
        """A stop served while idle (accepted, its savepoint taken): stop the query first,
        with the batch lock free so that a micro-batch Spark began meanwhile can reach
        `_refuse_batch` (the stop waits for it), then end the job as at a boundary."""
        try:
            if not stop_query(query, STOP_WAIT_SECONDS):
                log.warning("job %s: query %s did not stop within %.0fs; the job ends anyway",
                            self.job_id, self._query_id, STOP_WAIT_SECONDS)
            with self._batch_lock:
                self._stop(request, stream=False)
        except StateholdError as e:  # answered failed; the query has stopped
            log.warning("job %s: stop while idle: %s", self.job_id, e)
        finally:
            self._closed.set()

    def _stop(self, request: OperatorRequest, stream: bool) -> None:
        """End the job as `request` asked (its savepoint already taken): the job's
        `end` path, the answer (still under this attempt's epoch), then the lease."""
        coord, inbox = self.coordinator, self._inbox
        assert inbox is not None
        latest = self.latest_checkpoint_id()
        saved = None if request.savepoint is None else layout.savepoint_dir(request.savepoint)
        try:
            clean = coord.end(JobOutcome.FINISHED, RetentionPolicy.KEEP_LATEST)
        except StateholdError as e:
            inbox.answer(request, Outcome.FAILED, f"stop failed: {e}")
            raise
        said = f"stopped after checkpoint {latest}" + (f"; savepoint {saved}" if saved else "")
        if not clean:
            said += " (its cleanup did not finish; the next start finishes it)"
        inbox.answer(request, Outcome.DONE, said, savepoint_key=saved, checkpoint_id=latest)
        self._stopped = RequestAnswer(
            id=request.id, outcome=Outcome.DONE if clean else Outcome.FAILED,
            epoch=coord.epoch, message=said, savepoint_key=saved, checkpoint_id=latest,
            at=clock.now(),
        )
        self.close()
        if stream:
            stop_this_query(self.spark)

    def _processor_batches(
        self,
        processor: Any,
        output_schema: StructType | str,
        on_batch: Callable[[BatchResult], None] | None,
        options: dict[str, Any],
    ) -> ProcessorBatches:
        """`foreach_batch` of a processor: `options` are those of `transform_with_state`
        and of `ProcessorBatches` (``no_data_batches``, ``input_schema``)."""
        self._serve_idle()
        no_data_batches = options.pop("no_data_batches", True)
        input_schema = options.pop("input_schema", None)

        def run(df: DataFrame, position: Mapping[str, Any], time_ms: int | None) -> BatchResult:
            return self.transform_with_state(df, processor, output_schema,
                                             source_position=position,
                                             processing_time_ms=time_ms, **options)

        job = ProcessorJob(run, self.timers_due, self._newest, self._replays, self.recent,
                           self.spark, streaming=self._streaming,
                           boundary=lambda: self.serve_requests(stream=True),
                           stopped=lambda: self._closing or self._stopped is not None)
        return ProcessorBatches(
            job, no_data_batches=no_data_batches, on_batch=on_batch,
            input_schema=None if input_schema is None else self._struct(input_schema),
        )

    def _checkpointing(self) -> Checkpointing:
        """This job as `run_checkpoint` sees it (starting the attempt on first use)."""
        coordinator = self.coordinator
        settings = JobSettings(
            storage_uri=self.storage.uri, storage_options=self.storage_options,
            job_id=self.job_id, operator=self.operator, max_parallelism=self.max_parallelism,
            parallelism=self.parallelism, local_dir=self.local_dir,
            backend_options=self.backend_options, task_batch_rows=self.task_batch_rows,
            key_hash=coordinator.key_hash,
        )
        return Checkpointing(coordinator, settings, self.job_dir, self._phase,
                             self._observe, self._kept)

    @property
    def _replays(self) -> ReplayCheck:
        return ReplayCheck(self.job_dir, self.spark_checkpoint_location)

    def _newest(self) -> CheckpointMetadata | None:
        latest = self.coordinator.latest()
        return None if latest is None else latest[1]

    def _newest_clock(self) -> EventTime | None:
        newest = self._newest()
        return None if newest is None else newest.event_time

    def _observe(self, record: HistoryRecord | None) -> None:
        """The checkpoint's record to the Prometheus metrics and Spark's listeners."""
        if record is None or record is self._observed:
            return
        self._observed = record
        self.recent.add(record)
        if self.metrics is not None:
            self.metrics.observe(record)

    def _phase(self, phase: str, batch_id: int) -> None:
        if self.on_phase is not None:
            self.on_phase(phase, batch_id)

    def _struct(self, schema: StructType | str) -> StructType:
        return self._schemas.struct(schema)


__all__ = ["BatchResult", "JobStoppedError", "StatefulJob", "StreamBatches", "replace_output"]
