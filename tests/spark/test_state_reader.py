"""The state reader: a checkpoint's keyed state as a DataFrame, in plain Python and through
``statehold state``, equal to a plain-Python reference of the running-totals example, on
local disk and on moto S3."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from statehold.cli import app
from statehold.cli.state import Format, dump_state
from statehold.examples.totals import LAST_N, OUTPUT_SCHEMA, update_totals
from statehold.format import layout
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.spark import StatefulJob
from statehold.spark.reader import StateReadError, iter_state, read_state
from statehold.storage import Storage

pytestmark = pytest.mark.spark
runner = CliRunner()
MAXP = 16

Totals = dict[str, dict[str, Any]]


def reference(batches: list[list[tuple[str, int, int]]]) -> list[Totals]:
    """The running totals after each batch, computed in plain Python."""
    state: Totals = {}
    after: list[Totals] = []
    for rows in batches:
        for key, value, _seq in sorted(rows, key=lambda r: r[2]):
            st = state.setdefault(key, {"count": 0, "sum": 0, "last": []})
            st["count"] += 1
            st["sum"] += value
            st["last"] = (st["last"] + [value])[-LAST_N:]
        after.append(json.loads(json.dumps(state)))
    return after


@dataclass
class Job:
    uri: str  # the job directory
    options: dict[str, Any]
    storage: Storage
    expected: list[Totals]  # after batch 0, 1, 2


@pytest.fixture
def job(
    spark: SparkSession, storage: Storage, tmp_path: Path, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> Job:
    options: dict[str, Any] = {}
    if storage.uri.startswith("s3://"):
        server = request.getfixturevalue("s3_server")
        options = server.options
        for k, v in server.env.items():  # the CLI takes S3 settings from the environment
            monkeypatch.setenv(k, v)
    rng = random.Random(11)
    batches, seq = [], 0
    for _ in range(3):
        rows = []
        for _ in range(80):
            rows.append((f"user-{rng.randrange(30):02d}", rng.randrange(-20, 100), seq))
            seq += 1
        batches.append(rows)
    sj = StatefulJob(
        spark, storage.uri, "rt", max_parallelism=MAXP, parallelism=2, retain=5,
        storage_options=options, local_dir=str(tmp_path / "local"),
    )
    try:
        for i, rows in enumerate(batches):
            df = spark.createDataFrame(rows, "key string, value long, seq long").repartition(3)
            sj.run_batch(df, update_totals, OUTPUT_SCHEMA, batch_id=i, order_by=["seq"])
        sj.coordinator.savepoint("after-2")
    finally:
        sj.close()
    return Job(sj.job_dir, options, sj.storage, reference(batches))


def decoded(rows: list[Any]) -> Totals:
    return {
        r["key"]: {"count": json.loads(r["count"]), "sum": json.loads(r["sum"]),
                   "last": json.loads(r["last"])}
        for r in rows
    }


@pytest.mark.matrix  # mapInArrow, to_arrow_schema and localCheckpoint of each PySpark
def test_read_state_as_dataframe(spark: SparkSession, job: Job) -> None:
    df = read_state(spark, job.uri, **job.options)  # job dir: newest retained = chk-2
    assert df.columns == ["key", "count", "last", "sum"]  # key, then state names sorted
    rows = df.collect()
    assert len(rows) == len({r["key"] for r in rows})  # one row per key
    assert decoded(rows) == job.expected[2]
    # An older checkpoint, typed by a schema (key column added first).
    typed = read_state(
        spark, f"{job.uri}/chk-0", schema="count long, sum long, last array<long>",
        **job.options,
    )
    assert typed.columns == ["key", "count", "sum", "last"]
    got = {r["key"]: {"count": r["count"], "sum": r["sum"], "last": list(r["last"])}
           for r in typed.collect()}
    assert got == job.expected[0] != job.expected[2]


def test_iter_state_and_savepoint(job: Job) -> None:
    assert dict(iter_state(job.uri, **job.options)) == job.expected[2]
    assert dict(iter_state(f"{job.uri}/chk-1", "state", **job.options)) == job.expected[1]
    assert dict(iter_state(f"{job.uri}/savepoints/after-2", **job.options)) == job.expected[2]
    with pytest.raises(StateReadError, match="no operator 'nope'"):
        list(iter_state(job.uri, "nope", **job.options))


class Recorder:
    """A `tools.Progress` that remembers its phases and counts."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None]] = []
        self.done = 0

    def start(self, description: str, total: int | None, unit: str = "bytes") -> None:
        self.phases.append((unit, total))

    def advance(self, amount: int) -> None:
        self.done += amount


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_cli_state(job: Job, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"out-{fmt}"
    res = runner.invoke(app, ["state", f"{job.uri}/chk-1", "--out", str(out),
                              "--format", fmt, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["columns"] == ["key", "count", "last", "sum"]
    assert doc["rows"] == len(job.expected[1])
    got: Totals = {}
    for name in doc["files"]:
        if fmt == "jsonl":
            lines = (out / name).read_text().splitlines()
            rows = [json.loads(line) for line in lines]
            got.update({r.pop("key"): r for r in rows})
        else:
            got.update(decoded(pq.read_table(out / name).to_pylist()))
    assert got == job.expected[1]
    # The progress the CLI draws on a terminal counts every key written.
    seen = Recorder()
    dump_state(f"{job.uri}/chk-1", tmp_path / "again", Format(fmt), progress=seen)
    assert seen.phases == [("keys", None)] and seen.done == doc["rows"]
    # The output directory must be empty: a second run refuses.
    again = runner.invoke(app, ["state", job.uri, "--out", str(out), "--format", fmt])
    assert again.exit_code == 1
    assert "not an empty directory" in again.stderr


def test_cli_state_bad_input(job: Job, tmp_path: Path) -> None:
    def state(target: str, out: str) -> Any:
        return runner.invoke(app, ["state", target, "--out", str(tmp_path / out)])

    empty = tmp_path / "empty"
    empty.mkdir()
    res = state(str(empty), "o1")
    assert res.exit_code == 1 and "not a statehold job directory" in res.stderr
    res = state(f"{job.uri}/chk-99", "o2")
    assert res.exit_code == 1 and "no such checkpoint" in res.stderr

    # A missing state file: a clear one-line error naming it, exit 1.
    key = layout.checkpoint_metadata_key(1)
    shared = [k for k, f in referenced_keys(read_metadata(job.storage, key), key).items()
              if k.startswith("shared/") and k.endswith(".sst")]
    assert shared
    job.storage.delete_many(shared)
    res = state(f"{job.uri}/chk-1", "o3")
    assert res.exit_code == 1 and "statehold: error:" in res.stderr
    assert any(k.rsplit("/", 1)[-1] in res.stderr for k in shared) or "not found" in (
        res.stderr.lower()
    )

    # Corrupt metadata: refused by its checksum.
    job.storage.write(layout.checkpoint_metadata_key(2), b'{"format": "x"}')
    res = state(f"{job.uri}/chk-2", "o4")
    assert res.exit_code == 1 and "statehold: error:" in res.stderr
    with pytest.raises(Exception, match="chk-2"):
        list(iter_state(f"{job.uri}/chk-2", **job.options))
