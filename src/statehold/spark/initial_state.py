"""A processor's initial state (Spark's ``transformWithStateInPandas(...,
initialState=...)``): a DataFrame whose rows are handed, per key, to the processor's
``handle_initial_state`` in the first batch of a job that has no checkpoint yet.

The rows travel with the batch's input, so they are keyed and routed to the task owning
their key group like any row: the batch becomes the input (with a null `INIT_COL`) unioned
with one row per initial-state row (its key in the input's key columns, cast to their
types, and the whole initial-state row as the struct `INIT_COL`). The task separates them
again (`statehold.spark.task`). Once the job has a checkpoint the initial state is never
read again, so a restart does not apply it twice; a first batch that fails before its
checkpoint completes applies it again when it is retried, as nothing of it was kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from statehold.errors import InvalidArgumentError
from statehold.spark.task import INIT_COL

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def initial_keys(
    keys: tuple[str, ...], initial_state_key: str | Sequence[str] | None
) -> tuple[str, ...]:
    """The initial state's key columns (default: the input's), one per input key column."""
    if initial_state_key is None:
        return keys
    names = (initial_state_key,) if isinstance(initial_state_key, str) else tuple(
        initial_state_key
    )
    if len(names) != len(keys):
        raise InvalidArgumentError(
            f"initial_state_key {list(names)} must name one column per key column {list(keys)}"
        )
    return names


def with_initial_state(
    df: DataFrame, initial: DataFrame, keys: tuple[str, ...], state_keys: tuple[str, ...]
) -> DataFrame:
    """The batch's input and the initial state's rows in one DataFrame (see above)."""
    from pyspark.sql import functions as F

    missing = [c for c in state_keys if c not in initial.columns]
    if missing:
        raise InvalidArgumentError(
            f"initial state key columns {missing} not in the initial state ({initial.columns})"
        )
    if INIT_COL in df.columns or INIT_COL in initial.columns:
        raise InvalidArgumentError(f"column {INIT_COL!r} is reserved by statehold")
    struct = initial.schema
    inputs = df.withColumn(INIT_COL, F.lit(None).cast(struct))
    states = initial.select(
        *[F.col(s).cast(df.schema[k].dataType).alias(k) for k, s in zip(keys, state_keys,
                                                                          strict=True)],
        F.struct(*[F.col(c) for c in initial.columns]).alias(INIT_COL),
    )
    return inputs.unionByName(states, allowMissingColumns=True)
