"""The committed Spark fixtures (tests/fixtures/spark/) against what the running Spark
writes today: tests/fixtures/spark/make.py's check runs the window query on every state
store layout this PySpark has and compares each location's files (names and kinds, the
commit log's batches; not bytes or times) with the committed manifest's, and the rows
each wrote with the committed output's (which test_spark_checkpoint_queries and
test_spark_s3a take as an uninterrupted run's). On the newest
PySpark in the suite and on each older one in .ci/spark-matrix (`matrix`), so a Spark that
writes something else, or a supported PySpark without a fixture, fails here."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.spark.make import CHECK_QUERY, check
from tests.support.spark_locations.queries import PROVIDERS

pytestmark = [pytest.mark.spark, pytest.mark.matrix]


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_this_spark_still_writes_what_its_fixture_holds(spark: Any, provider: str) -> None:
    problems = check(spark, CHECK_QUERY, [provider])
    assert not problems, "\n".join(problems)
