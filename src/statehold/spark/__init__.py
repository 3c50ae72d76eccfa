"""Keyed stateful processing for PySpark with statehold checkpoints.

    job = StatefulJob(spark, checkpoints="/data/ckpt", job_id="totals")
    query = (stream_df.writeStream
             .foreachBatch(job.foreach_batch(fn, "key string, total long", sink=write))
             .option("checkpointLocation", job.spark_checkpoint_location)
             .start())

`StatefulJob` is the entry point: `run_batch` for one batch, `foreach_batch` for
Structured Streaming, `transform_with_state` for a `statehold.processor.StatefulProcessor`.
"""

from statehold.spark.api import (
    BatchFunction,
    InputFormat,
    KeyedState,
    KeyFunction,
    ListState,
    MapState,
    PhaseHook,
    Sink,
    TaskStates,
    ValueState,
)
from statehold.spark.batch import BatchResult
from statehold.spark.history import read_history_df
from statehold.spark.job import StatefulJob, replace_output
from statehold.spark.progress import StateholdProgressListener
from statehold.spark.reader import iter_state, read_state
from statehold.spark.registration import register_data_source
from statehold.spark.session import (
    abfs_conf,
    classpath_conf,
    local_session,
    s3a_conf,
    use_this_python,
)
from statehold.spark.task import MalformedInputError, state_key

__all__ = [
    "BatchFunction",
    "BatchResult",
    "InputFormat",
    "KeyFunction",
    "KeyedState",
    "ListState",
    "MalformedInputError",
    "MapState",
    "PhaseHook",
    "Sink",
    "StatefulJob",
    "StateholdProgressListener",
    "TaskStates",
    "ValueState",
    "abfs_conf",
    "classpath_conf",
    "iter_state",
    "local_session",
    "read_history_df",
    "read_state",
    "register_data_source",
    "replace_output",
    "s3a_conf",
    "state_key",
    "use_this_python",
]
