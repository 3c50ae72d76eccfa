"""The processor API, named after Spark's ``transformWithStateInPandas`` (Spark 4.x):
`StatefulProcessor`, `TimeMode`, `TimerValues`, `ExpiredTimerInfo`, `TTLConfig`.

Every class answers to snake_case and to Spark's camelCase (``getCurrentWatermarkInMs``,
...), so a processor written for Spark runs here with no more than an import change
(`statehold.processor.compat` says how its methods are called). The small value types
live in `statehold.processor.timing` (the handle needs them, and `StatefulProcessor` names
the handle) and are re-exported here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from statehold.processor.timing import ExpiredTimerInfo, TimeMode, TimerValues, TTLConfig

if TYPE_CHECKING:
    from statehold.processor.handle import StatefulProcessorHandle


class StatefulProcessor(ABC):
    """Stateful logic per key, called by `StatefulJob.transform_with_state`.

    Per task and batch: `init(handle)` once (declare state variables with the handle),
    then per key, in the job's first batch only, `handle_initial_state(key, rows,
    timer_values)` if the job was given an initial state with rows of that key, and
    `handle_input_rows(key, rows, timer_values)` for each key with rows, then
    `handle_expired_timer(key, timer_values, expired_timer_info)` for each due timer
    (also of keys without rows), then `close()`. The handle's state variables and timers
    act on the key of the current call. Each call returns output rows: an iterable of
    dicts or tuples (output-schema order), a pandas.DataFrame or pyarrow.Table, an
    iterator of those, or None.

    A subclass may instead implement Spark's camelCase methods (``handleInputRows``,
    ``handleExpiredTimer``, ``handleInitialState``); it then gets Spark's argument shapes
    (see compat.py): the rows as an iterator of chunks.

    ``rows`` of `handle_input_rows` is the key's whole batch as one value (a list of
    dicts, a DataFrame, a Table), so a key with millions of rows is held in memory at
    once. Set ``input_chunks = True`` on the class to get an iterator of chunks instead
    (each a list of dicts, a DataFrame or a Table of at most the job's ``task_batch_rows``
    rows): the task then holds one chunk at a time, whatever the key's size.
    """

    #: hand `handle_input_rows` an iterator of row chunks instead of the whole key
    input_chunks: bool = False

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (``handle.get_value_state(...)``, ...)."""

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        """This batch's rows of `key` (format: the job's ``input_format``; an iterator of
        chunks in that format if the class sets ``input_chunks``)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither handle_input_rows nor handleInputRows"
        )

    def handle_expired_timer(
        self, key: Any, timer_values: TimerValues, expired_timer_info: ExpiredTimerInfo
    ) -> Any:
        """A timer of `key` fired (it is already deleted). Default: no output."""
        return None

    def handle_initial_state(  # noqa: B027 (optional, like Spark's)
        self, key: Any, initial_state: Any, timer_values: TimerValues
    ) -> None:
        """The initial state's rows of `key` (format: the job's ``input_format``), once per
        key in the first batch of a job without checkpoints, before that key's
        ``handle_input_rows``. Its return value is ignored (as in Spark). Default: nothing."""

    def close(self) -> None:  # noqa: B027 (optional, like Spark's)
        """After the task's last call of the batch."""


__all__ = ["ExpiredTimerInfo", "StatefulProcessor", "TTLConfig", "TimeMode", "TimerValues"]
