"""Parity with Spark's own state reader: for every location of the running PySpark's
committed fixture (every query × state store layout) and every operator and store name
in it, the rows `read_state` gives offline equal the rows of Spark's
``spark.read.format("statestore")`` at the location's newest committed batch, compared
as multisets of (partition, key columns..., value columns...) with Spark's ``key`` and
``value`` structs flattened. One Spark run for the whole module (each read costs Spark a
job: only the newest batch, which every layout holds through snapshots and steps;
tests/spark_checkpoints/test_spark_state_read.py checks every batch against the input
without Spark).

What Spark's reader needs, and what is not compared:

- format v2 (``rocksdb_v2``): the offset log does not record
  ``spark.sql.streaming.stateStore.checkpointFormatVersion``, and Spark's reader loads the
  store without the commit's unique ids (and fails on the files they name) unless the
  reading session sets it to 2; HDFS-backed stores refuse that setting, so it is set on
  a session of its own (`newSession`) for those locations only.
- a stream-stream join's four stores are read by ``storeName`` (Spark reads one store so);
  ``joinSide`` reads a side's two stores combined (key, then the row kept), which is
  checked against the offline rows of keyWithIndexToValue without its index and
  ``matched`` flag.
- transformWithState (``transform``): Spark reads it by ``stateVarName`` (a column family)
  and its registered timers with ``readRegisteredTimers``; the offline reader by
  ``state_var`` (the timers: ``$eventTimers_keyToTimestamp``), on a copy relocated to
  where it is (Spark opens its state schema files by the absolute paths its operator
  metadata records). Spark's timers have the grouping key's columns where the offline
  rows have the family's ``key`` struct of them. Spark's ``key`` and ``value`` structs
  are flattened one level, as the offline reader's columns are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.spark_locations.committed_fixtures import Fixture, fixture, manifests, running

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

FORMAT_VERSION = "spark.sql.streaming.stateStore.checkpointFormatVersion"
#: transformWithState's query: read by state variable.
TWS = "transform"
#: Its state variables as the offline reader names them, and Spark's reader options.
TWS_VARIABLES = {"count": {"stateVarName": "count"},
                 "$eventTimers_keyToTimestamp": {"readRegisteredTimers": "true"}}

Rows = Counter[tuple[Any, ...]]


def frozen(value: Any) -> Any:
    """A value as a hashable one: structs as (name, value) pairs, arrays as tuples."""
    if isinstance(value, dict):
        return tuple((k, frozen(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


def offline(fx: Fixture, operator: int, store: str, state_var: str | None = None) -> Rows:
    location = open_spark_checkpoint(str(fx.checkpoint))
    partitions = sorted(s.partition for s in location.scan().stores
                        if (s.operator, s.name) == (operator, store))
    out: Rows = Counter()
    for partition in partitions:
        for batch in location.read_state(fx.last_batch, operator=operator, store=store,
                                         partition=partition, state_var=state_var):
            for row in batch.to_pylist():
                out[(partition, *map(frozen, row.values()))] += 1
    return out


def spark_rows(session: SparkSession, fx: Fixture, **options: Any) -> Rows:
    reader = session.read.format("statestore").option("batchId", fx.last_batch)
    for name, value in options.items():
        reader = reader.option(name, value)
    table = reader.load(str(fx.checkpoint)).toArrow()
    return Counter((r["partition_id"], *map(frozen, r["key"].values()),
                    *map(frozen, r["value"].values())) for r in table.to_pylist())


def spark_tws_rows(session: SparkSession, checkpoint: Path, batch: int, **options: Any
                   ) -> Rows:
    """Spark's rows of a state variable: (partition, each column's fields...), a struct
    column flattened one level, a column Spark fills with null only (no value) left out."""
    reader = session.read.format("statestore").option("batchId", batch)
    for name, value in options.items():
        reader = reader.option(name, value)
    rows = reader.load(str(checkpoint)).toArrow().to_pylist()
    columns = [c for c in (rows[0] if rows else {}) if c != "partition_id"
               and any(r[c] is not None for r in rows)]
    out: Rows = Counter()
    for r in rows:
        flat: list[Any] = [r["partition_id"]]
        for c in columns:
            flat += (map(frozen, r[c].values()) if isinstance(r[c], dict) else [frozen(r[c])])
        out[tuple(flat)] += 1
    return out


def join_side(rows: Rows) -> Rows:
    """keyWithIndexToValue's rows as ``joinSide`` gives them: (partition, key, the row
    kept), without the index and the ``matched`` flag."""
    out: Rows = Counter()
    for (partition, key, _index, *value), n in rows.items():
        out[(partition, key, *value[:-1])] += n
    return out


def test_offline_rows_equal_sparks_state_reader(
    spark: SparkSession, extracted: Callable[[str], Path], tmp_path: Path
) -> None:
    import pyspark

    version = pyspark.__version__
    if int(version.split(".")[0]) < 4:
        pytest.skip(f"PySpark {version} has no state data source")
    assert version in manifests(), f"no committed fixture of PySpark {version}"
    root = extracted(version)
    v2 = spark.newSession()
    v2.conf.set(FORMAT_VERSION, "2")
    compared: list[str] = []
    differ: list[str] = []
    for loc in manifests()[version]["locations"]:
        fx = fixture(root, version, loc["query"], loc["provider"])
        session = v2 if fx.provider == "rocksdb_v2" else spark
        if fx.query == TWS:
            # Spark's reader opens the state schema files by the absolute paths the
            # operator metadata records: a copy relocated to where it is
            fx = running(extracted, TWS, fx.provider, tmp_path / fx.provider)[0]
            for state_var, options in TWS_VARIABLES.items():
                ours = offline(fx, 0, "default", state_var)
                if "readRegisteredTimers" in options:  # Spark's: the grouping key's columns
                    ours = Counter({(p, *(v for _n, v in key), *rest): n
                                    for (p, key, *rest), n in ours.items()})
                theirs = spark_tws_rows(session, fx.checkpoint, fx.last_batch, **options)
                where = f"{fx.id} {state_var} batch {fx.last_batch}"
                assert theirs, f"{where}: Spark reads no rows; the comparison tests nothing"
                compared.append(where)
                if ours != theirs:
                    differ.append(f"{where}: only offline {list((ours - theirs).items())[:3]}, "
                                  f"only Spark {list((theirs - ours).items())[:3]}")
            continue
        stores = sorted({(s.operator, s.name)
                         for s in open_spark_checkpoint(str(fx.checkpoint)).scan().stores})
        for operator, name in stores:
            ours = offline(fx, operator, name)
            theirs = spark_rows(session, fx, operatorId=operator, storeName=name)
            where = f"{fx.id} operator {operator} {name} batch {fx.last_batch}"
            assert theirs, f"{where}: Spark reads no rows; the comparison tests nothing"
            compared.append(where)
            if ours != theirs:
                differ.append(f"{where}: only offline {list((ours - theirs).items())[:3]}, "
                              f"only Spark {list((theirs - ours).items())[:3]}")
        if fx.query == "join" and fx.provider == "hdfs":
            for side in ("left", "right"):
                ours = join_side(offline(fx, 0, f"{side}-keyWithIndexToValue"))
                if ours != spark_rows(spark, fx, joinSide=side):
                    differ.append(f"{fx.id} joinSide {side} differs")
                compared.append(f"{fx.id} joinSide {side}")
    assert not differ, "\n".join(differ)
    # every location, each of its stores (the join's four), transformWithState's by variable
    locations = manifests()[version]["locations"]
    stores_per_query = {"join": 4, "multi": 2, TWS: len(TWS_VARIABLES)}
    assert len(compared) == 2 + sum(stores_per_query.get(q["query"], 1) for q in locations)
