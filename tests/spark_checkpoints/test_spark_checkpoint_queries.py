"""Spark's own stateful queries on their checkpoints (tests/support/spark_locations/queries):
every query on every state store layout it runs on stops after a few batches, restarts on
the same checkpoint with more input, and writes the same rows as one uninterrupted run. The
baseline of the tests that inspect, savepoint, roll back and collect Spark's checkpoints:
their interventions must keep this equality.

Every pair runs on the newest PySpark (23 pairs; about 2 minutes on 2 cores); the older
ones (.ci/spark-matrix) run the window on every layout they have (`MATRIX`). The
reference run of each query is shared by its layouts, whose output does not depend on the
state store. The driver process with its checkpoint on S3 through S3A is tested in
tests/spark_checkpoints/test_spark_s3a.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.spark_locations.queries import (
    PROVIDERS,
    QUERIES,
    QueryFailed,
    Row,
    all_rows,
    read_output,
    run_query,
    unsupported,
    write_inputs,
)

pytestmark = [pytest.mark.spark]

FIRST = 4  # input files of the first run
MORE = 4  # input files added before the restart
PAIRS = [(q, p) for q in QUERIES for p in PROVIDERS if unsupported(q, p) is None]
#: What the older PySparks run too (`matrix`): the window on every layout (one reference
#: run). Every other query restarts on them from its committed fixture
#: (tests/spark_checkpoints: savepoint, rollback and gc, then a restart equal to the
#: fixture's uninterrupted run).
MATRIX = [(q, p) for q, p in PAIRS if q == "window"]


@pytest.fixture(scope="module")
def reference(
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], list[Row]]:
    """The rows of one run of a query over all FIRST + MORE files (each query run once)."""
    root = tmp_path_factory.mktemp("reference")
    inputs = root / "input"
    write_inputs(inputs, 0, FIRST + MORE)

    @functools.cache
    def rows(query: str) -> list[Row]:
        provider = next(p for p in PROVIDERS if unsupported(query, p) is None)
        out = root / query / "output"
        run_query(spark, query, provider, str(root / query / "checkpoint"), inputs, out, 0)
        return all_rows(out)

    return rows


def check_batches(output: Path, first_stop: int, last: int) -> None:
    """The batch ids are 0..last without a gap, the restart carried on after first_stop."""
    batches = read_output(output)
    assert sorted(batches) == list(range(last + 1)), sorted(batches)
    assert FIRST - 1 <= first_stop < last


@pytest.mark.parametrize(("query", "provider"), [
    pytest.param(q, p, marks=[pytest.mark.matrix] if (q, p) in MATRIX else []) for q, p in PAIRS
])
def test_stop_and_restart_equals_an_uninterrupted_run(
    spark: Any,
    reference: Callable[[str], list[Row]],
    tmp_path: Path,
    query: str,
    provider: str,
) -> None:
    inputs, output, checkpoint = tmp_path / "input", tmp_path / "output", tmp_path / "ckpt"
    write_inputs(inputs, 0, FIRST)
    first_stop = run_query(spark, query, provider, str(checkpoint), inputs, output, FIRST - 1)
    write_inputs(inputs, FIRST, MORE)
    last = run_query(spark, query, provider, str(checkpoint), inputs, output, first_stop + MORE)
    check_batches(output, first_stop, last)
    expected = reference(query)
    assert expected, f"{query}: the reference run wrote nothing"
    assert all_rows(output) == expected
    assert (checkpoint / "state" / "0").is_dir()


@pytest.mark.matrix  # each Spark's own refusal
def test_transform_with_state_on_hdfs_is_refused(
    spark: Any,
    tmp_path: Path,
) -> None:
    if "transform" not in QUERIES:
        pytest.skip("transformWithStateInPandas needs PySpark 4")
    write_inputs(tmp_path / "input", 0, 1)
    # Spark 4.1+ names the store; 4.0 refuses the store's second column family
    refused = "STORE_BACKEND_NOT_SUPPORTED_FOR_TWS|STATE_STORE_MULTIPLE_COLUMN_FAMILIES"
    with pytest.raises(QueryFailed, match=refused):
        run_query(spark, "transform", "hdfs", str(tmp_path / "ckpt"), tmp_path / "input",
                  tmp_path / "output", 0, timeout=120)
