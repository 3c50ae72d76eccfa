"""Where statehold reads the time: the one seam a test or a simulation replaces.

Code that needs the wall clock, a monotonic clock or a sleep calls `now()`,
`monotonic()` and `sleep()` here instead of the `time` module. By default they are the
system's (`SystemClock`), so production behaviour is exactly `time.time`,
`time.monotonic` and `time.sleep`. `use(clock)` installs another `Clock` for the whole
process (e.g. the deterministic simulation's, ``tests/sim``) and returns the previous one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The system's clocks: `time.time`, `time.monotonic`, `time.sleep`."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM: Clock = SystemClock()
_current: Clock = SYSTEM


def now() -> float:
    """Seconds since the epoch (wall clock)."""
    return _current.time()


def monotonic() -> float:
    return _current.monotonic()


def sleep(seconds: float) -> None:
    _current.sleep(seconds)


def use(clock: Clock) -> Clock:
    """Make `clock` the process's clock; returns the one it replaces."""
    global _current
    previous, _current = _current, clock
    return previous


def current() -> Clock:
    return _current


__all__ = ["Clock", "SYSTEM", "SystemClock", "current", "monotonic", "now", "sleep", "use"]
