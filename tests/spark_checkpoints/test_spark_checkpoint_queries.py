"""Spark's own stateful queries on their checkpoints (tests/support/spark_locations/queries):
every query on every state store layout it runs on stops after a few batches with 2 shuffle
partitions, is repartitioned offline by statehold (`repartition`: to 5 partitions, or to 8
and that copy to 3, pair by pair), restarts on the repartitioned copy with more input, and
writes the same rows as one uninterrupted run: a key in another partition than Spark's
hash sends it to would lose its state, and its rows would differ. On RocksDB with changelog
checkpointing the repartition takes each batch of a source partition's changes as a run of
its own (`repartition.RUN_BYTES` lowered: what a state larger than the bound gets), so
Spark restarts on versions whose runs replace and delete each other's keys. The source
location does not change (its listing with sizes and mtimes). The baseline of the tests
that inspect, savepoint, roll back and collect Spark's checkpoints: their interventions
must keep this equality (they restart on the committed fixtures as Spark left them).

The uninterrupted run of each pair is its committed fixture (tests/fixtures/spark/, written
by this PySpark with the same settings over the same `FILES` input files, to its end): so
each pair costs Spark only its own two runs. That the running Spark still writes those rows
is checked live in tests/spark_checkpoints/test_spark_fixtures_live.py.

Every pair runs on the newest PySpark (23 pairs); the older ones (.ci/spark-matrix) run the
window on every layout they have (`MATRIX`). The driver process with its checkpoint on S3
through S3A is tested in tests/spark_checkpoints/test_spark_s3a.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
import pytest

from statehold.spark_checkpoints import open_spark_checkpoint, repartition
from statehold.spark_checkpoints.state_reader import file_record_batches, resolved
from statehold.spark_checkpoints.version_changes import VersionChanges
from tests.support.spark_locations.committed_fixtures import (
    FILES,
    TWS_GROUPING,
    extractor,
    fixture,
    manifests,
    rows,
)
from tests.support.spark_locations.disk_trees import listing
from tests.support.spark_locations.queries import (
    PROVIDERS,
    QUERIES,
    QueryFailed,
    all_rows,
    read_output,
    run_query,
    unsupported,
    write_inputs,
)

pytestmark = [pytest.mark.spark]

FIRST = 3  # input files of the first run
MORE = FILES - FIRST  # input files added before the restart: the fixture's FILES in all
PAIRS = [(q, p) for q in QUERIES for p in PROVIDERS if unsupported(q, p) is None]
#: What the older PySparks run too (`matrix`): the window on every layout. Every other
#: query restarts on them from its committed fixture (tests/spark_checkpoints: savepoint,
#: rollback and gc, then a restart equal to the fixture's uninterrupted run).
MATRIX = [(q, p) for q, p in PAIRS if q == "window"]
#: transformWithState's state variables: its value state and its timers' two families.
STATE_VARIABLES = {"transform": list(TWS_GROUPING)}
#: The partitions each pair's restart runs with: more than the first run's 2 (5), or
#: fewer than a copy with more (2 -> 8 -> 3), every other pair.
STEPS = {pair: (5,) if i % 2 == 0 else (8, 3) for i, pair in enumerate(PAIRS)}


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """This PySpark's committed fixtures, extracted once for the module."""
    assert pyspark.__version__ in manifests(), (
        f"no committed fixture of PySpark {pyspark.__version__}: "
        "python -m tests.fixtures.spark.make")
    return extractor(tmp_path_factory.mktemp("spark-fixtures"))


def check_batches(output: Path, first_stop: int, last: int) -> None:
    """The batch ids are 0..last without a gap, the restart carried on after first_stop."""
    batches = read_output(output)
    assert sorted(batches) == list(range(last + 1)), sorted(batches)
    assert FIRST - 1 <= first_stop < last


@pytest.mark.parametrize(("query", "provider"), [
    pytest.param(q, p, marks=[pytest.mark.matrix] if (q, p) in MATRIX else []) for q, p in PAIRS
])
def test_stop_repartition_and_restart_equals_an_uninterrupted_run(
    spark: Any,
    extracted: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    query: str,
    provider: str,
) -> None:
    version = pyspark.__version__
    uninterrupted = fixture(extracted(version), version, query, provider)
    assert uninterrupted.entry["files"] == FIRST + MORE
    expected = rows(uninterrupted)
    assert expected, f"{query} on {provider}: the uninterrupted run wrote nothing"

    inputs, output, checkpoint = tmp_path / "input", tmp_path / "output", tmp_path / "ckpt"
    write_inputs(inputs, 0, FIRST)
    first_stop = run_query(spark, query, provider, str(checkpoint), inputs, output, FIRST - 1)
    before = listing(checkpoint)
    taken = []
    if provider == "rocksdb_changelog":
        real = VersionChanges.taken

        def noted(self: VersionChanges) -> Any:
            taken.append(1)
            return real(self)

        monkeypatch.setattr(repartition, "RUN_BYTES", 1)
        monkeypatch.setattr(VersionChanges, "taken", noted)
    restart = checkpoint
    for step, partitions in enumerate(STEPS[(query, provider)]):
        source, restart = restart, tmp_path / f"repartitioned-{step}"
        report = open_spark_checkpoint(str(source)).repartition(str(restart),
                                                                partitions=partitions)
        assert report.verified and report.batch == first_stop, report
        assert report.partitions == partitions
    assert listing(checkpoint) == before
    # runs where the batch's versions replay changelogs (Spark's maintenance may have
    # written a snapshot of them by the stop); transformWithState's families are routed
    # as they are read, never in runs
    assert bool(taken) == (provider == "rocksdb_changelog" and query != "transform"
                           and _replays_changelogs(checkpoint, first_stop, tmp_path)), query
    # the copy stands alone (transformWithState's metadata names its schema files by
    # absolute path): the source and any copy between are gone before the restart
    for gone in (checkpoint, *(tmp_path / f"repartitioned-{i}" for i in range(step))):
        shutil.rmtree(gone)
    write_inputs(inputs, FIRST, MORE)
    last = run_query(spark, query, provider, str(restart), inputs, output, first_stop + MORE)
    check_batches(output, first_stop, last)
    assert all_rows(output) == expected
    held = {int(p.name) for p in (restart / "state" / "0").iterdir() if p.name.isdigit()}
    assert held == set(range(partitions)), held  # Spark ran with the repartitioned count
    # and its state once idle is the uninterrupted run's once idle (the stop's restart may
    # count one batch more: one without data), read offline store by store
    done = open_spark_checkpoint(str(restart))
    original = open_spark_checkpoint(str(uninterrupted.checkpoint))
    stores = sorted({(s.operator, s.name) for s in original.scan().stores})
    assert stores == sorted({(s.operator, s.name) for s in done.scan().stores})
    for operator, store in stores:
        for var in STATE_VARIABLES.get(query, [None]):
            assert _state(done, operator, store, last, var) == _state(
                original, operator, store, uninterrupted.last_batch, var), (operator, var)


def _replays_changelogs(checkpoint: Path, batch: int, tmp: Path) -> bool:
    """Whether any store's version at `batch` is read through changelogs with a record."""
    location = open_spark_checkpoint(str(checkpoint))
    found = location.scan()
    return any(keys for sid in found.stores
               for k in resolved(location, found, sid, batch)[1].files
               if k.endswith(".changelog")
               for keys, _values in file_record_batches(location, k, sid, tmp))


def _state(location: Any, operator: int, store: str, batch: int, var: str | None
           ) -> list[str]:
    """A store's rows at `batch` (transformWithState's: of state variable `var`), whatever
    partition holds them; a join's values without their `index` (which slot a value takes
    depends on the batches' boundaries: Spark fills a removed value's slot with the key's
    last)."""
    rows = (row for b in location.read_state(batch, operator=operator, store=store,
                                             state_var=var)
            for row in b.to_pylist())
    if store.endswith("keyWithIndexToValue"):
        rows = ({k: v for k, v in row.items() if k != "index"} for row in rows)
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in rows)


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
