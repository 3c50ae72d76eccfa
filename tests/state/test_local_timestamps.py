"""A naive TIMESTAMP is local time, turned into epoch seconds as PySpark does
(``time.mktime``); statehold calls mktime once per wall-clock minute and caches it
(`statehold.state.types._local_seconds`). Across time zones with daylight saving, half-
and quarter-hour offsets, and through their transitions, every second must come out as
mktime gives it."""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Iterator

import pytest

from statehold.state.types import _local_seconds

#: a zone and the days of 2021 its clocks changed
ZONES = {
    "America/New_York": ["2021-03-14", "2021-11-07"],
    "Australia/Lord_Howe": ["2021-04-04", "2021-10-03"],  # 30-minute daylight saving
    "Pacific/Chatham": ["2021-04-04", "2021-09-26"],  # +12:45 / +13:45
    "Europe/London": ["2021-03-28", "2021-10-31"],
    "Asia/Kolkata": ["2021-06-01"],
}


@pytest.fixture
def zone(request: pytest.FixtureRequest) -> Iterator[str]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize("zone", list(ZONES), indirect=True)
def test_local_seconds_are_mktimes_through_transitions(zone: str) -> None:
    rng = random.Random(zone)
    times = [dt.datetime(1973, 1, 1) + dt.timedelta(seconds=rng.randrange(127 * 365 * 86400))
             for _ in range(3000)]
    for day in ZONES[zone]:
        start = dt.datetime.fromisoformat(day)
        times += [start + dt.timedelta(seconds=s) for s in range(0, 5 * 3600, 7)]
    times.append(dt.datetime(1950, 6, 1, 12, 30, 15))  # before 1973: mktime itself
    wrong = [v for v in times if _local_seconds(v) != int(time.mktime(v.timetuple()))]
    assert not wrong, wrong[:5]
