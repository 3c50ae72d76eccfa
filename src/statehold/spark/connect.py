"""Spark Connect: what changes when `spark` is a remote session (``SparkSession.builder
.remote("sc://...")``).

The client has no SparkContext and no JVM, so nothing here may touch them: the default
parallelism is read from the settings (or measured with a tiny query), schemas are parsed
by the server. `run_batch`, `transform_with_state`, `read_state` and `savepoint` then work
as they are: the coordinator runs in the client process (Connect's driver), the tasks on
the server's executors.

``writeStream.foreachBatch`` is different. Connect pickles the function and calls it in a
Python process beside the server, once per micro-batch, with a DataFrame of a session of
its own. A closure holding the client's coordinator, HA lease or session would carry
copies of live objects (threads, connections, a claimed epoch) into that process. So under
Connect `StatefulJob.foreach_batch` returns `RemoteBatches`: only the job's plain settings
and the user's functions. In the server-side process it opens the job once (a new attempt,
with its own epoch, as a restarted driver would) and keeps it for the process's life.
The client's job then refuses its own coordinator: a second attempt would fence the
running query's.
"""

from __future__ import annotations

import atexit
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statehold.errors import StateholdError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Rows of the query that measures a Connect server's default parallelism: enough for
#: every one of up to this many partitions to get one.
_PROBE_ROWS = 1 << 16


class ConnectUnsupportedError(StateholdError, RuntimeError):
    """Something that needs the JVM driver (or a live object of it) was asked of a Spark
    Connect session."""


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (without importing the Connect client,
    which needs grpcio)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def refuse(what: str, why: str) -> ConnectUnsupportedError:
    """The one-line error for `what`, which cannot work under Spark Connect because `why`."""
    return ConnectUnsupportedError(f"{what} does not work under Spark Connect: {why}")


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: the SparkContext's where there is one; under Connect
    ``spark.default.parallelism`` if set, else the number of partitions ``spark.range``
    splits into (Spark's ``leafNodeDefaultParallelism``, by default the same number)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    from pyspark.sql import functions as F

    partitions = spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
    row = partitions.agg(F.max("p")).first()
    return 1 if row is None or row[0] is None else int(row[0]) + 1


@dataclass(frozen=True)
class JobConfig:
    """A `StatefulJob` as plain settings: enough to open it again in another process."""

    checkpoints: str
    job_id: str
    max_parallelism: int
    parallelism: int
    retain: int
    storage_options: Mapping[str, Any]
    operator: str
    local_dir: str | None
    ha: str | None
    backend_options: Mapping[str, Any]
    restore_from: str | None
    restore_mode: str
    on_phase: Callable[[str, int], None] | None
    history: int
    retain_for: float | None = None
    task_batch_rows: int = 10_000

    def open(self, job_class: Callable[..., Any], spark: SparkSession) -> Any:
        """The job in this process: ``job_class`` is `StatefulJob` (handed over by it, as
        this module does not import the job it serves)."""
        job = job_class(
            spark, self.checkpoints, self.job_id, max_parallelism=self.max_parallelism,
            parallelism=self.parallelism, retain=self.retain,
            storage_options=self.storage_options, operator=self.operator,
            local_dir=self.local_dir, ha=self.ha, backend_options=self.backend_options,
            restore_from=self.restore_from, restore_mode=self.restore_mode,
            on_phase=self.on_phase, history=self.history, retain_for=self.retain_for,
            task_batch_rows=self.task_batch_rows,
        )
        job._batches_here = True
        return job


#: The jobs `RemoteBatches` opened in this process, and their batch functions, by token.
_OPENED: dict[str, tuple[Any, Callable[[DataFrame, int], None]]] = {}
_OPENING = threading.Lock()


@dataclass(frozen=True)
class RemoteBatches:
    """The ``foreachBatch`` function of a job under Spark Connect (see the module's
    docstring): `config` and `options` (those of `StatefulJob.foreach_batch`) are plain
    data and the user's own picklable functions."""

    config: JobConfig
    #: `StatefulJob` (pickled by reference)
    job_class: Callable[..., Any]
    process: Any
    output_schema: Any
    options: Mapping[str, Any]
    #: names this handler across pickling: its process opens the job once
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.batches(batch_df.sparkSession)(batch_df, batch_id)

    def batches(self, spark: SparkSession) -> Callable[[DataFrame, int], None]:
        """The job's batch function in this process (opening the job the first time)."""
        with _OPENING:
            opened = _OPENED.get(self.token)
            if opened is None:
                job = self.config.open(self.job_class, spark)
                run = job.foreach_batch(self.process, self.output_schema, **self.options)
                opened = _OPENED[self.token] = (job, run)
                atexit.register(job.close)
            # Connect may hand each batch a session of its own: later calls use it.
            opened[0].use_session(spark)
        return opened[1]

    def fire_due_timers(self, processing_time_ms: int | None = None) -> list[Any]:
        raise refuse(
            "fire_due_timers from the client",
            "the processor's batches run in the Connect server's foreachBatch process; "
            "timers fire there when a micro-batch arrives (no_data_batches)",
        )


__all__ = [
    "ConnectUnsupportedError",
    "JobConfig",
    "RemoteBatches",
    "default_parallelism",
    "is_connect",
    "refuse",
]
