"""The background cleaners' retry engine: when a failed delete is tried again."""

from __future__ import annotations

import random
from dataclasses import dataclass

from statehold.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class Backoff:
    """When a failed delete is tried again: `initial` * `multiplier` ** (attempt - 1),
    capped at `cap`, spread by +-`jitter` (a fraction) so that retries of many files do
    not arrive together. The background cleaners share it."""

    initial: float = 0.1
    cap: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial < 0 or self.cap < self.initial or self.multiplier < 1:
            raise InvalidArgumentError(
                "need 0 <= initial_delay <= max_delay and multiplier >= 1"
            )
        if not 0 <= self.jitter <= 1:
            raise InvalidArgumentError("jitter must be in [0, 1]")

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """The wait before try `attempts` + 1; `rng` for the jitter (none: no jitter)."""
        delay = min(self.initial * self.multiplier ** min(attempts - 1, 100), self.cap)
        if self.jitter and rng is not None:
            delay *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, min(delay, self.cap))


__all__ = ["Backoff"]
