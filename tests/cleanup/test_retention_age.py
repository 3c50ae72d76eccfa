"""Retention by age as well as count (``retain_for``): the deletion policy's rule
(`retention_split`), and the coordinator's subsume under a fake clock on real storage."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from statehold import clock
from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.cleanup.policy import MAX_RETAINED, retention_split
from statehold.errors import InvalidArgumentError
from statehold.ha.embedded import EmbeddedHAStore
from statehold.storage import Storage
from tests.support.simulated_tasks import (
    MAX_PARALLELISM,
    RANGES,
    SimulatedTask,
    listing,
    referenced_by_retained,
    run_checkpoint,
)

DAY = 24 * 3600.0


class FakeClock:
    """Wall time moved by the test; sleeps pass at once (the cleaner's retries)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


@pytest.fixture
def fake() -> Iterator[FakeClock]:
    fake = FakeClock()
    previous = clock.use(fake)
    yield fake
    clock.use(previous)


def test_count_only_keeps_the_newest_retain() -> None:
    assert retention_split([1.0, 2.0, 3.0, 4.0], retain=2) == 2
    assert retention_split([1.0], retain=3) == 0


def test_age_keeps_every_young_one_and_retain_is_the_minimum() -> None:
    now = 100 * DAY
    ages = [now - 9 * DAY, now - 8 * DAY, now - 6 * DAY, now - DAY, now]
    assert retention_split(ages, retain=2, retain_for=7 * DAY, now=now) == 2  # 8, 9 days go
    assert retention_split(ages, retain=4, retain_for=7 * DAY, now=now) == 1  # minimum 4
    assert retention_split(ages, retain=1, retain_for=30 * DAY, now=now) == 0
    assert retention_split(ages, retain=1, retain_for=0, now=now) == 4


def test_only_a_prefix_goes_and_the_age_bound_is_capped() -> None:
    now = 100 * DAY
    # an old one after a young one (clock set back): it stays, so retained stays newest
    assert retention_split([now - 9 * DAY, now, now - 9 * DAY, now], 1, 7 * DAY, now) == 1
    many = [now] * (MAX_RETAINED + 5)
    assert retention_split(many, retain=3, retain_for=7 * DAY, now=now) == 5
    with pytest.raises(InvalidArgumentError):
        retention_split([now], retain=0)


def test_the_coordinator_subsumes_by_age(storage: Storage, fake: FakeClock) -> None:
    coord = CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id="aged", max_parallelism=MAX_PARALLELISM,
        retain=2, retain_for=7 * DAY, renew_lease_in_background=False,
    )
    assert coord.lease is not None
    tasks = [SimulatedTask(storage, r, random.Random(3)) for r in RANGES]
    for n in range(1, 11):  # one checkpoint a day
        fake.t += DAY
        coord.lease.renew()
        run_checkpoint(coord, tasks, n)
    # completed on days 1..10; now is day 10: younger than 7 days are days 4..10
    assert [m.checkpoint_id for _, m in coord.retained()] == [4, 5, 6, 7, 8, 9, 10]
    published = [p.checkpoint_id for p in EmbeddedHAStore(storage).read().retained]
    assert published == [4, 5, 6, 7, 8, 9, 10]
    fake.t += 30 * DAY  # all old now: the minimum of 2 stays
    coord.lease.renew()
    run_checkpoint(coord, tasks, 11)
    assert [m.checkpoint_id for _, m in coord.retained()] == [10, 11]
    assert coord.wait_reconciled(60)
    coord.close()
    files = listing(storage)
    kept = {k for k in files if not k.startswith(("_ha/", "_job/"))}
    assert kept == referenced_by_retained(storage, coord)  # subsumed files all gone
