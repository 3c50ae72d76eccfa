"""Registering ``format("statehold")`` in a session (`statehold.spark.data_source` says
what it reads). Apart from the data source itself, so that importing `statehold.spark`
never needs PySpark 4: the classes PySpark 4 calls are imported only after the check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from statehold.spark.data_source import DataSourceUnavailableError, data_sources_supported

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register_data_source(spark: SparkSession) -> None:
    """Make ``spark.read.format("statehold")`` read in `spark` (classic or Spark Connect).
    Cheap, and safe to call again. PySpark 3.5 has no Python data sources: refused in
    one line (use `statehold.spark.read_state` there)."""
    if not data_sources_supported():
        import pyspark

        raise DataSourceUnavailableError(
            f'format("statehold") needs PySpark 4.0 or newer (Python data sources); this is '
            f"PySpark {pyspark.__version__}: use statehold.spark.read_state(spark, path) instead"
        )
    from statehold.spark.data_source_reader import StateholdDataSource

    spark.dataSource.register(StateholdDataSource)


def register_if_supported(spark: SparkSession) -> bool:
    """`register_data_source` where this PySpark has Python data sources (what a new
    `StatefulJob` does); False where it has none."""
    if not data_sources_supported():
        return False
    register_data_source(spark)
    return True


__all__ = ["register_data_source", "register_if_supported"]
