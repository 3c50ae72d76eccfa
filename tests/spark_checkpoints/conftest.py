"""The committed Spark checkpoint fixtures (tests/fixtures/spark/), extracted once per run
for every module here that reads them (`extracted`: a version's archive the first time a
test asks for it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.spark_locations.committed_fixtures import extractor


@pytest.fixture(scope="session")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Extracts a PySpark version's archive; tests copy what they change (`copy_of`)."""
    return extractor(tmp_path_factory.mktemp("spark-fixtures"))
