"""The simulation's tests silence statehold's log: a run logs each of thousands of crashes
and refusals it causes on purpose."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    logger = logging.getLogger("statehold")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
