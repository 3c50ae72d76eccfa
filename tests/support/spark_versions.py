"""Which PySpark runs the tests, and the marks for tests that need a newer one.

CI runs the Spark tests on 3.5, 4.0 and the newest 4.x (.ci/spark-matrix). A test skips only
for what the running PySpark does not have (Spark's own `StatefulProcessor` and
``transformWithStateInPandas`` came in 4.0), never for a statehold feature."""

from __future__ import annotations

import pyspark
import pytest

SPARK_VERSION = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
SPARK_4 = SPARK_VERSION >= (4, 0)

#: Spark's ``transformWithStateInPandas`` and its ``StatefulProcessor`` (the reference
#: some tests compare statehold's processors with) exist from PySpark 4.0.
needs_transform_with_state = pytest.mark.skipif(
    not SPARK_4, reason=f"PySpark {pyspark.__version__} has no transformWithStateInPandas "
    "(Spark 4.0 added it): the reference this test compares with")

if SPARK_4:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkProcessor
else:  # classes written for Spark still define on 3.5; their tests skip
    SparkProcessor = object  # type: ignore[assignment,misc]

#: Spark's state data source (``format("statestore")``), with which the benchmark reads
#: back the state Spark kept to check it, exists from PySpark 4.0.
needs_state_data_source = pytest.mark.skipif(
    not SPARK_4, reason=f"PySpark {pyspark.__version__} has no format(\"statestore\") (Spark "
    "4.0 added it): the benchmark checks Spark's own state with it")
