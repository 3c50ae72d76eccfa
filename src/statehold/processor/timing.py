"""The processor API's small value types: which clock timers run on (`TimeMode`), the
batch's times (`TimerValues`), the timer that fired (`ExpiredTimerInfo`) and a state
variable's time to live (`TTLConfig`). Their own module because both the processor
(`api.py`) and its handle (`handle.py`) use them, and the processor names the handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from statehold.errors import InvalidArgumentError


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
