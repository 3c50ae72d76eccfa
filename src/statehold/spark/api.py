"""What a user of `StatefulJob` writes: the function types and the state handles.

Two ways to write the stateful step, both DataFrame in, DataFrame out:

* per key (`KeyFunction`): ``fn(key, rows, state) -> rows out``. ``state`` is a
  `KeyedState` bound to ``key``: ``state.value(name)``, ``state.list(name)``,
  ``state.map(name)`` give ValueState / ListState / MapState. This is the common case of
  Spark's ``transformWithStateInPandas`` without the processor class.
* per batch of keys (`BatchFunction`, "vectorized"): ``fn(groups, states) -> rows out``,
  called once per task with every key of the task's batch; ``states.for_key(k)`` gives the
  same `KeyedState`. Use it to amortise per-call overhead (e.g. one pandas/arrow
  computation over all keys).

Rows in are, by ``input_format``: ``"rows"`` (a list of dicts, the default and the fastest
for small groups), ``"pandas"`` (a pandas.DataFrame) or ``"arrow"`` (a pyarrow.Table). Rows
out may be any iterable of dicts or tuples (in output-schema order), a pandas.DataFrame, a
pyarrow.Table, or None.

State values are JSON data (never pickled): None, bool, int, float, str, lists and dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from statehold.backend.state import KeyedState, ListState, MapState, ValueState
from statehold.errors import InvalidArgumentError, StateholdError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

InputFormat = Literal["rows", "pandas", "arrow"]

#: Rows a user function returns: dicts, tuples, a pandas.DataFrame, a pyarrow.Table, None.
RowsOut = Iterable[Mapping[str, Any] | tuple[Any, ...]] | Any | None

#: Per key: (key, rows of this key in this batch, state bound to the key) -> rows out.
#: ``key`` is the key column's value, or a tuple of values for several key columns.
KeyFunction = Callable[[Any, Any, KeyedState], RowsOut]


class TaskStates(Protocol):
    """The state of one task's key-group range, for a `BatchFunction`."""

    def for_key(self, key: Any) -> KeyedState:
        """The state bound to one key of this batch (the same key value the rows carry)."""
        ...


#: Per task: (list of (key, rows) in key-group order, task states) -> rows out.
BatchFunction = Callable[[list[tuple[Any, Any]], TaskStates], RowsOut]

#: Writes one batch's output; must replace that batch's earlier output (idempotent).
Sink = Callable[[Any, int], None]

#: Observes a batch's progress: ``hook(phase, batch_id)``. `StatefulJob` calls it on the
#: driver at ``after-tasks`` (the tasks' state is uploaded and acknowledged),
#: ``after-sink`` (the output is written; only with a sink) and ``after-complete`` (the
#: checkpoint is completed) — the points where a crash leaves a different, recoverable
#: state, so metrics, logs or crash tests can hook in. An exception before
#: ``after-complete`` aborts the checkpoint like any other failure of the batch.
PhaseHook = Callable[[str, int], None]

__all__ = [
    "BatchFunction",
    "InputFormat",
    "KeyFunction",
    "KeyedState",
    "ListState",
    "MapState",
    "PhaseHook",
    "RowsOut",
    "Sink",
    "TaskStates",
    "ValueState",
]


def replace_output(path: str, fmt: str = "json") -> Sink:
    """A sink writing batch N to ``<path>/batch-<N>`` in mode overwrite: a replayed batch
    replaces its own output (idempotent)."""

    def write(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").format(fmt).save(f"{path.rstrip('/')}/batch-{batch_id:08d}")

    return write


class OptionsError(StateholdError, TypeError):
    """Options given that the function called does not take."""


def millis(delay: int | timedelta) -> int:
    """A delay (milliseconds, or a `timedelta`) in milliseconds; never negative."""
    ms = int(delay.total_seconds() * 1000) if isinstance(delay, timedelta) else int(delay)
    if ms < 0:
        raise InvalidArgumentError(f"watermark delay must not be negative: {delay!r}")
    return ms
