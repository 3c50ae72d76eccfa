"""The keying stage on the JVM against Python: Spark SQL's ``xxhash64`` and statehold's
key groups of the same keys, and the JVM's key, key group and task columns equal to
`KeyGroupStage`'s row for row, for every key type the JVM keys."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from statehold.backend.keys import key_group_of
from statehold.format.metadata import KeyHash
from statehold.spark.keying import jvm_keyable, keyed, keyed_in_python
from statehold.spark.task import KEY_COL, KG_COL, TASK_COL, StateSpec

pytestmark = pytest.mark.spark

#: Strings that stress the bytes hashed: empty, multi-byte UTF-8, every length around
#: XXH64's 4-, 8- and 32-byte steps, and long ones.
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
