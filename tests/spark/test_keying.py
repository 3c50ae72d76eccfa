"""The keying stage on the JVM against Python: Spark SQL's ``xxhash64`` and statehold's
key groups of the same keys, the JVM's key, key group and task columns equal to
`KeyGroupStage`'s row for row for every key type the JVM keys; and the job's key hash:
recorded by a new job, kept by an old one through a restart, a rescale and a restore."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from statehold.backend.keys import key_group_of
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.format import layout
from statehold.format.metadata import KeyHash
from statehold.spark import StatefulJob
from statehold.spark.keying import jvm_keyable, keyed, keyed_in_python
from statehold.spark.task import KEY_COL, KG_COL, TASK_COL, StateSpec
from statehold.storage import open_storage
from tests.support.keyed_totals import (
    MAXP,
    OUT,
    Reference,
    make_batches,
    outputs,
    stored_state,
    to_df,
    totals,
)

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

#: Strings that stress the bytes hashed: empty, multi-byte UTF-8, a NUL, both sides of
#: XXH64's 32-byte stripe, a long one (the random strings below add lengths up to ~180
#: bytes).
STRINGS = ["", "a", "hot", "ß", "日本語", "🙂", "a\x00b", "x" * 31, "x" * 32, "x" * 33,
           "y" * 1000, *(f"k{i:07d}" for i in range(200))]


def spec(keys: tuple[str, ...], key_hash: KeyHash = KeyHash.XXHASH64) -> StateSpec:
    import pyarrow as pa

    return StateSpec(
        storage_uri="file:///nowhere", storage_options={}, job_id="j", operator="state",
        epoch=1, checkpoint_id=1, max_parallelism=128, parallelism=3, restore_key=None,
        restore_ranges=(), key_columns=keys, order_by=(), output_schema=pa.schema([]),
        input_format="rows", function=lambda k, rows, st: [], vectorized=False,
        key_hash=key_hash,
    )


def test_sparks_xxhash64_is_the_key_hash(spark: SparkSession) -> None:
    rng = random.Random(3)
    strings = STRINGS + ["".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(60)))
                         for _ in range(200)]
    df = spark.createDataFrame([(s,) for s in strings], "s string")
    for parallelism in (1, 7, 128, 1 << 15):
        got = {r["s"]: r["g"] for r in df.select(
            "s", F.expr(f"pmod(xxhash64(s), {parallelism})").alias("g")).collect()}
        assert got == {s: key_group_of(s, parallelism, KeyHash.XXHASH64) for s in strings}


@pytest.mark.parametrize(
    ("ddl", "values"),
    [
        ("k string", STRINGS),
        ("k bigint", [0, 1, -1, 2**63 - 1, -(2**63), *range(-50, 50, 7)]),
        ("k int", [0, -(2**31), 2**31 - 1, 12345]),
        ("k smallint", [0, -32768, 32767]),
        ("k tinyint", [0, -128, 127]),
        ("k boolean", [True, False]),
    ],
)
def test_jvm_keying_equals_the_python_stage(
    spark: SparkSession, ddl: str, values: list[object]
) -> None:
    df = spark.createDataFrame([(v, i) for i, v in enumerate(values)], f"{ddl}, n int")
    on_jvm = spec(("k",))
    assert jvm_keyable(df, on_jvm)
    in_python = replace(on_jvm, key_hash=KeyHash.BLAKE2B)
    assert not jvm_keyable(df, in_python)
    plan = keyed(df, on_jvm)
    assert "MapInArrow" not in plan._jdf.queryExecution().executedPlan().toString()
    python_stage = keyed_in_python(df, on_jvm)
    assert "MapInArrow" in python_stage._jdf.queryExecution().executedPlan().toString()

    def columns(frame: DataFrame) -> dict[int, tuple[object, ...]]:
        return {r["n"]: (r[KEY_COL], r[KG_COL], r[TASK_COL]) for r in frame.collect()}

    assert columns(plan) == columns(python_stage)
    assert len(columns(plan)) == len(values)


def _document(job: Any, checkpoint_id: int) -> dict[str, Any]:
    return json.loads(job.storage.read(layout.checkpoint_metadata_key(checkpoint_id)))


def test_a_new_job_records_xxhash64_and_an_old_job_keeps_blake2b(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job written before the key hash was recorded (BLAKE2b, made here by starting its
    coordinator with it) resumes, rescales and is restored into another job with its
    own key groups: exact totals prove every key found its state. A new job records
    xxhash64 in a format-3 document; the old one's documents stay as an older statehold
    wrote them."""
    ref = Reference()
    batches = list(make_batches(4, seed=11))
    root = str(tmp_path / "ckpt")
    start = CheckpointCoordinator.start.__func__  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:
        patch.setattr(CheckpointCoordinator, "start", classmethod(
            lambda cls, *a, **kw: start(cls, *a, **{**kw, "key_hash": KeyHash.BLAKE2B})))
        old = StatefulJob(spark, root, "old", max_parallelism=MAXP, parallelism=2)
        for rows in batches[:2]:
            assert outputs(old.run_batch(to_df(spark, rows), totals, OUT,
                                         order_by=["seq"])) == ref.apply(rows)
        old.close()
    doc = _document(old, 1)
    assert "key_hash" not in doc and doc["version"] <= 2
    after_two = copy.deepcopy(ref)

    resumed = StatefulJob(spark, root, "old", max_parallelism=MAXP, parallelism=3)
    assert resumed.coordinator.key_hash is KeyHash.BLAKE2B
    rows = batches[2]
    assert outputs(resumed.run_batch(to_df(spark, rows), totals, OUT,
                                     order_by=["seq"])) == ref.apply(rows)
    resumed.close()
    assert "key_hash" not in _document(resumed, 2)

    copied = StatefulJob(spark, root, "copied", max_parallelism=MAXP, parallelism=2,
                         restore_from=f"{root}/old/chk-1")
    rows = batches[3]
    assert outputs(copied.run_batch(to_df(spark, rows), totals, OUT,
                                    order_by=["seq"])) == after_two.apply(rows)
    assert copied.coordinator.key_hash is KeyHash.BLAKE2B
    copied.close()

    new = StatefulJob(spark, root, "new", max_parallelism=MAXP, parallelism=2)
    fresh = Reference()
    assert outputs(new.run_batch(to_df(spark, batches[0]), totals, OUT,
                                 order_by=["seq"])) == fresh.apply(batches[0])
    new.close()
    doc = _document(new, 0)
    assert doc["key_hash"] == "xxhash64" and doc["version"] == 3
    assert stored_state(open_storage(root).child("new")) == fresh.state
