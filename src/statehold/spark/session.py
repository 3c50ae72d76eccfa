"""A local SparkSession whose Python workers run this very interpreter.

PySpark starts its Python workers with ``PYSPARK_PYTHON`` (default: ``python3`` on the
PATH), which may be another interpreter without statehold, pyarrow or rocksdict; the
executors would then fail with an import error far from its cause. Setting it to
``sys.executable`` before the session starts avoids that for local runs.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def use_this_python() -> None:
    """Make Spark's Python workers use the current interpreter (call before the session
    starts; it has no effect on an already running SparkContext)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_session(
    app_name: str = "statehold",
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    ui: bool = False,
) -> SparkSession:
    """A small local session for examples and tests (quiet logs, few shuffle partitions)."""
    use_this_python()
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
