"""The processor API, named after Spark's ``transformWithStateInPandas`` (Spark 4.x):
`StatefulProcessor`, `TimeMode`, `TimerValues`, `ExpiredTimerInfo`, `TTLConfig`.

Every class answers to snake_case and to Spark's camelCase (``getCurrentWatermarkInMs``,
...), so a processor written for Spark runs here with no more than an import change
(`statehold.processor.compat` says how its methods are called).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from statehold.errors import InvalidArgumentError

if TYPE_CHECKING:
    from statehold.processor.handle import StatefulProcessorHandle


class TimeMode(StrEnum):
    """Which clock timers run on: none (no timers), the batch's processing time, or the
    event-time watermark."""

    NONE = "none"
    PROCESSING_TIME = "processingtime"
    EVENT_TIME = "eventtime"

    @classmethod
    def parse(cls, mode: TimeMode | str | None) -> TimeMode:
        """Spark's spellings ("None", "ProcessingTime", "EventTime") in any case."""
        if mode is None:
            return cls.NONE
        try:
            return cls(str(mode).lower().replace("_", "").replace("-", ""))
        except ValueError:
            raise InvalidArgumentError(
                f"time mode must be None, ProcessingTime or EventTime, not {mode!r}"
            ) from None


@dataclass(frozen=True)
class TimerValues:
    """The batch's processing time and event-time watermark, in epoch milliseconds (-1
    where the time mode has none; the watermark is 0 before the first one)."""

    current_processing_time_ms: int = -1
    current_watermark_ms: int = -1

    def get_current_processing_time_in_ms(self) -> int:
        return self.current_processing_time_ms

    def get_current_watermark_in_ms(self) -> int:
        return self.current_watermark_ms

    getCurrentProcessingTimeInMs = get_current_processing_time_in_ms
    getCurrentWatermarkInMs = get_current_watermark_in_ms


@dataclass(frozen=True)
class ExpiredTimerInfo:
    """The timer that fired."""

    expiry_time_ms: int

    def get_expiry_time_in_ms(self) -> int:
        return self.expiry_time_ms

    getExpiryTimeInMs = get_expiry_time_in_ms


@dataclass(frozen=True)
class TTLConfig:
    """A state variable's time to live: its values expire this long after their last
    write (on the batch's processing time). Any TTL argument also takes milliseconds or
    a `timedelta`."""

    ttl_duration_ms: int

    @classmethod
    def of(cls, ttl: TTLConfig | timedelta | int | None) -> int | None:
        """Milliseconds (None: no TTL)."""
        if ttl is None:
            return None
        if isinstance(ttl, TTLConfig):
            ms = ttl.ttl_duration_ms
        elif isinstance(ttl, timedelta):
            ms = int(ttl.total_seconds() * 1000)
        else:
            ms = int(ttl)
        if ms <= 0:
            raise InvalidArgumentError(f"a TTL must be positive, not {ttl!r}")
        return ms


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
    (see compat.py).
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (``handle.get_value_state(...)``, ...)."""

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        """This batch's rows of `key` (format: the job's ``input_format``)."""
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
