"""The running totals themselves, whatever the input: one input line parsed into a row,
the stateful step per key, and one batch checkpointed. The file input
(`statehold.examples.running_totals`) and the Kafka input
(`statehold.examples.kafka_input`) both run them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from statehold.spark import BatchResult, KeyedState, PhaseHook, StatefulJob
    from statehold.spark.api import Sink

LAST_N = 8
OUTPUT_SCHEMA = "key string, count long, sum long"
INT64 = (-(2**63), 2**63 - 1)


class MalformedRowError(InvalidArgumentError):
    """An input row the running totals cannot use."""


def update_totals(
    key: str,
    rows: list[dict[str, Any]],
    state: KeyedState,
    batch_id: int = -1,
    on_phase: PhaseHook | None = None,
) -> list[tuple[Any, ...]]:
    """The stateful step for one key: rows of this batch in input order (file, line)."""
    if on_phase is not None:
        on_phase("in-task", batch_id)
    count, total, last = state.value("count"), state.value("sum"), state.list("last")
    values = [int(r["value"]) for r in rows]
    n = (count.get() or 0) + len(values)
    s = (total.get() or 0) + sum(values)
    count.update(n)
    total.update(s)
    last.update((last.get() + values)[-LAST_N:])
    return [(key, n, s)]


def parse_line(line: str) -> tuple[str, int]:
    """One input line as (key, value), or `MalformedRowError` saying what is wrong with it."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise MalformedRowError(f"not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise MalformedRowError("not a JSON object")
    key, value = row.get("key"), row.get("value")
    if not isinstance(key, str):
        raise MalformedRowError("'key' must be a non-null string")
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedRowError("'value' must be an integer")
    if not INT64[0] <= value <= INT64[1]:
        raise MalformedRowError("'value' does not fit in 64 bits")
    return key, value


def totals_batch(
    job: StatefulJob,
    rows: DataFrame,
    check: Callable[[DataFrame], None],
    sink: Sink,
    batch_id: int,
    order_by: Sequence[str],
    source_position: Mapping[str, Any],
    on_phase: PhaseHook | None,
) -> BatchResult:
    """Batch `batch_id` of the running totals over `rows` (cached meanwhile), after
    ``check(rows)``: a `MalformedRowError` leaves state and checkpoints untouched."""
    rows = rows.persist()
    try:
        check(rows)
        return job.run_batch(
            rows.drop("_error"),
            functools.partial(update_totals, batch_id=batch_id, on_phase=on_phase),
            OUTPUT_SCHEMA,
            key="key",
            batch_id=batch_id,
            order_by=order_by,
            sink=sink,
            source_position=source_position,
        )
    finally:
        rows.unpersist()
