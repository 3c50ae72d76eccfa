"""``spark.read.format("statehold")`` (PySpark 4's Python data sources) on real Spark: a
processor's job directory read in its three layouts (rows per variable as JSON, one
variable typed by the recorded schema, a user's schema), by checkpoint and savepoint, one
partition per key-group range; the history view; a Spark checkpoint location written by
a real query read through its views; and bad options refused with one line."""

from __future__ import annotations

import datetime
import decimal
import json
import random
from pathlib import Path
from typing import Any

import pytest

from statehold.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from statehold.spark import StatefulJob, register_data_source
from statehold.spark.data_source import DataSourceUnavailableError, data_sources_supported
from statehold.spark.reader import iter_state, locate_state
from statehold.spark_checkpoints import open_spark_checkpoint
from tests.support.keyed_totals import MAXP, OUT, make_batches, totals

pytestmark = [pytest.mark.spark, pytest.mark.matrix]
#: Python data sources came with PySpark 4.0 (on 3.5 only the refusal is tested)
needs_4 = pytest.mark.skipif(not data_sources_supported(), reason="PySpark 4 data sources")

WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9)
PROFILE = "seen TIMESTAMP, spent DECIMAL(10,2), tag BINARY"


class Visits(StatefulProcessor):
    """Typed value, list and map state per user, and one untyped value."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.profile = handle.get_value_state("profile", PROFILE)
        self.pages = handle.get_list_state("pages", "page STRING")
        self.hits = handle.get_map_state("hits", "page STRING", "n BIGINT")
        self.count = handle.get_value_state("count")

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        user = key[0] if isinstance(key, tuple) else key
        n = sum(1 for _ in rows)
        total = (self.count.get() or 0) + n
        self.count.update(total)
        self.profile.update((WHEN, decimal.Decimal("12.50"), b"\x00\xff"))
        self.pages.append_value(("home",))
        self.hits.update_value(("home",), (total,))
        return [(str(user),)]


@pytest.fixture(scope="module")
def job_dir(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A processor's job directory: checkpoint 0 (ann, bob), 1 (ann again, cy), savepoint
    "first" of checkpoint 0. The job registers the data source when its attempt starts."""
    root = tmp_path_factory.mktemp("ds")
    job = StatefulJob(spark, str(root), "visits", max_parallelism=8, parallelism=2,
                      local_dir=str(root / "local"))
    users = ["ann", "bob", "bob"]
    job.transform_with_state(spark.createDataFrame([(u,) for u in users], "user string"),
                             Visits(), "user string", key="user")
    job.savepoint("first")
    job.transform_with_state(spark.createDataFrame([("ann",), ("cy",)], "user string"),
                             Visits(), "user string", key="user")
    job.close()
    return str(root / "visits")


def _read(spark: Any, path: str, **options: str) -> Any:
    reader = spark.read.format("statehold")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(path)


@needs_4
def test_rows_per_state_variable_match_iter_state(spark: Any, job_dir: str) -> None:
    frame = _read(spark, job_dir)
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("key", "string"), ("state", "string"), ("value", "string"),
    ]
    got = {(r["key"], r["state"]): json.loads(r["value"]) for r in frame.collect()}
    expected = {
        (str(k), name): value for k, states in iter_state(job_dir) for name, value in states.items()
    }
    assert got == expected
    assert got[("ann", "count")] == 2 and got[("bob", "count")] == 2 and got[("cy", "count")] == 1
    assert got[("ann", "pages")] == [{"page": "home"}, {"page": "home"}]
    # one partition per key-group range: each task restores its range itself
    assert frame.rdd.getNumPartitions() == len(locate_state(job_dir).ranges) == 2


@needs_4
def test_a_state_variable_is_typed_by_its_recorded_schema(
    spark: Any, job_dir: str
) -> None:
    profile = _read(spark, job_dir, stateVar="profile")
    assert profile.schema["value"].dataType.simpleString() == (
        "struct<seen:timestamp,spent:decimal(10,2),tag:binary>"
    )
    rows = {r["key"]: r["value"] for r in profile.collect()}
    assert set(rows) == {"ann", "bob", "cy"}
    assert rows["ann"]["seen"] == WHEN
    assert rows["ann"]["spent"] == decimal.Decimal("12.50")
    assert bytes(rows["ann"]["tag"]) == b"\x00\xff"

    pages = _read(spark, job_dir, stateVar="pages")
    assert pages.schema["value"].dataType.simpleString() == "array<struct<page:string>>"
    assert [p["page"] for p in pages.where("key = 'ann'").first()["value"]] == ["home", "home"]

    hits = _read(spark, job_dir, STATEVAR="hits")  # options are case-insensitive
    assert hits.schema["value"].dataType.simpleString() == (
        "map<struct<page:string>,struct<n:bigint>>"
    )
    ann = hits.where("key = 'ann'").first()["value"]
    assert [(k["page"], v["n"]) for k, v in ann.items()] == [("home", 2)]

    untyped = _read(spark, job_dir, stateVar="count")  # no recorded type: JSON text
    assert untyped.schema["value"].dataType.simpleString() == "string"
    assert {r["key"]: json.loads(r["value"]) for r in untyped.collect()} == {
        "ann": 2, "bob": 2, "cy": 1,
    }


@needs_4
def test_checkpoint_savepoint_and_a_users_schema(spark: Any, job_dir: str) -> None:
    def counts(**options: str) -> dict[str, int]:
        rows = _read(spark, job_dir, stateVar="count", **options).collect()
        return {r["key"]: json.loads(r["value"]) for r in rows}

    assert counts(checkpointId="0") == {"ann": 1, "bob": 2}
    assert counts(savepoint="first") == {"ann": 1, "bob": 2}
    assert counts(checkpointId="1") == {"ann": 2, "bob": 2, "cy": 1}
    assert {r["key"]: json.loads(r["value"]) for r in _read(
        spark, f"{job_dir}/savepoints/first", stateVar="count").collect()} == {"ann": 1, "bob": 2}

    wide = spark.read.format("statehold").schema(
        "key string, count long, pages array<struct<page: string>>"
    )
    rows = {r["key"]: r for r in wide.load(job_dir).collect()}
    assert wide.load(job_dir).columns == ["key", "count", "pages"]
    assert rows["ann"]["count"] == 2 and [p["page"] for p in rows["cy"]["pages"]] == ["home"]


@needs_4
def test_history_view_has_one_row_per_checkpoint(spark: Any, job_dir: str) -> None:
    rows = _read(spark, job_dir, view="history").orderBy("checkpoint_id").collect()
    assert [(r["checkpoint_id"], r["outcome"]) for r in rows] == [(0, "completed"),
                                                                  (1, "completed")]
    assert rows[0]["keys"] == 2 and rows[1]["keys"] == 2 and rows[1]["state_size"] > 0


@needs_4
@pytest.mark.parametrize(
    ("options", "line"),
    [
        ({"checkpoint": "1"}, "unknown option 'checkpoint'; the options are view, checkpointId"),
        ({"checkpointId": "x"}, "checkpointId must be a checkpoint number (0, 1, ...), not 'x'"),
        ({"checkpointId": "0", "savepoint": "first"}, "give checkpointId or savepoint, not both"),
        ({"checkpointId": "9"}, "chk-9"),
        ({"savepoint": "nope"}, "savepoints/nope"),
        ({"operator": "other"}, "no operator 'other'"),
        ({"view": "batches"}, "view='batches': a statehold job directory has the views"),
        ({"view": "history", "stateVar": "count"}, "option stateVar is for view=state"),
    ],
)
def test_bad_options_say_why_in_one_line(
    spark: Any, job_dir: str, options: dict[str, str], line: str
) -> None:
    with pytest.raises(Exception) as failed:  # Spark's AnalysisException around ours
        _read(spark, job_dir, **options).collect()
    text = str(failed.value)
    assert line in text
    # the error's own line (the traceback above it may quote the raise)
    assert any(
        x.strip().startswith("statehold.spark.data_source.DataSourceError: ") and line in x
        for x in text.splitlines()
    ), text


@needs_4
def test_a_plain_job_on_s3_read_by_the_tasks(spark: Any, s3_server: Any) -> None:
    """A `run_batch` job (state names recorded nowhere: values as JSON) on S3 (moto): the
    storage options go as storage.*, and each task opens the bucket itself."""
    uri = f"s3://{s3_server.bucket}/ds-{random.getrandbits(32)}"
    job = StatefulJob(spark, uri, "totals", max_parallelism=MAXP, parallelism=2,
                      storage_options=s3_server.options)
    rows = [(k, v, s) for k, v, s in next(make_batches(1, seed=3))]
    job.run_batch(spark.createDataFrame(rows, "key string, value long, seq long"), totals, OUT,
                  order_by=["seq"])
    job.close()
    reader = spark.read.format("statehold")
    for name, value in s3_server.options.items():
        reader = reader.option(f"storage.{name}", str(value))
    frame = reader.load(f"{uri}/totals")
    got = {(r["key"], r["state"]): json.loads(r["value"]) for r in frame.collect()}
    expected = {
        (str(k), name): value
        for k, states in iter_state(f"{uri}/totals", **s3_server.options)
        for name, value in states.items()
    }
    assert got == expected and len({k for k, _ in got}) == len({r[0] for r in rows})
    assert {n for _, n in got} == {"count", "sum", "last"}
    assert frame.rdd.getNumPartitions() == 2


@needs_4
def test_not_a_job_directory(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception) as failed:
        _read(spark, str(tmp_path / "empty")).collect()
    assert "empty: not a statehold job directory" in str(failed.value)


def test_register_data_source_and_pyspark_without_data_sources(spark: Any) -> None:
    """On PySpark 4 registering again is harmless; on 3.5 it refuses at once, one line."""
    if data_sources_supported():
        register_data_source(spark)
        assert spark.read.format("statehold") is not None
        return
    with pytest.raises(DataSourceUnavailableError) as failed:
        register_data_source(spark)
    assert "needs PySpark 4.0 or newer" in str(failed.value)
    assert "\n" not in str(failed.value)


# -- a Spark checkpoint location ---------------------------------------------------------------
@pytest.fixture(scope="module")
def spark_location(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.support.spark_locations.queries import run_query, write_inputs

    root = tmp_path_factory.mktemp("spark-ckpt")
    write_inputs(root / "input", 0, 3)
    checkpoint = str(root / "checkpoint")
    run_query(spark, "window", "rocksdb", checkpoint, root / "input", root / "output", 2)
    return checkpoint


@needs_4
def test_spark_checkpoint_location_views(spark: Any, spark_location: str) -> None:
    register_data_source(spark)
    location = open_spark_checkpoint(spark_location)
    listed = location.listing()

    batches = _read(spark, spark_location, view="batches").orderBy("batch").collect()
    assert [(b["batch"], b["committed"], b["restartable"]) for b in batches] == sorted(
        (b.batch, b.committed, b.restartable) for b in listed.batches
    )
    stores = _read(spark, spark_location, view="stores").collect()
    assert sorted((s["operator"], s["partition"], s["store"], list(s["versions"]))
                  for s in stores) == sorted(
        (s.operator, s.partition, s.store, s.versions) for s in listed.stores
    )
    found = location.scan()
    needed = set(location.restart_needs(found, listed.restart_batch).files)  # type: ignore[arg-type]
    files = _read(spark, spark_location, view="files").collect()
    assert {f["path"] for f in files} == set(found.files)
    assert {f["path"] for f in files if f["needed"]} == needed
    assert any(f["kind"] == "snapshot-zip" and f["needed"] for f in files)
    assert any(f["kind"] == "sst" and f["needed"] for f in files)

    needs = _read(spark, spark_location, view="needs")
    newest = needs.where(f"batch = {listed.restart_batch}").collect()
    assert {r["path"] for r in newest} == needed
    history = _read(spark, spark_location, view="history").orderBy("batch").collect()
    assert [h["batch"] for h in history] == [r.batch for r in location.history().records]
    assert history[-1]["operators"][0]["bytes"] > 0


@needs_4
def test_spark_checkpoint_location_without_a_view(
    spark: Any, spark_location: str
) -> None:
    with pytest.raises(Exception) as failed:
        _read(spark, spark_location).collect()
    assert 'its state rows are Spark\'s own (read them with format("statestore"))' in str(
        failed.value
    )
    with pytest.raises(Exception) as failed:
        _read(spark, spark_location, view="files", operator="0").collect()
    assert "option operator is for view=state" in str(failed.value)
