"""Schema evolution through a real restore, on local disk and on S3 (moto): a processor's
typed state written by one job is restored (no-claim) into new jobs whose processor
appends a nullable field (accepted: old values read with it None, the new schema is
recorded), changes a field's type (refused before any task runs, naming the variable and
both types), or whose key column changes type (refused the same way)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from statehold.format import layout
from statehold.format.metadata import read_metadata
from statehold.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from statehold.spark import StatefulJob
from statehold.state.schema import SchemaEvolutionError, codec_for
from statehold.storage import open_storage

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

OUT = "user string, visits long, before string"


class Visits(StatefulProcessor):
    """Counts a user's rows in a typed value state declared with `schema`."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.width = schema.count(",") + 1  # fields; the ones after the count say "seen"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.visits = handle.get_value_state("visits", self.schema)

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        old = self.visits.get()
        count = (old[0] if old else 0) + len(rows)
        self.visits.update((count, *(["seen"] * (self.width - 1))))
        return [(str(key), count, repr(old))]


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    if request.param == "local":
        return str(tmp_path / "jobs"), {}
    server = request.getfixturevalue("s3_server")
    return f"s3://{server.bucket}/evolve-{random.getrandbits(32)}", dict(server.options)


Root = tuple[str, dict[str, Any]]


def _job(session: Any, root: Root, job_id: str, tmp_path: Path, **kw: Any) -> StatefulJob:
    return StatefulJob(session, root[0], job_id, max_parallelism=8, parallelism=2,
                       storage_options=root[1], local_dir=str(tmp_path / f"local-{job_id}"),
                       **kw)


def _batch(job: StatefulJob, schema: str, users: list[Any], key_type: str = "string") -> Any:
    df = job.spark.createDataFrame([(u, 1) for u in users], f"user {key_type}, n int")
    return job.transform_with_state(df, Visits(schema), OUT, key="user")


def test_schema_evolution_through_restore(
    spark: Any, root: Root, tmp_path: Path
) -> None:
    source = _job(spark, root, "v1", tmp_path)
    _batch(source, "visits BIGINT", ["ann", "bob"])
    source.close()
    source_uri = f"{root[0]}/v1"

    # appending a nullable field: accepted, old values read with it None, new one recorded
    grown = _job(spark, root, "v2", tmp_path, restore_from=source_uri)
    out = _batch(grown, "visits BIGINT, note STRING", ["ann", "ann"])
    assert sorted(tuple(r) for r in out.output.collect()) == [("ann", 3, "(1, None)")]
    again = _batch(grown, "visits BIGINT, note STRING", ["ann"])
    assert [tuple(r) for r in again.output.collect()] == [("ann", 4, "(3, 'seen')")]
    grown.close()
    storage = open_storage(root[0], **root[1]).child("v2")
    latest = read_metadata(storage, layout.checkpoint_metadata_key(again.checkpoint_id))
    assert latest.state_schemas is not None
    record = latest.state_schemas["state"]
    grown_json = codec_for("visits BIGINT, note STRING").schema_json()
    assert record.variables["visits"].value == grown_json
    assert record.key == codec_for("user STRING").schema_json()

    # a changed field type: refused before any task runs, nothing new is checkpointed
    changed = _job(spark, root, "v3", tmp_path, restore_from=source_uri)
    before = changed.latest_checkpoint_id()
    with pytest.raises(SchemaEvolutionError) as e:
        _batch(changed, "visits STRING", ["ann"])
    message = str(e.value)
    assert "'visits'" in message and "struct<visits:bigint>" in message
    assert "struct<visits:string>" in message
    assert changed.latest_checkpoint_id() == before
    changed.close()

    # the key column's type changed: keys would no longer match, refused the same way
    rekeyed = _job(spark, root, "v4", tmp_path, restore_from=source_uri)
    with pytest.raises(SchemaEvolutionError, match="key columns.*user:string.*user:bigint"):
        _batch(rekeyed, "visits BIGINT", [1, 2], key_type="bigint")
    rekeyed.close()
