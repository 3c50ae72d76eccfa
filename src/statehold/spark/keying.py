"""The keying stage: each row's state key, key group and task, before the shuffle.

On the JVM when it can: a job whose key hash is Spark's ``xxhash64`` (every new job, see
`statehold.backend.keys`) and whose key is one string, integer or boolean column has its
rows keyed by SQL expressions, so they cross into Python once, in the stateful stage, not
twice. The state key is then the column's value as a string, exactly what `state_key`
makes of it in Python (a string as itself; an integer or boolean as its JSON, which is
Spark's cast to string), and the task checks every key's group against its own hash
(`statehold.spark.task`). Other keys (several columns, floats, dates, structs) and jobs
keyed by BLAKE2b, which Spark does not have, go through `KeyGroupStage`, a
``mapInArrow`` in Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from statehold.backend.keys import key_group_of, task_of
from statehold.format.metadata import KeyHash
from statehold.spark.task import (
    KEY_COL,
    KG_COL,
    TASK_COL,
    StateSpec,
    null_key_error,
    state_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Spark SQL types whose cast to string is the `state_key` of a one-column key.
_JVM_KEY_TYPES = ("string", "tinyint", "smallint", "int", "bigint", "boolean")


def keyed(df: DataFrame, spec: StateSpec) -> DataFrame:
    """`df` with the key, key group and task columns (module docstring)."""
    return keyed_on_jvm(df, spec) if jvm_keyable(df, spec) else keyed_in_python(df, spec)


def keyed_in_python(df: DataFrame, spec: StateSpec) -> DataFrame:
    """The three columns from `KeyGroupStage`, a ``mapInArrow``."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    schema = StructType([
        *df.schema.fields,
        StructField(KEY_COL, StringType(), False),
        StructField(KG_COL, IntegerType(), False),
        StructField(TASK_COL, IntegerType(), False),
    ])
    stage = KeyGroupStage(spec.key_columns, spec.parallelism, spec.max_parallelism,
                          spec.key_hash)
    return df.mapInArrow(stage, schema)


def jvm_keyable(df: DataFrame, spec: StateSpec) -> bool:
    """Whether Spark SQL computes exactly the key and key group Python would."""
    if spec.key_hash != KeyHash.XXHASH64 or len(spec.key_columns) != 1:
        return False
    return dict(df.dtypes).get(spec.key_columns[0]) in _JVM_KEY_TYPES


def keyed_on_jvm(df: DataFrame, spec: StateSpec) -> DataFrame:
    """The three columns as SQL expressions: ``pmod(xxhash64(key), max parallelism)`` and
    `task_of`'s integer division. A null key stays null here; the task refuses it, with
    its row (`MalformedInputError`)."""
    column = "`" + spec.key_columns[0].replace("`", "``") + "`"
    key = f"CAST({column} AS STRING)"
    group = f"CAST(pmod(xxhash64({key}), {spec.max_parallelism}) AS INT)"
    return df.selectExpr(
        "*", f"{key} AS {KEY_COL}", f"{group} AS {KG_COL}",
        f"CAST(({group} * {spec.parallelism}) DIV {spec.max_parallelism} AS INT) AS {TASK_COL}",
    )


@dataclass(frozen=True)
class KeyGroupStage:
    """The keying stage in Python: add key, key group and task index columns, refusing
    null keys."""

    key_columns: tuple[str, ...]
    parallelism: int
    max_parallelism: int
    key_hash: KeyHash

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = [batch.column(c) for c in self.key_columns]
            for name, col in zip(self.key_columns, columns, strict=True):
                if col.null_count:
                    raise null_key_error(name, batch, pc.index(pc.is_null(col), True).as_py())
            keys, groups, tasks = self._route(columns)
            yield (
                batch.append_column(KEY_COL, keys)
                .append_column(KG_COL, groups)
                .append_column(TASK_COL, tasks)
            )

    def _route(self, columns: list[pa.Array]) -> tuple[pa.Array, pa.Array, pa.Array]:
        """The key, key group and task columns. A single key column is hashed once per
        distinct value of the batch (dictionary-encoded by Arrow), not once per row: a hot
        key's millions of rows cost one hash per Arrow batch."""
        if len(columns) == 1:
            # a string key is its own state key (`state_key`): the column is kept as it is
            is_text = columns[0].type == pa.string()
            try:
                encoded = pc.dictionary_encode(columns[0])
            except pa.ArrowNotImplementedError:  # a nested type: hashed row by row below
                encoded = None
            if encoded is not None:
                uniques = [(v,) for v in encoded.dictionary.to_pylist()]
                unique_keys, unique_groups, unique_tasks = self._route_rows(uniques)
                keys = columns[0] if is_text else unique_keys.take(encoded.indices)
                return (keys, unique_groups.take(encoded.indices),
                        unique_tasks.take(encoded.indices))
        values = [c.to_pylist() for c in columns]
        return self._route_rows(list(zip(*values, strict=True)))

    def _route_rows(self, rows: list[tuple[Any, ...]]) -> tuple[pa.Array, pa.Array, pa.Array]:
        keys = [state_key(vs) for vs in rows]
        groups = [key_group_of(k, self.max_parallelism, self.key_hash) for k in keys]
        tasks = [task_of(g, self.parallelism, self.max_parallelism) for g in groups]
        return (pa.array(keys, pa.string()), pa.array(groups, pa.int32()),
                pa.array(tasks, pa.int32()))

