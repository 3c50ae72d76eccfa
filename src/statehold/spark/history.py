"""The checkpoint history as a Spark DataFrame."""

from __future__ import annotations

from typing import TYPE_CHECKING

from statehold.job.directory import JobDirectory, open_job
from statehold.job.history import HistoryRecord, read_history

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_TYPES = {int: "long", float: "double", str: "string"}


def history_schema() -> str:
    """The DataFrame's schema as DDL: one column per record field, in the model's order."""
    columns = []
    for name, field in HistoryRecord.model_fields.items():
        kind = field.annotation if field.annotation in _TYPES else str
        columns.append(f"{name} {_TYPES[kind]}")
    return ", ".join(columns)


def read_history_df(
    spark: SparkSession, job: JobDirectory | str, limit: int | None = None
) -> DataFrame:
    """The newest `limit` history records of a job directory (None: all), one row per
    checkpoint record, oldest first."""
    if isinstance(job, str):
        with open_job(job) as opened:
            records = read_history(opened.storage, limit)
    else:
        records = read_history(job.storage, limit)
    names = list(HistoryRecord.model_fields)
    rows = [tuple(getattr(r, n) for n in names) for r in records]
    return spark.createDataFrame(rows, history_schema())
